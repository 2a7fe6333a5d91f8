"""Checking row files before anything loads: each holds rows, and each row's `data_source` names something the
app can score (a registry name, a `module:function` spec...), so a typo in a data file is reported in about a
second, with its file:line and the nearest valid name, instead of after torch and the model have loaded."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from rlloom.core_rl.config.naming import unknown_row_names
from rlloom.core_rl.config.schema import ConfigError
from rlloom.core_rl.data.rows import read_jsonl


def check_row_sources(
    files: Mapping[str, Path | None],
    *,
    known: Callable[[str], bool],
    valid: Iterable[str],
    prepare_command: str,
    unknown_hint: str = "",
) -> None:
    """Every file of `files` (flag -> path; None: not given) holds rows whose `data_source` passes `known`; one
    `ConfigError` listing every problem otherwise (`valid` feeds the did-you-mean, `prepare_command` the fix for
    an empty file, `unknown_hint` what a valid name is)."""
    names = sorted(valid)
    problems: list[str] = []
    for label, path in files.items():
        if path is None:
            continue
        rows = read_jsonl(path)  # JsonlRows: errors about a row name its file:line
        if not rows:
            problems.append(f"{label} {path} holds no rows; give rows from `{prepare_command}`")
            continue
        missing = next((i for i, row in enumerate(rows) if not isinstance(row.get("data_source"), str)), None)
        if missing is not None:
            problems.append(f"{rows.where(missing)}: the row has no data_source, which picks its scorer")
        unknown = unknown_row_names(rows, "data_source", known, names, where=rows.where)
        problems += [f"{problem}{unknown_hint}" for problem in unknown]
    if problems:
        raise ConfigError("\n".join(problems))
