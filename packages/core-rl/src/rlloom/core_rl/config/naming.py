"""The nearest valid name to a mistyped one: the single "did you mean" rule of every name and key error, also
for the names the rows of a data file give (`data_source`)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def closest_name(name: str, valid: Iterable[str]) -> str | None:
    """The valid name nearest to `name` when one is close enough to be a likely typo, else None."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.5)
    return close[0] if close else None


def unknown_row_names(
    rows: Iterable[Mapping[str, Any]],
    field: str,
    known: Callable[[str], bool],
    valid: Iterable[str],
    *,
    where: Callable[[int], str],
) -> list[str]:
    """One line per distinct unknown value of `rows[i][field]` (a row's `data_source`, say), naming the first row
    that has it and the nearest valid name, so a typo in a data file is reported before anything loads."""
    names = sorted(valid)
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        value = row.get(field)
        if isinstance(value, str) and value not in seen and not known(value):
            seen[value] = index
    problems = []
    for value, index in seen.items():
        close = closest_name(value, names)
        hint = f"did you mean {close!r}? " if close else ""
        problems.append(f"{where(index)}: {field} {value!r} is unknown; {hint}Known: {', '.join(names)}")
    return problems
