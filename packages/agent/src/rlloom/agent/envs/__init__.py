"""Ready-made environments: single-turn, Search-R1 search, tool calling, and Python code execution."""

from rlloom.agent.envs.single_turn import SingleTurnEnv, chat_messages

__all__ = ["SingleTurnEnv", "chat_messages"]
