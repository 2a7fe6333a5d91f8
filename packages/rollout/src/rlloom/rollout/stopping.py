"""Stop-string detection on a growing list of sampled token ids, without ever re-tokenising.

Token ids are the truth the trainer learns from, so a stop string ends generation at the first token whose
decoding completes it: the completion keeps exactly those sampled ids (the last one may carry characters past
the stop text), and only the *text* is cut at the stop string. Text is grown incrementally with the
prefix/read-offset scheme vLLM and TGI use, so each step decodes a few tokens rather than the whole sequence,
and multi-byte characters split over tokens are not checked until complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# How many tokens before the new one to re-decode, so merges and leading spaces at the seam come out right.
_CONTEXT_TOKENS = 6


@dataclass(slots=True)
class StopMatch:
    """Where a stop string was found in the decoded text of a completion."""

    stop: str
    start: int  # character offset of the stop string in the text


def find_stop(text: str, stops: Sequence[str], search_from: int = 0) -> StopMatch | None:
    """The stop string that ends earliest in `text[search_from:]` (ties: the longer one), or None."""
    best: StopMatch | None = None
    best_end = -1
    for stop in stops:
        pos = text.find(stop, search_from)
        if pos < 0:
            continue
        end = pos + len(stop)
        if best is None or end < best_end or (end == best_end and pos < best.start):
            best, best_end = StopMatch(stop, pos), end
    return best


def cut_at_stop(text: str, match: StopMatch, include_stop: bool) -> str:
    """The completion text ending right after (or right before) the matched stop string."""
    return text[: match.start + len(match.stop)] if include_stop else text[: match.start]


@dataclass(slots=True)
class StopStringWatcher:
    """Watches one sample's tokens as they arrive and reports the step at which a stop string appears."""

    tokenizer: Any
    stops: Sequence[str]
    skip_special_tokens: bool = True
    text: str = ""
    _ids: list[int] = field(default_factory=list)
    _prefix_offset: int = 0
    _read_offset: int = 0

    def push(self, token_id: int) -> bool:
        """Add one sampled token; True when the text decoded so far contains a stop string."""
        self._ids.append(token_id)
        prefix = self.tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=self.skip_special_tokens
        )
        full = self.tokenizer.decode(self._ids[self._prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return False  # an incomplete UTF-8 sequence, or nothing visible yet: wait for more tokens
        new_text = full[len(prefix) :]
        search_from = max(0, len(self.text) - max(len(s) for s in self.stops) + 1)
        self.text += new_text
        self._read_offset = len(self._ids)
        self._prefix_offset = max(0, self._read_offset - _CONTEXT_TOKENS)
        return find_stop(self.text, self.stops, search_from) is not None
