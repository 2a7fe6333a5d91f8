"""Ready-made environments: single-turn, Search-R1 search, tool calling, Python code execution, and a group that
routes each sample to one of several."""

from rlloom.agent.envs.group import EnvGroup
from rlloom.agent.envs.single_turn import SingleTurnEnv, chat_messages

__all__ = ["EnvGroup", "SingleTurnEnv", "chat_messages"]
