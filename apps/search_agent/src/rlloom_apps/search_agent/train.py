"""`search-agent train`: Search-R1 training through rlloom's Trainer, AgentLoop and a retriever. Wiring only.

Rows are `search-agent prepare-data` output (Search-R1's prompt as a chat message, `{"target": [...]}` gold).
Rollouts: `SearchEnv` conversations (`<search>` → top-k passages in `<information>`, `<answer>` ends) through
`rlloom.agent`'s `AgentLoop` on an `HFEngine` built on the actor's own module; reward: Search-R1's exact match
of the last `<answer>` (the env's rubric). Retrieval: an index folder (`rlloom-retrieval build-index`) loaded
in-process, or a running retrieval server (rlloom's or Search-R1's `/retrieve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlloom_apps.search_agent.data import read_records
from rlloom_apps.search_agent.retrieval import open_retriever
from rlloom_apps.search_agent.settings import SearchSettings, load_train_config
from torch import nn

from rlloom.agent import AgentLoopConfig, SearchEnv, SearchEnvConfig, agent_collector, env_reward
from rlloom.core_rl.config import ConfigError
from rlloom.core_rl.tokenizer_loading import load_pretrained_tokenizer
from rlloom.core_rl.trainer import train
from rlloom.rollout.hf_engine import HFEngine, HFEngineConfig

CONFIGS = Path(__file__).parent / "configs"


def run_train(
    config_path: str | Path,
    *,
    train_data: Path,
    val_data: Path | None = None,
    index: Path | None = None,
    retrieval_url: str | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, float]:
    """Train as the config says; returns the last step's metrics (the run folder has them all)."""
    config, search = load_train_config(config_path, overrides)  # a bad config fails before anything loads
    if not Path(config.model.path).is_dir():
        raise ConfigError(
            f"model.path={config.model.path} is not a folder; pass a local model, e.g. model.path=/models/Qwen2.5-3B"
        )
    train_rows = list(read_records(train_data))
    val_rows = list(read_records(val_data)) if val_data is not None else None
    tokenizer = load_pretrained_tokenizer(config.model.tokenizer_path or config.model.path)
    env_config = SearchEnvConfig(top_k=search.top_k)
    engines: list[HFEngine] = []

    def engine_on(module: nn.Module) -> HFEngine:
        engines.append(HFEngine(module, tokenizer, HFEngineConfig(prefix_cache_tokens=search.prefix_cache_tokens)))
        return engines[-1]

    with open_retriever(index, retrieval_url, api=search.retrieval_api, threads=search.search_threads) as retriever:
        try:
            return train(
                config,
                engine_factory=engine_on,
                collect_factory=agent_collector(
                    tokenizer, lambda: SearchEnv(retriever, None, env_config), loop_config(search)
                ),
                reward_fn=env_reward,
                train_data=train_rows,
                val_data=val_rows,
            )
        finally:
            for engine in engines:
                engine.close()


def loop_config(search: SearchSettings) -> AgentLoopConfig:
    """The agent loop's limits; per-turn sampling (and its 500-token cap) comes from the config's `rollout`."""
    return AgentLoopConfig(
        max_turns=search.max_turns,
        max_obs_tokens=search.max_obs_tokens,
        max_total_tokens=search.max_total_tokens,
        max_concurrency=search.max_concurrency,
        progress=True,
    )
