"""The nearest valid name to a mistyped one: the single "did you mean" rule of every name and key error."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest_name(name: str, valid: Iterable[str]) -> str | None:
    """The valid name nearest to `name` when one is close enough to be a likely typo, else None."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.5)
    return close[0] if close else None
