"""What `search-agent train` was asked for, torch-free: the config file, the overrides, the data and retrieval flags
(Search-R1's `data.train_files`, `retriever.url` ... standing in for them), and the summary of keys mapped or set
aside; and `train --dry-run`'s report of the resolved run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from rlloom_apps.search_agent.search_r1_args import looks_like_search_r1, read_search_r1
from rlloom_apps.search_agent.settings import SearchSettings

from rlloom.core_rl.config import ConfigError, RLConfig
from rlloom.core_rl.config.compat import CommandLine, read_verl_infrastructure


@dataclass
class TrainRequest:
    config: str  # a bundled config's name or a YAML path
    overrides: list[str]
    train_data: list[Path]  # one file, or veRL's data.train_files list: one split, rows in file order
    val_data: list[Path]
    index: Path | None
    retrieval_url: str | None
    summary: list[str] = field(default_factory=list)


def train_request(args: argparse.Namespace) -> TrainRequest:
    """The flags and overrides as one request; a Search-R1 or veRL key read as its flag or ours (`ConfigError`
    when it cannot be honoured, or when it contradicts a flag)."""
    typed = list(args.overrides)
    read: CommandLine
    config = args.config
    train_data = None if args.train_data is None else [args.train_data]
    val_data = None if args.val_data is None else [args.val_data]
    url = args.retrieval_url
    if looks_like_search_r1(typed):
        r1 = read_search_r1(typed)
        train_data = _one("--train-data", "data.train_files", train_data, r1.train_data)
        val_data = _one("--val-data", "data.val_files", val_data, r1.val_data)
        url = _one("--retrieval-url", "retriever.url", url, r1.retrieval_url)
        if config is None and r1.estimator == "gae":
            config = "ppo"
            r1.mapped.append(("algorithm.adv_estimator=gae", "--config ppo (Search-R1's PPO setup, with a critic)"))
        read = r1
    else:
        read = read_verl_infrastructure(typed)
    if train_data is None:
        raise ConfigError("train needs --train-data FILE (or Search-R1's data.train_files=FILE)")
    if (args.index is None) == (url is None):
        raise ConfigError(
            "train needs exactly one of --index DIR or --retrieval-url URL (or Search-R1's retriever.url=URL)"
        )
    return TrainRequest(
        config=config or "grpo",
        overrides=read.overrides,
        train_data=train_data,
        val_data=val_data or [],
        index=args.index,
        retrieval_url=url,
        summary=read.summary(),
    )


def _one(flag: str, key: str, given: Any, typed: Any) -> Any:
    if typed is not None and given is not None and typed != given:
        shown = [str(p) for p in typed] if isinstance(typed, list) else typed
        given = given[0] if isinstance(given, list) and len(given) == 1 else given
        raise ConfigError(f"{flag} {given} and {key}={shown} disagree; give one of them")
    return typed if typed is not None else given


def labelled(paths: list[Path], flag: str, key: str) -> list[tuple[Path, str]]:
    """Each file with the name errors give it: the flag for one file, `data.train_files[i]` for a list."""
    return [(path, flag if len(paths) == 1 else f"{key}[{i}]") for i, path in enumerate(paths)]


def check_retrieval_settings(request: TrainRequest) -> str:
    """The retrieval the run would use, checked without contacting it: an index folder with rlloom's manifest, or a
    well-formed http(s) URL (ValueError naming the flag)."""
    if request.index is not None:
        from rlloom.retrieval.manifest import read_manifest
        from rlloom.retrieval.types import IndexLoadError

        try:
            read_manifest(request.index)
        except IndexLoadError as err:
            raise ValueError(f"--index {request.index}: {err}") from None
        return f"index folder {request.index} (manifest read)"
    url = str(request.retrieval_url)
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"--retrieval-url {url}: not an http(s) URL such as http://127.0.0.1:8000")
    return f"server {url} (not contacted by --dry-run; train checks it at start)"


def dry_run_report(rl: RLConfig, search: SearchSettings, request: TrainRequest, retrieval: str) -> str:
    """The whole resolved config as YAML, then the flags, the retrieval and the keys mapped or set aside."""
    resolved = {**rl.model_dump(mode="json"), "search": search.model_dump(mode="json")}
    lines = [
        "# search-agent train --dry-run: the resolved config",
        yaml.safe_dump(resolved, sort_keys=False).rstrip(),
        "# run",
        f"#   config: {request.config}",
        f"#   train data: {', '.join(map(str, request.train_data))}",
        f"#   val data: {', '.join(map(str, request.val_data)) or 'none'}",
        f"#   retrieval: {retrieval}",
        f"#   search turns: {search.max_turns - 1} + the answer turn (search.max_turns={search.max_turns})",
    ]
    if request.summary:
        lines.append("# command-line keys read as rlloom's or set aside (they change nothing here)")
        lines.extend(f"#   {line}" for line in request.summary)
    lines.append("# not checked without loading torch: the model folder and the rollout engine (vLLM)")
    return "\n".join(lines)
