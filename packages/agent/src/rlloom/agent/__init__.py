"""rlloom.agent: multi-turn agent loop, environments, parsers, tools and loss masks."""

from rlloom.agent.__about__ import __version__
from rlloom.agent.environment import Environment, Observation, Prompt, Sample, StepResult
from rlloom.agent.envs.code import CodeEnv, python_tool, python_toolset
from rlloom.agent.envs.group import EnvGroup
from rlloom.agent.envs.search import SearchEnv, SearchEnvConfig, ThreadedRetriever
from rlloom.agent.envs.single_turn import SingleTurnEnv
from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.loop import AgentLoop, AgentLoopConfig, rollout_metrics, to_batch
from rlloom.agent.parsers import XMLParser, extract_answer, first_action, last_tag_content
from rlloom.agent.rewards import AgentRubric, EpisodeSummary
from rlloom.agent.tool_calls import (
    TOOL_CALL_PARSERS,
    HermesToolCallParser,
    Llama3JsonToolCallParser,
    MistralToolCallParser,
    Qwen3CoderToolCallParser,
    ToolCall,
    ToolCallParser,
    make_tool_call_parser,
)
from rlloom.agent.tools import Tool, ToolError, ToolResult, Toolset
from rlloom.agent.training import agent_collector, env_reward

__all__ = [
    "TOOL_CALL_PARSERS",
    "AgentLoop",
    "AgentLoopConfig",
    "AgentRubric",
    "CodeEnv",
    "EnvGroup",
    "Environment",
    "EpisodeSummary",
    "HermesToolCallParser",
    "Llama3JsonToolCallParser",
    "MistralToolCallParser",
    "Observation",
    "Prompt",
    "Qwen3CoderToolCallParser",
    "Sample",
    "SearchEnv",
    "SearchEnvConfig",
    "SingleTurnEnv",
    "StepResult",
    "ThreadedRetriever",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolEnv",
    "ToolError",
    "ToolResult",
    "Toolset",
    "XMLParser",
    "__version__",
    "agent_collector",
    "env_reward",
    "extract_answer",
    "first_action",
    "last_tag_content",
    "make_tool_call_parser",
    "python_tool",
    "python_toolset",
    "rollout_metrics",
    "to_batch",
]
