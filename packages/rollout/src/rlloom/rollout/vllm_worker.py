"""Mixed into each vLLM GPU worker (through `worker_extension_cls`) so the engine can push weights over RPC.

vLLM imports this class by name inside every worker process and adds its methods to the worker, so `self`
here is the worker and `self.model_runner.model` its model. `load_weights` is vLLM's own loader: it maps HF
parameter names onto its fused and tensor-parallel-sharded layout. Unverified on this project's machines
(see `vllm_engine.py`).
"""

from __future__ import annotations

from typing import Any

import torch


class WeightLoaderExtension:
    """Worker-side half of `VLLMEngine.update_weights`."""

    model_runner: Any

    def rlloom_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Load one bucket of HF-named tensors (any device) into this worker's model shard."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device, non_blocking=True)) for name, t in named_tensors))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return len(named_tensors)
