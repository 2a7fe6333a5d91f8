"""Reuse the KV cache of finished rows for later prompts that start with the same tokens (prefix caching).

An agent's next turn re-sends its whole conversation: the previous prompt, the tokens just sampled, and the
tool's observation. Without reuse every turn prefills the whole context again, which on our agent benchmark
was the largest share of decode time. `PrefixCache` keeps the keys/values of finished rows (the tokens that
went through the model: prompt plus all sampled tokens but the last) and hands a later prompt the longest
stored prefix, so only its new tail is prefilled: vLLM's automatic prefix caching, for `HFEngine`.

Entries are found through chained hashes of fixed-size token blocks (a chain hash names a whole prefix), then
checked token by token, so a hash collision can never return someone else's keys. Memory is bounded by a token
budget with least-recently-used eviction. Weights that change make every entry stale: the engine clears the
cache when the model's parameters change (see `HFEngine`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values for one sequence, shaped (kv_heads, tokens, head_dim)."""


@dataclass(slots=True)
class _Entry:
    tokens: list[int]
    layers: list[LayerKV]
    hashes: list[int]  # chain hash after each full block of `tokens`


@dataclass(slots=True)
class PrefixHit:
    """The longest stored prefix of a prompt: its length and every layer's keys/values for it."""

    length: int
    layers: list[LayerKV]


class PrefixCache:
    """Keys/values of finished sequences, looked up by the longest shared token prefix."""

    def __init__(self, capacity_tokens: int, block_size: int = 16, min_hit_tokens: int = 16) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.min_hit_tokens = min_hit_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._by_hash: dict[int, int] = {}  # chain hash of a block-aligned prefix -> newest entry holding it
        self._next_id = 0
        self.stored_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (the weights changed, so their keys/values are stale)."""
        self._entries.clear()
        self._by_hash.clear()
        self.stored_tokens = 0

    def _chain(self, tokens: Sequence[int], limit: int) -> Iterator[int]:
        """Chain hashes of the full blocks among the first `limit` tokens (each names the whole prefix so far)."""
        h = 0
        b = self.block_size
        for start in range(0, limit - b + 1, b):
            h = hash((h, tuple(tokens[start : start + b])))
            yield h

    def insert(self, tokens: list[int], layers: list[LayerKV]) -> None:
        """Store `layers` (each (kv_heads, len(tokens), head_dim)) as the keys/values of `tokens`."""
        if len(tokens) < max(self.block_size, self.min_hit_tokens) or len(tokens) > self.capacity_tokens:
            return  # too short to ever be a hit, or larger than the whole budget
        for keys, values in layers:
            if keys.shape[-2] != len(tokens) or values.shape[-2] != len(tokens):
                raise ValueError(f"keys/values hold {keys.shape[-2]} positions for {len(tokens)} tokens")
        entry_id = self._next_id
        self._next_id += 1
        entry = _Entry(list(tokens), layers, list(self._chain(tokens, len(tokens))))
        self._entries[entry_id] = entry
        for h in entry.hashes:
            self._by_hash[h] = entry_id
        self.stored_tokens += len(tokens)
        while self.stored_tokens > self.capacity_tokens:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        entry_id, entry = self._entries.popitem(last=False)
        self.stored_tokens -= len(entry.tokens)
        for h in entry.hashes:
            if self._by_hash.get(h) == entry_id:
                del self._by_hash[h]

    def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest stored prefix of `prompt`, leaving at least its last token to be run (it gives the logits)."""
        limit = len(prompt) - 1
        found: int | None = None
        blocks = 0
        for h in self._chain(prompt, limit):
            entry_id = self._by_hash.get(h)
            if entry_id is None:
                break
            found, blocks = entry_id, blocks + 1
        if found is None:
            return None
        entry = self._entries[found]
        matched = blocks * self.block_size
        if entry.tokens[:matched] != list(prompt[:matched]):  # a hash collision: never trust the hash alone
            return None
        end = min(len(entry.tokens), limit)
        while matched < end and entry.tokens[matched] == prompt[matched]:
            matched += 1
        if matched < self.min_hit_tokens:
            return None
        self._entries.move_to_end(found)
        return PrefixHit(matched, [(k[:, :matched], v[:, :matched]) for k, v in entry.layers])
