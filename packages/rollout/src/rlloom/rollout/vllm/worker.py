"""Worker-side half of `VLLMEngine`'s weight sync, mixed into every vLLM worker through `worker_extension_cls`.

vLLM imports this class by name inside each worker process (the engine core runs in its own process by
default) and adds its methods to the worker, so `self` is the worker and `self.model_runner.model` its model.

Why bytes: `collective_rpc` arguments cross a process boundary as msgpack, which carries `bytes` but not
tensors, so a bucket travels as one in-memory safetensors blob (no pickle, no disk) and is decoded here. With
vLLM in the trainer's process (`vllm_inprocess.py`) the RPC is a method call and the bucket arrives as the
trainer's (name, tensor) list, handed to `load_weights` without a copy of its own.

Why layerwise reload: after loading, vLLM turns checkpoint tensors into kernel layouts (fused QKV and
gate/up projections; on CPU the linear weights are also repacked and lose their `weight_loader`), so calling
`model.load_weights` on a live model fails or writes into the wrong layout. vLLM's own reload path
(`initialize_layerwise_reload` ... `finalize_layerwise_reload`, the one its checkpoint-format weight-transfer
engines use) puts each layer back into checkpoint form, buffers the layer's incoming tensors until all of them
have arrived, then re-runs the layer's processing and copies the result into the original storage. A session
may therefore span many RPCs (one per bucket); a layer none of whose weights arrive keeps its old values.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import torch

# A layer that received only part of its weights would be processed with uninitialised elements; vocabulary
# layers are the exception (their padded rows are never loaded and never read).
_PADDED_LAYER_TYPES = ("VocabParallelEmbedding", "ParallelLMHead")


def decode_bucket(payload: bytes | str) -> list[tuple[str, torch.Tensor]]:
    """The tensors of one bucket encoded by `vllm_weights.encode_bucket`, in their sent order. A `str` is the
    same bytes in base64: `vllm serve`'s dev-mode /collective_rpc carries only JSON strings (`vllm_server.py`)."""
    import base64

    from safetensors.torch import load

    tensors = load(base64.b64decode(payload, validate=True) if isinstance(payload, str) else payload)
    order = sorted(tensors)  # safetensors sorts by name; the loader does not care about order
    return [(name, tensors[name]) for name in order]


class SyncLogFilter(logging.Filter):
    """Counts and holds back, during one weight sync, the lines vLLM writes per tensor for what a sync always does:
    "Attempted to load weight X with dtype float32 into parameter with dtype bfloat16" (the trainer's fp32 tensors
    into vLLM's dtype: ~150 lines for a small model, each a cast `copy_` makes anyway) and "RotaryEmbedding: Failed
    to load weights" (its cos/sin cache is computed, never in a checkpoint; vLLM puts the old one back). Every other
    record, a different layer failing to load included, passes. `summary` is the one line logged instead."""

    LOGGERS = ("vllm.model_executor.models.utils", "vllm.model_executor.model_loader.reload.layerwise")

    def __init__(self) -> None:
        super().__init__()
        self.casts: Counter[tuple[str, str]] = Counter()
        self.rotary = 0
        self.started = time.perf_counter()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("Attempted to load weight") and len(args) == 3:
            self.casts[(str(args[1]).removeprefix("torch."), str(args[2]).removeprefix("torch."))] += 1
            return False
        if record.msg == "%s: Failed to load weights" and args == ("RotaryEmbedding",):
            self.rotary += 1
            return False
        return True

    def attach(self) -> SyncLogFilter:
        for name in self.LOGGERS:
            logging.getLogger(name).addFilter(self)
        return self

    def detach(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeFilter(self)

    def summary(self, tensors: int) -> str:
        casts = ", ".join(f"{n} cast {a} -> {b}" for (a, b), n in sorted(self.casts.items()))
        kept = f"; {self.rotary} rotary caches kept (computed, not loaded)" if self.rotary else ""
        took = time.perf_counter() - self.started
        return f"rlloom weight sync: {tensors} tensors loaded in {took:.1f} s{f' ({casts})' if casts else ''}{kept}"


SYNC_LOGGER = logging.getLogger("vllm.rlloom")
"""Under vLLM's own logger, so the line shows wherever vLLM's do (in its engine-core process too)."""


class WeightLoaderExtension:
    """Methods `VLLMEngine` calls on every worker with `collective_rpc("rlloom_...")`."""

    model_runner: Any
    vllm_config: Any

    def rlloom_start_weight_update(self) -> bool:
        """Open a reload session (closing a stale one left by a failed sync first); True if one was stale."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        stale = bool(getattr(self, "_rlloom_session_open", False))
        if stale:
            self.rlloom_finish_weight_update(check=False)
        model = self.model_runner.model
        self._rlloom_device = next(model.parameters()).device  # parameters sit on `meta` during the session
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
        self._rlloom_session_open = True
        self._rlloom_loaded: set[str] = set()
        self._rlloom_tensors = 0
        self._rlloom_logs: SyncLogFilter | None = SyncLogFilter().attach()
        return stale

    def rlloom_load_weights(self, payload: bytes | str | list[tuple[str, torch.Tensor]]) -> int:
        """Load one bucket (HF names, checkpoint layout; bytes, base64 from a server, or in-process the tensors
        themselves) into this worker's model; returns the tensors read."""
        from vllm.config import set_current_vllm_config

        if not getattr(self, "_rlloom_session_open", False):
            raise RuntimeError("rlloom_load_weights outside a session: call rlloom_start_weight_update first")
        named = payload if isinstance(payload, list) else decode_bucket(payload)
        model = self.model_runner.model
        device = self._rlloom_device
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            loaded = model.load_weights(weights=((n, t.to(device)) for n, t in named))
        if loaded is not None:
            self._rlloom_loaded.update(loaded)
        self._rlloom_tensors = getattr(self, "_rlloom_tensors", 0) + len(named)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return len(named)

    def rlloom_finish_weight_update(self, check: bool = True) -> list[str]:
        """Process layers still pending and close the session. With `check`, refuse (before processing) when a
        layer got only part of its weights: it would otherwise run on uninitialised elements. Returns the names
        of the model's parameters that were loaded in this session."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

        model = self.model_runner.model
        partial = []
        if check:
            for name, layer in model.named_modules():
                info = get_layerwise_info(layer)
                if not info.can_load() or type(layer).__name__ in _PADDED_LAYER_TYPES:
                    continue
                total = info.load_numel_total or 0
                if 0 < info.load_numel < total:
                    partial.append(f"{name} ({info.load_numel}/{total} elements)")
        logs = getattr(self, "_rlloom_logs", None)
        try:
            with set_current_vllm_config(self.vllm_config):
                finalize_layerwise_reload(model, self.vllm_config.model_config)
        finally:
            if logs is not None:
                logs.detach()
                self._rlloom_logs = None
        if logs is not None and check:
            SYNC_LOGGER.info(logs.summary(getattr(self, "_rlloom_tensors", 0)))
        self._rlloom_session_open = False
        if partial:
            raise ValueError(
                "weight sync sent only part of these layers' weights (fused layers such as qkv_proj need all of "
                f"q/k/v in one sync): {', '.join(partial[:5])}"
            )
        return sorted(getattr(self, "_rlloom_loaded", set()))
