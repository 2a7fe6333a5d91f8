"""veRL's launch-script keys that change nothing here, read off a command line before the config loads.

A veRL (or Search-R1) script sets micro-batch sizes, node counts and HDFS folders beside the keys that define the
run. Those that only place work or size memory are taken off the command line and reported once in a summary
(never dropped silently); a value that asks for something rlloom does not do is refused with the key to use.
`trainer.n_gpus_per_node` x `trainer.nnodes` is the ranks' count here, `distributed.num_ranks`. Hydra's `+` prefix
(append a key veRL's file lacks) is dropped: every key exists here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from rlloom.core_rl.config.compat.verl_aliases import search_r1_mini_batch, translate
from rlloom.core_rl.config.keys import ConfigError
from rlloom.core_rl.config.migration import renamed_key

_ARF = "actor_rollout_ref"
_MICRO = "memory only: micro-batches here are sized in tokens (max_tokens_per_micro_batch), the gradient is the same"


@dataclass(frozen=True)
class Infrastructure:
    """A key that changes nothing here when `accepts(value)`; otherwise `refusal` says what to do instead."""

    why: str
    accepts: Callable[[Any], bool] = lambda _value: True
    refusal: str = ""


def _is_null(value: Any) -> bool:
    return value is None


INFRASTRUCTURE: dict[str, Infrastructure] = {
    "trainer.default_hdfs_dir": Infrastructure(
        "null: no HDFS copy",
        _is_null,
        "rlloom writes checkpoints to trainer.output_dir only; copy that folder to HDFS yourself",
    ),
    "data.val_batch_size": Infrastructure(
        "validation sends every row at once (search.max_concurrency / the engine bound it); no score changes"
    ),
    **{
        key: Infrastructure(_MICRO)
        for key in (
            f"{_ARF}.actor.ppo_micro_batch_size",
            f"{_ARF}.actor.ppo_micro_batch_size_per_gpu",
            f"{_ARF}.rollout.log_prob_micro_batch_size",
            f"{_ARF}.rollout.log_prob_micro_batch_size_per_gpu",
            f"{_ARF}.ref.log_prob_micro_batch_size",
            f"{_ARF}.ref.log_prob_micro_batch_size_per_gpu",
            "critic.ppo_micro_batch_size",
            "critic.ppo_micro_batch_size_per_gpu",
            "critic.forward_micro_batch_size",
            "critic.forward_micro_batch_size_per_gpu",
        )
    },
    f"{_ARF}.actor.fsdp_config.grad_offload": Infrastructure("memory only: gradients stay on the GPU here"),
    "critic.model.fsdp_config.grad_offload": Infrastructure("memory only: gradients stay on the GPU here"),
    "critic.model.enable_gradient_checkpointing": Infrastructure(
        "memory only: the critic follows model.gradient_checkpointing"
    ),
    # veRL's examples/grpo_trainer/run_qwen2-7b.sh and ppo_trainer/run_qwen2-7b_seq_balance.sh (issue 40 item 1)
    "data.truncation": Infrastructure(
        "error: a prompt over data.max_prompt_length stops the run here too (or is left out with "
        "data.filter_overlong_prompts=true)",
        lambda value: value == "error",
        "rlloom never truncates a prompt: set data.filter_overlong_prompts=true to leave longer rows out, or raise "
        "data.max_prompt_length",
    ),
    "data.return_raw_chat": Infrastructure(
        "prompts are chat messages here and the engine applies the chat template; the tokens are the same"
    ),
    f"{_ARF}.actor.use_dynamic_bsz": Infrastructure(
        "memory only: micro-batches always fill a token budget here (actor.max_tokens_per_micro_batch)"
    ),
    f"{_ARF}.rollout.log_prob_max_token_len_per_gpu": Infrastructure(_MICRO),
    f"{_ARF}.ref.log_prob_max_token_len_per_gpu": Infrastructure(_MICRO),
    f"{_ARF}.rollout.mode": Infrastructure(
        "sync or async: the engine batches the requests itself here; the samples' distribution is the same",
        lambda value: value in ("sync", "async"),
        "veRL's rollout modes are sync and async; rollout.engine picks the engine here",
    ),
    f"{_ARF}.rollout.multi_turn.format": Infrastructure(
        "veRL's tool-call parser for its multi-turn rollout; reasoning train rolls out one turn without tools "
        "and search-agent parses Search-R1's tags"
    ),
}
"""veRL key → why it changes nothing here (for the values `accepts`)."""

_GPUS = "trainer.n_gpus_per_node"
_NODES = "trainer.nnodes"


@dataclass
class CommandLine:
    """A command line read: the overrides left for the config loader, and what was mapped or set aside."""

    overrides: list[str] = field(default_factory=list)
    mapped: list[tuple[str, str]] = field(default_factory=list)  # as typed -> what it became here
    ignored: list[tuple[str, str]] = field(default_factory=list)  # as typed -> why it changes nothing

    def summary(self) -> list[str]:
        """One line per key mapped or ignored, each once."""
        lines = [f"mapped:  {typed} -> {ours}" for typed, ours in dict.fromkeys(self.mapped)]
        return lines + [f"ignored: {typed} ({why})" for typed, why in dict.fromkeys(self.ignored)]


def split_key_value(item: str) -> tuple[str, Any]:
    """`key=value` with the value parsed as YAML (as the loader parses it); a bad value is left to the loader."""
    key, _, raw = item.partition("=")
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError:
        return key.strip(), raw


def read_verl_infrastructure(items: Sequence[str], read: CommandLine | None = None) -> CommandLine:
    """Take veRL's infrastructure keys off `items` (into `read`, a fresh one by default); raises `ConfigError`
    for a value that would need something rlloom does not do, naming the key to use."""
    read = read if read is not None else CommandLine()
    gpus: tuple[str, Any] | None = None
    nodes: tuple[str, Any] | None = None
    for typed in items:
        item = typed
        if item.startswith("+") and not item.startswith("++") and "=" in item:
            item = item[1:]  # Hydra's append: every key exists here
            read.mapped.append((typed, item))
        key, value = split_key_value(item)
        if key == _GPUS:
            gpus = (typed, value)
            continue
        if key == _NODES:
            nodes = (typed, value)
            continue
        infra = INFRASTRUCTURE.get(key)
        if infra is None:
            read.overrides.append(item)
        elif infra.accepts(value):
            read.ignored.append((typed, infra.why))
        else:
            raise ConfigError(f"command-line override {typed!r} (veRL's name): {infra.refusal}")
    _read_placement(read, gpus, nodes)
    _critic_follows_actor(read)
    read.mapped.extend(_aliases(read.overrides))
    return read


_CRITIC_MINI = ("critic.ppo_mini_batch_size", "critic.mini_batch_size")


def _critic_follows_actor(read: CommandLine) -> None:
    """veRL's critic takes the actor's `ppo_mini_batch_size` unless it is given one; with a critic (gae) and only
    the actor's typed, the critic here gets the same, as the number of critic steps per batch is part of the math."""
    pairs = dict(split_key_value(item) for item in read.overrides)
    estimator = pairs.get("algorithm.adv_estimator", pairs.get("algorithm.advantage.estimator"))
    actor = pairs.get(f"{_ARF}.actor.ppo_mini_batch_size")
    if estimator != "gae" or actor is None or any(key in pairs for key in _CRITIC_MINI):
        return
    read.overrides.append(f"critic.ppo_mini_batch_size={actor}")


def _aliases(overrides: Sequence[str]) -> list[tuple[str, str]]:
    """`(typed, ours=value)` for each override the loader will read under another name (veRL's, or a key of
    earlier configs), with the value it will get (Search-R1's mini-batch in trajectories becomes prompts)."""
    pairs = [split_key_value(item) for item in overrides]
    out: list[tuple[str, str]] = []
    for item, (key, value) in zip(overrides, search_r1_mini_batch(pairs), strict=True):
        try:
            translated = translate([(key, value)])
        except ConfigError:
            continue  # the loader reports it
        ours = [f"{renamed_key(t.key, t.value)}={_show(t.value)}" for t in translated]
        if ours and ours != [f"{key}={_show(value)}"]:
            out.append((item, ", ".join(ours)))
    return out


def _show(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").removesuffix("...").strip()


def _read_placement(read: CommandLine, gpus: tuple[str, Any] | None, nodes: tuple[str, Any] | None) -> None:
    """GPUs per node x nodes is `distributed.num_ranks` (Ray places the ranks on the cluster's GPUs)."""
    for pair in (gpus, nodes):
        if pair is not None and (not isinstance(pair[1], int) or isinstance(pair[1], bool) or pair[1] < 1):
            raise ConfigError(f"command-line override {pair[0]!r}: expected a whole number >= 1")
    if gpus is None:
        if nodes is not None and nodes[1] != 1:
            raise ConfigError(
                f"command-line override {nodes[0]!r}: set distributed.num_ranks to every GPU of the run "
                "(nodes x GPUs per node); Ray places the ranks on the cluster"
            )
        if nodes is not None:
            read.ignored.append((nodes[0], "one node; the ranks are distributed.num_ranks"))
        return
    ranks = gpus[1] * (nodes[1] if nodes is not None else 1)
    read.overrides.append(f"distributed.num_ranks={ranks}")
    typed = gpus[0] if nodes is None else f"{gpus[0]} x {nodes[0]}"
    read.mapped.append((typed, f"distributed.num_ranks={ranks}"))
