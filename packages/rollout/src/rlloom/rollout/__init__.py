"""rlloom.rollout: generation engines (transformers, vLLM, any OpenAI-compatible server), their builders, a pool of
replicas and an OpenAI-compatible server; see the package README.

The names apps use are importable from here and load on first use, so `import rlloom.rollout` pulls in neither
transformers nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute
from rlloom.rollout.__about__ import __version__ as __version__

if TYPE_CHECKING:
    from rlloom.rollout.arguments import add_engine_argument as add_engine_argument
    from rlloom.rollout.arguments import add_policy_arguments as add_policy_arguments
    from rlloom.rollout.arguments import engine_override as engine_override
    from rlloom.rollout.hf.engine import HFEngine as HFEngine
    from rlloom.rollout.hf.engine import HFEngineConfig as HFEngineConfig
    from rlloom.rollout.openai.engine import OpenAIEngine as OpenAIEngine
    from rlloom.rollout.openai.engine import OpenAIEngineConfig as OpenAIEngineConfig
    from rlloom.rollout.openai.inflight import InflightOpenAIEngine as InflightOpenAIEngine
    from rlloom.rollout.policy_spec import PolicySpec as PolicySpec
    from rlloom.rollout.policy_spec import build_engine as build_engine
    from rlloom.rollout.policy_spec import close_engine as close_engine
    from rlloom.rollout.policy_spec import eval_sampling as eval_sampling
    from rlloom.rollout.pool import InflightRolloutPool as InflightRolloutPool
    from rlloom.rollout.pool import RolloutPool as RolloutPool
    from rlloom.rollout.training_engine import build_training_engine as build_training_engine
    from rlloom.rollout.training_engine import engine_problem as engine_problem
    from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine as VLLMAsyncEngine
    from rlloom.rollout.vllm.engine import VLLMEngine as VLLMEngine
    from rlloom.rollout.vllm.engine import VLLMEngineConfig as VLLMEngineConfig
    from rlloom.rollout.vllm.server_engine import VLLMServerEngine as VLLMServerEngine

_EXPORTS = {
    "add_engine_argument": "arguments",
    "add_policy_arguments": "arguments",
    "engine_override": "arguments",
    "HFEngine": "hf.engine",
    "HFEngineConfig": "hf.engine",
    "OpenAIEngine": "openai.engine",
    "InflightOpenAIEngine": "openai.inflight",
    "OpenAIEngineConfig": "openai.engine",
    "PolicySpec": "policy_spec",
    "build_engine": "policy_spec",
    "close_engine": "policy_spec",
    "eval_sampling": "policy_spec",
    "RolloutPool": "pool",
    "InflightRolloutPool": "pool",
    "build_training_engine": "training_engine",
    "engine_problem": "training_engine",
    "VLLMAsyncEngine": "vllm.async_engine",
    "VLLMEngine": "vllm.engine",
    "VLLMEngineConfig": "vllm.engine",
    "VLLMServerEngine": "vllm.server_engine",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
