"""`search-agent train`: Search-R1 training through rlloom's Trainer, AgentLoop and a retriever. Wiring only.

Rows are `search-agent prepare-data` output (Search-R1's prompt as a chat message, `{"target": [...]}` gold).
Rollouts: `SearchEnv` conversations (`<search>` → top-k passages in `<information>`, `<answer>` ends) through
`rlloom.agent`'s `AgentLoop` on the engine `rollout.engine` names (`--engine`): an `HFEngine` on the actor's own
module, or vLLM's async engine next to the actor, where each conversation rejoins the running batch as its search
returns (`rlloom.rollout.training_engine`); reward: Search-R1's exact match
of the last `<answer>` (the env's rubric), or Search-R1 v0.3's format reward (`search.format_reward:`).
Retrieval: an index folder (`rlloom-retrieval build-index`) loaded in-process, or a running retrieval server
(rlloom's or Search-R1's `/retrieve`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlloom_apps.search_agent.data import read_records
from rlloom_apps.search_agent.format_reward import FormatRewardSearchEnv
from rlloom_apps.search_agent.retrieval import open_retriever
from rlloom_apps.search_agent.settings import SearchSettings, load_train_config
from transformers import AutoConfig

from rlloom.agent import AgentLoopConfig, Sample, SearchEnv, SearchEnvConfig, agent_collector, env_reward
from rlloom.agent.envs.search import search_prompt
from rlloom.agent.turns import TurnTemplate
from rlloom.core_rl import train
from rlloom.core_rl.config import ConfigError
from rlloom.core_rl.data import rows_that_fit
from rlloom.core_rl.workers import load_pretrained_tokenizer
from rlloom.rollout import HFEngineConfig, build_training_engine

logger = logging.getLogger(__name__)


def run_train(
    config_path: str | Path,
    *,
    train_data: Path | Sequence[Path],
    val_data: Path | Sequence[Path] | None = None,
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
    train_files = [train_data] if isinstance(train_data, Path) else list(train_data)
    val_files = [val_data] if isinstance(val_data, Path) else list(val_data or [])
    train_rows = [row for path in train_files for row in read_records(path)]  # veRL's lists: files in order
    val_rows = [row for path in val_files for row in read_records(path)] if val_files else None
    tokenizer = load_pretrained_tokenizer(config.model.tokenizer_path or config.model.path)
    env_config = SearchEnvConfig(top_k=search.top_k)
    budget = conversation_budget(config.model.path, search.max_total_tokens)
    drop, template = config.data.filter_overlong_prompts, config.data.apply_chat_template_kwargs
    train_label = f"--train-data {', '.join(map(str, train_files))}"
    val_label = f"--val-data {', '.join(map(str, val_files))}"
    train_rows = fitting_rows(
        train_rows, tokenizer, env_config, budget, train_label, drop=drop, chat_template_kwargs=template
    )
    if val_rows is not None:
        val_rows = fitting_rows(
            val_rows, tokenizer, env_config, budget, val_label, drop=drop, chat_template_kwargs=template
        )
    hf_config = HFEngineConfig(prefix_cache_tokens=search.prefix_cache_tokens)
    with (
        open_retriever(index, retrieval_url, api=search.retrieval_api, threads=search.search_threads) as retriever,
        build_training_engine(config, tokenizer, multi_turn=True, hf_config=hf_config) as engine,
    ):

        def make_env() -> SearchEnv:
            if search.format_reward is not None:
                return FormatRewardSearchEnv(retriever, None, env_config, format_reward=search.format_reward)
            return SearchEnv(retriever, None, env_config)

        return train(
            config,
            collect_factory=agent_collector(tokenizer, make_env, loop_config(search, template)),
            reward_fn=env_reward,
            train_data=train_rows,
            val_data=val_rows,
            **engine.trainer_kwargs(),
        )


def loop_config(search: SearchSettings, chat_template_kwargs: dict[str, Any] | None = None) -> AgentLoopConfig:
    """The agent loop's limits; per-turn sampling (and its 500-token cap) comes from the config's `rollout`.

    The loop's own per-turn cap is set to the whole conversation so `rollout.max_tokens` alone decides it (the
    collector takes the smaller of the two; AgentLoopConfig's default of 500 silently cut a larger
    `rollout.max_tokens`). `chat_template_kwargs` is `data.apply_chat_template_kwargs` (e.g. Qwen3's
    enable_thinking), used for the prompt and every turn's glue."""
    return AgentLoopConfig(
        max_turns=search.max_turns,
        max_tokens_per_turn=search.max_total_tokens,
        max_obs_tokens=search.max_obs_tokens,
        max_total_tokens=search.max_total_tokens,
        max_concurrency=search.max_concurrency,
        chat_template_kwargs=dict(chat_template_kwargs or {}),
        progress=True,
    )


def conversation_budget(model_path: str, max_total_tokens: int) -> int:
    """The tokens a conversation may hold: search.max_total_tokens, capped as the rollout engine caps it (the
    model's max_position_embeddings)."""
    window = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
    return min(max_total_tokens, int(window)) if window else max_total_tokens


def fitting_rows(
    rows: list[dict[str, Any]],
    tokenizer: Any,
    env_config: SearchEnvConfig,
    budget: int,
    label: str,
    *,
    drop: bool,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The rows whose prompt, rendered as the agent loop renders it, leaves room in the conversation's budget
    (core-rl's `rows_that_fit`, the trainer's own prompt-length rule, with the agent's measure).

    A longer prompt made its first rollout raise, stopping the run at whatever step drew it (hours in, on a big
    set); now it is refused before training, or left out with a warning under data.filter_overlong_prompts.
    """
    template = TurnTemplate(tokenizer, chat_template_kwargs=chat_template_kwargs)
    kept = rows_that_fit(
        rows,
        lambda row: len(template.prompt_ids(search_prompt(Sample.from_row(row), env_config))),
        budget - 1,  # the answer needs at least one token
        drop=drop,
        split=label,
        limit_name=f"{budget - 1} tokens (the conversation's {budget}: search.max_total_tokens, capped by the "
        "model's max_position_embeddings, less room for the answer)",
        fix="raise search.max_total_tokens, shorten or drop the row, or leave long rows out with "
        "data.filter_overlong_prompts=true",
    )
    return [dict(row) for row in kept]
