"""Stop-string detection on a growing list of sampled token ids, without ever re-tokenising.

Token ids are the truth the trainer learns from, so a stop string ends generation at the first token whose
decoding completes it: the completion keeps exactly those sampled ids (the last one may carry characters past
the stop text), and only the *text* is cut at the stop string. Text is grown incrementally with the
prefix/read-offset scheme vLLM and TGI use, so each step decodes a few tokens rather than the whole sequence,
and multi-byte characters split over tokens are not checked until complete. Most tokens cannot complete a stop
string at all (their own text lacks its last character), so the watcher decodes only at tokens that might.
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


class TokenPieces:
    """Each token's own text, decoded once and remembered (one per tokenizer, shared by every watcher).

    A stop string is completed by the token that adds its last character, and that character is in the
    token's own text, or the token's own text is an incomplete character (U+FFFD) whose byte completes it. So
    a token whose own text has neither cannot complete a stop string and the watcher need not decode there.
    Stops ending in whitespace get no such shortcut: decoders add, strip and merge spaces at token seams.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}

    def may_complete(self, token_id: int, last_chars: str) -> bool:
        """Whether `token_id` could complete a stop string whose last character is one of `last_chars`."""
        text = self._text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._text[token_id] = text
        return "\ufffd" in text or any(c in text for c in last_chars)


@dataclass(slots=True)
class StopStringWatcher:
    """Watches one sample's tokens as they arrive and reports the step at which a stop string appears.

    With `pieces`, tokens that cannot complete a stop string are only recorded; the next token that might
    decodes everything since the last check, so the step reported is the same. (A token after held-back text,
    an incomplete character, is always checked: the held text, and a stop in it, shows up with that token.)
    """

    tokenizer: Any
    stops: Sequence[str]
    skip_special_tokens: bool = True
    pieces: TokenPieces | None = None
    text: str = ""
    _ids: list[int] = field(default_factory=list)
    _prefix_offset: int = 0
    _read_offset: int = 0
    _last_chars: str = ""
    _held: bool = False  # text is held back until the next token: that one must be checked, whatever it is

    def __post_init__(self) -> None:
        last = {stop[-1] for stop in self.stops if stop}
        if self.pieces is not None and (not all(self.stops) or any(c.isspace() for c in last)):
            self.pieces = None  # an empty stop, or one ending in whitespace: check at every token
        self._last_chars = "".join(sorted(last))

    def push(self, token_id: int) -> bool:
        """Add one sampled token; True when the text decoded so far contains a stop string."""
        self._ids.append(token_id)
        if not self._held and self.pieces is not None and not self.pieces.may_complete(token_id, self._last_chars):
            return False
        prefix = self.tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=self.skip_special_tokens
        )
        full = self.tokenizer.decode(self._ids[self._prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        self._held = full.endswith("\ufffd") or len(full) <= len(prefix)
        if self._held:
            return False  # an incomplete UTF-8 sequence, or nothing visible yet: wait for more tokens
        new_text = full[len(prefix) :]
        search_from = max(0, len(self.text) - max(len(s) for s in self.stops) + 1)
        self.text += new_text
        self._read_offset = len(self._ids)
        self._prefix_offset = max(0, self._read_offset - _CONTEXT_TOKENS)
        return find_stop(self.text, self.stops, search_from) is not None
