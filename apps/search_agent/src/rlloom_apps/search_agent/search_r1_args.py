"""Search-R1's launch-script overrides (`python3 -m verl.trainer.main_ppo[_format] ...`) read as `search-agent train`'s
flags and config keys, torch-free.

Search-R1's own keys have meanings of their own: `max_turns` counts search turns (a final answer turn follows, so
it is `search.max_turns` + 1 here), `data.max_prompt_length` caps the whole rolling context when the script also
sets `data.max_start_length` (the first prompt's cap), `retriever.url` is its server's `/retrieve`. veRL's keys
go on to `verl_infra` (infrastructure, set aside with a reason) and then to the config loader's aliases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlloom.core_rl.config import ConfigError
from rlloom.core_rl.config.compat import CommandLine, read_verl_infrastructure, split_key_value

_RETRIEVE = "/retrieve"


@dataclass
class SearchR1CommandLine(CommandLine):
    """What a Search-R1 command line sets beyond config keys: the flags its data and retriever keys stand for."""

    train_data: list[Path] | None = None  # veRL's lists: several files, one split in order
    val_data: list[Path] | None = None
    retrieval_url: str | None = None
    estimator: str | None = None  # algorithm.adv_estimator as typed: gae picks the bundled ppo config


def _search_turns(value: Any) -> list[str]:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("expected the number of search turns, a whole number >= 0")
    return [f"search.max_turns={value + 1}"]  # Search-R1 adds a final answer turn


def _state_masking(value: Any) -> list[str]:
    if value is not True:
        raise ValueError(
            "rlloom always keeps retrieved <information> tokens out of the loss (loss_mask 0); drop the key"
        )
    return []


def _off(what: str) -> Callable[[Any], list[str]]:
    def check(value: Any) -> list[str]:
        if value not in (False, None):
            raise ValueError(f"{what}; drop the key")
        return []

    return check


def _on(what: str) -> Callable[[Any], list[str]]:
    def check(value: Any) -> list[str]:
        if value is not True:
            raise ValueError(f"{what}; drop the key")
        return []

    return check


def _to(key: str) -> Callable[[Any], list[str]]:
    return lambda value: [f"{key}={_yaml(value)}"]


def _yaml(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


_KEYS: dict[str, tuple[Callable[[Any], list[str]], str]] = {
    "max_turns": (_search_turns, "search.max_turns = search turns + 1 (the answer turn)"),
    "retriever.topk": (_to("search.top_k"), "search.top_k"),
    "data.max_obs_length": (_to("search.max_obs_tokens"), "search.max_obs_tokens"),
    "data.shuffle_train_dataloader": (_to("data.shuffle"), "data.shuffle"),  # its veRL fork's name
    "reward_model.structure_format_score": (
        _to("search.format_reward.structure_format_score"),
        "search.format_reward.structure_format_score",
    ),
    "reward_model.final_format_score": (
        _to("search.format_reward.final_format_score"),
        "search.format_reward.final_format_score",
    ),
    "reward_model.retrieval_score": (
        _to("search.format_reward.retrieval_score"),
        "search.format_reward.retrieval_score",
    ),
    "actor_rollout_ref.actor.state_masking": (_state_masking, "always on: <information> tokens carry loss_mask 0"),
    "algorithm.no_think_rl": (_off("no_think_rl=true (answer without thinking) is not offered here"), ""),
    "do_search": (_on("the agent always searches here; `search-agent eval --method direct` answers without"), ""),
    "data.train_data_num": (_off("a row limit: take the rows with `search-agent prepare-data --limit N`"), ""),
    "data.val_data_num": (_off("a row limit: take the rows with `search-agent prepare-data --limit N`"), ""),
}
"""Search-R1 key → (our overrides for its value, raising ValueError with the fix; what it is here, "" when a
value it accepts changes nothing)."""

_IGNORED_WHY = {
    "algorithm.no_think_rl": "false: Search-R1's default, thinking allowed",
    "do_search": "true: the agent searches",
    "data.train_data_num": "null: every row",
    "data.val_data_num": "null: every row",
}


def looks_like_search_r1(items: Sequence[str]) -> bool:
    """Whether a command line uses Search-R1's own keys (then `read_search_r1` reads it)."""
    own = {"max_turns", "retriever.url", "retriever.topk", "data.max_obs_length", "data.max_start_length"}
    own |= {"data.train_files", "data.val_files"}  # veRL's too, but here they can only be the data flags
    return any(item.lstrip("+").partition("=")[0].strip() in own for item in items)


def read_search_r1(items: Sequence[str]) -> SearchR1CommandLine:
    """Search-R1's keys as flags and `search.*` overrides, then veRL's infrastructure keys set aside; everything
    else is left for the config loader (veRL aliases, or an unknown-key error with its hint)."""
    read = SearchR1CommandLine()
    start_length = any(item.lstrip("+").startswith("data.max_start_length=") for item in items)
    rest: list[str] = []
    for typed in items:
        key, value = split_key_value(typed.lstrip("+"))
        where = f"command-line override {typed!r} (Search-R1's name)"
        if key in ("data.train_files", "data.val_files"):
            _data_file(read, typed, key, value, where)
        elif key == "retriever.url":
            _retriever_url(read, typed, value, where)
        elif key == "data.max_prompt_length" and start_length:
            read.overrides.append(f"search.max_total_tokens={value}")
            read.mapped.append((typed, f"search.max_total_tokens={value} (the rolling context's cap)"))
        elif key == "data.max_start_length":
            read.overrides.append(f"data.max_prompt_length={value}")
            read.mapped.append(
                (typed, f"data.max_prompt_length={value} (a longer prompt stops the run, naming its row, not cut)")
            )
        elif key in _KEYS:
            convert, meaning = _KEYS[key]
            try:
                ours = convert(value)
            except ValueError as err:
                raise ConfigError(f"{where}: {err}") from None
            read.overrides.extend(ours)
            if meaning:
                read.mapped.append((typed, ", ".join(ours) if ours else meaning))
            else:
                read.ignored.append((typed, _IGNORED_WHY[key]))
        else:
            if key == "algorithm.adv_estimator":
                read.estimator = str(value)
            rest.append(typed)
    read_verl_infrastructure(rest, read)
    return read


def _data_file(read: SearchR1CommandLine, typed: str, key: str, value: Any, where: str) -> None:
    """One file, or veRL's list of files (read as one split, in order)."""
    if isinstance(value, str) and value.strip():
        paths = [Path(value)]
    elif isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        paths = [Path(v) for v in value]
    else:
        raise ConfigError(
            f"{where}: expected a file path or a list of them, e.g. {key}=train.parquet or "
            f"{key}=\"['nq/train.parquet', 'hotpotqa/train.parquet']\", got {value!r}"
        )
    flag = "--train-data" if key == "data.train_files" else "--val-data"
    if key == "data.train_files":
        read.train_data = paths
    else:
        read.val_data = paths
    read.mapped.append((typed, f"{flag} {', '.join(map(str, paths))}"))


def _retriever_url(read: SearchR1CommandLine, typed: str, value: Any, where: str) -> None:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: expected an http(s) URL of Search-R1's /retrieve endpoint, got {value!r}")
    base = value.rstrip("/")
    base = base[: -len(_RETRIEVE)] if base.endswith(_RETRIEVE) else base
    read.retrieval_url = base
    read.overrides.append("search.retrieval_api=search-r1")
    read.mapped.append((typed, f"--retrieval-url {base} with search.retrieval_api=search-r1"))
