"""Reshape a transformers `DynamicCache` so two decode batches can become one (continuous batching).

A request that arrives while a batch decodes is prefilled on its own cache. It either takes the places of
finished rows in place (`write_rows`) or the two caches are merged into one (`merge_caches`); in both the
narrower side is padded on the *left* with zero keys/values (its attention mask is 0 there, so they never
receive weight). Columns that
are padding for every remaining row are trimmed off the left so the cache does not grow without bound as rows
come and go. Only plain full-attention `DynamicLayer`s can be reshaped this way: sliding-window layers keep a
rolling window whose start differs per call, so callers must check `mergeable` first.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward argument that takes the KV cache: `cache` from transformers 5.2x on, `past_key_values` before.

    Newer releases still accept the old name but warn that it goes away, so each model gets the name it declares.
    """
    model_type = type(model)
    if model_type not in _CACHE_KEYWORDS:
        try:
            names = set(inspect.signature(model_type.forward).parameters)
        except (TypeError, ValueError):
            names = set()
        _CACHE_KEYWORDS[model_type] = "cache" if "cache" in names else "past_key_values"
    return _CACHE_KEYWORDS[model_type]


_CACHE_KEYWORDS: dict[type, str] = {}


def mergeable(cache: DynamicCache) -> bool:
    """True when every layer is a full-attention `DynamicLayer` holding tensors (safe to pad, join, trim)."""
    return bool(cache.layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)


def dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers as `DynamicLayer`s (callers checked `mergeable`)."""
    layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
    if len(layers) != len(cache.layers):
        raise TypeError("only caches of plain DynamicLayers can be reshaped; check mergeable(cache) first")
    return layers


def merge_caches(into: DynamicCache, keep: torch.Tensor | None, first: int, other: DynamicCache) -> None:
    """`into`'s rows at `keep` (all when None) from column `first` on, then `other`'s rows, right-aligned.

    One new tensor per layer: the narrower side is padded on the left with zeros, so finished rows are dropped,
    leading padding is cut and the newcomers are appended in a single write.
    """
    if len(into.layers) != len(other.layers):
        raise ValueError(f"cannot join caches with {len(into.layers)} and {len(other.layers)} layers")
    for mine, theirs in zip(dynamic_layers(into), dynamic_layers(other), strict=True):
        for name in ("keys", "values"):
            old, new = getattr(mine, name), getattr(theirs, name)
            source = (old if keep is None else old.index_select(0, keep))[:, :, first:]
            width = max(source.shape[2], new.shape[2])
            kept = source.shape[0]
            merged = old.new_empty((kept + new.shape[0], old.shape[1], width, old.shape[3]))
            merged[:kept, :, : width - source.shape[2]].zero_()
            merged[kept:, :, : width - new.shape[2]].zero_()
            merged[:kept, :, width - source.shape[2] :] = source
            merged[kept:, :, width - new.shape[2] :] = new
            setattr(mine, name, merged)


def write_rows(into: DynamicCache, slots: list[int], other: DynamicCache) -> None:
    """Overwrite `into`'s rows at `slots` with `other`'s rows, right-aligned (in place; `other` is no wider)."""
    for mine, theirs in zip(dynamic_layers(into), dynamic_layers(other), strict=True):
        for name in ("keys", "values"):
            old, new = getattr(mine, name), getattr(theirs, name)
            pad = old.shape[2] - new.shape[2]
            for i, slot in enumerate(slots):
                old[slot, :, :pad].zero_()
                old[slot, :, pad:].copy_(new[i])


def trim_left_cache(cache: DynamicCache, columns: int) -> None:
    """Drop the first `columns` positions of every layer (they must be padding for every row)."""
    if columns <= 0:
        return
    for layer in dynamic_layers(cache):
        assert layer.keys is not None and layer.values is not None
        layer.keys = layer.keys[:, :, columns:, :]
        layer.values = layer.values[:, :, columns:, :]
