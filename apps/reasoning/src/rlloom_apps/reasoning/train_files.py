"""veRL's `data.train_files` / `data.val_files` for `reasoning train`: one file or a list of them (parquet, as
veRL's examples give them, or JSONL), read as one split with the rows of each file in order.

veRL's launch scripts pass the data this way (`data.train_files="['gsm8k/train.parquet', 'math/train.parquet']"`),
so the keys stand in for `--train-data` / `--val-data`. Every file is checked before torch loads: it exists, and
it has the columns a row needs (`prompt` or `prompt_ids`, and `data_source`, which picks the scorer); an error
names the file. Errors about a row later in the run still name its `file:line` (`file:row N` for parquet).
Imports nothing heavy (pyarrow only to read a parquet file's schema).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlloom.core_rl.config import ConfigError
from rlloom.core_rl.config.compat import split_key_value
from rlloom.core_rl.data import read_jsonl

KEYS = {"data.train_files": "--train-data", "data.val_files": "--val-data"}
PROMPT_COLUMNS = ("prompt", "prompt_ids")
SOURCE_COLUMN = "data_source"


@dataclass
class DataFiles:
    """The files of each split as given (by flag or veRL key), what was mapped, and the overrides left over."""

    train: list[Path] = field(default_factory=list)
    val: list[Path] = field(default_factory=list)
    mapped: list[tuple[str, str]] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)

    def labelled(self) -> dict[str, Path]:
        """Each file under the name the user gave it by: `--train-data`, or `data.train_files[i]`."""
        out: dict[str, Path] = {}
        for flag, files, key in (("--train-data", self.train, "data.train_files"), ("--val-data", self.val,
                                 "data.val_files")):  # fmt: skip
            for i, path in enumerate(files):
                out[flag if len(files) == 1 else f"{key}[{i}]"] = path
        return out


def file_list(key: str, value: Any) -> list[Path]:
    """A veRL data-files value as paths: one path, or a list of paths (Hydra's `['a', 'b']`)."""
    if isinstance(value, str) and value.strip():
        return [Path(value)]
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return [Path(v) for v in value]
    raise ConfigError(
        f"{key}={value!r}: expected a file path or a list of them, e.g. {key}=train.parquet or "
        f"{key}=\"['gsm8k/train.parquet', 'math/train.parquet']\""
    )


def read_data_files(overrides: Sequence[str], train_data: Path | None, val_data: Path | None) -> DataFiles:
    """Take `data.train_files` / `data.val_files` off the overrides (a leading `+` too); with the flags, one split
    given both ways must name the same single file."""
    files = DataFiles()
    given: dict[str, list[Path]] = {}
    for typed in overrides:
        key, value = split_key_value(typed.lstrip("+"))
        if key not in KEYS:
            files.rest.append(typed)
            continue
        paths = file_list(key, value)
        given[key] = paths
        files.mapped.append((typed, f"{KEYS[key]} {', '.join(map(str, paths))}"))
    for key, flag, flag_value in (("data.train_files", "--train-data", train_data), ("data.val_files", "--val-data",
                                  val_data)):  # fmt: skip
        typed_paths = given.get(key)
        if typed_paths is not None and flag_value is not None and typed_paths != [flag_value]:
            raise ConfigError(f"{flag} {flag_value} and {key}={[str(p) for p in typed_paths]} disagree; give one")
        chosen = typed_paths if typed_paths is not None else ([flag_value] if flag_value is not None else [])
        if key == "data.train_files":
            files.train = chosen
        else:
            files.val = chosen
    if not files.train:
        raise ConfigError("train needs --train-data FILE (or veRL's data.train_files=FILE or a list of files)")
    return files


def columns(path: Path) -> set[str]:
    """The columns of a row file: a parquet file's schema, or every key of a JSONL file's rows."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            raise ConfigError(f"{path}: a parquet file needs pyarrow: pip install 'rlloom-core-rl[parquet]'") from None
        try:
            return set(pq.read_schema(path).names)
        except Exception as err:  # pyarrow's errors vary by version (ArrowInvalid, OSError)
            raise ConfigError(f"{path}: a parquet file that pyarrow cannot read ({err})") from None
    names: set[str] = set()
    for row in read_jsonl(path):
        if isinstance(row, dict):
            names.update(row)
    return names


def check_files(labelled: dict[str, Path], prepare_command: str) -> None:
    """Every file exists and has a prompt column and `data_source`; one `ConfigError` naming each bad file."""
    problems = []
    for label, path in labelled.items():
        if not path.is_file():
            problems.append(f"{label} {path} does not exist (make rows with `{prepare_command}`)")
            continue
        have = columns(path)
        missing = [] if have & set(PROMPT_COLUMNS) else ["prompt (or prompt_ids)"]
        missing += [] if SOURCE_COLUMN in have else [SOURCE_COLUMN]
        if missing and have:
            problems.append(
                f"{label} {path} lacks the column(s) {', '.join(missing)} (it has: {', '.join(sorted(have))}); "
                f"rows in the veRL shape come from `{prepare_command}`"
            )
    if problems:
        raise ConfigError("\n".join(problems))


def read_rows(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """One split's rows: a single file as `read_jsonl` reads it, several concatenated in order; either way an error
    about a row later in the run names its own file and line (core-rl's `JsonlRows.where`)."""
    parts = [read_jsonl(path) for path in paths]
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    rows = [row for part in parts for row in part]
    joined = type(first)(first.path, rows, [line for part in parts for line in part.lines], first.unit)
    owners = [(part, i) for part in parts for i in range(len(part))]
    joined.where = lambda index: owners[index][0].where(owners[index][1])  # type: ignore[method-assign]
    return joined


__all__ = ["DataFiles", "check_files", "file_list", "read_data_files", "read_rows"]
