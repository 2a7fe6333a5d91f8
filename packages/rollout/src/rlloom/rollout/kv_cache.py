"""Reshape a transformers `DynamicCache` so two decode batches can become one (continuous batching).

A request that arrives while a batch decodes is prefilled on its own cache; to join the running batch the two
caches must agree on length. The shorter one is padded on the *left* with zero keys/values (its attention mask
is 0 there, so they never receive weight) and the layers are concatenated along the batch axis. Columns that
are padding for every remaining row are trimmed off the left so the cache does not grow without bound as rows
come and go. Only plain full-attention `DynamicLayer`s can be reshaped this way: sliding-window layers keep a
rolling window whose start differs per call, so callers must check `mergeable` first.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def mergeable(cache: DynamicCache) -> bool:
    """True when every layer is a full-attention `DynamicLayer` holding tensors (safe to pad, join, trim)."""
    return bool(cache.layers) and all(type(layer) is DynamicLayer and layer.is_initialized for layer in cache.layers)


def dynamic_layers(cache: DynamicCache) -> list[DynamicLayer]:
    """The cache's layers as `DynamicLayer`s (callers checked `mergeable`)."""
    layers = [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]
    if len(layers) != len(cache.layers):
        raise TypeError("only caches of plain DynamicLayers can be reshaped; check mergeable(cache) first")
    return layers


def left_pad_cache(cache: DynamicCache, columns: int) -> None:
    """Prepend `columns` zero positions to every layer's keys and values (in place)."""
    if columns <= 0:
        return
    for layer in dynamic_layers(cache):
        keys, values = layer.keys, layer.values
        assert keys is not None and values is not None
        pad = keys.new_zeros((keys.shape[0], keys.shape[1], columns, keys.shape[3]))
        layer.keys = torch.cat([pad, keys], dim=-2)
        layer.values = torch.cat([pad.new_zeros((*pad.shape[:3], values.shape[3])), values], dim=-2)


def concat_caches(into: DynamicCache, other: DynamicCache) -> None:
    """Append `other`'s rows after `into`'s along the batch axis; both must already have the same length."""
    if len(into.layers) != len(other.layers):
        raise ValueError(f"cannot join caches with {len(into.layers)} and {len(other.layers)} layers")
    for mine, theirs in zip(dynamic_layers(into), dynamic_layers(other), strict=True):
        assert mine.keys is not None and mine.values is not None
        assert theirs.keys is not None and theirs.values is not None
        if mine.keys.shape[-2] != theirs.keys.shape[-2]:
            raise ValueError(
                f"cannot join caches of lengths {mine.keys.shape[-2]} and {theirs.keys.shape[-2]}; left-pad first"
            )
        mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
        mine.values = torch.cat([mine.values, theirs.values], dim=0)


def trim_left_cache(cache: DynamicCache, columns: int) -> None:
    """Drop the first `columns` positions of every layer (they must be padding for every row)."""
    if columns <= 0:
        return
    for layer in dynamic_layers(cache):
        assert layer.keys is not None and layer.values is not None
        layer.keys = layer.keys[:, :, columns:, :]
        layer.values = layer.values[:, :, columns:, :]
