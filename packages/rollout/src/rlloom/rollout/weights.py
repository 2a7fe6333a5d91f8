"""Loading new policy weights into a live model, in place, with errors that name the offending tensor.

In place matters: an engine may share the module with other holders (a server, a colocated actor), and
`copy_` keeps every reference valid. Tensors that already *are* the model's (the engine shares the actor's
module) are skipped, so `update_weights` after each step costs nothing in the embedded setup.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch


@torch.no_grad()
def load_named_tensors(model: torch.nn.Module, named_tensors: Mapping[str, torch.Tensor]) -> int:
    """Copy each tensor into the model's parameter or buffer of that HF name; return how many were copied."""
    targets = dict(model.state_dict(keep_vars=True))
    unknown = [name for name in named_tensors if name not in targets]
    if unknown:
        sample = ", ".join(sorted(targets)[:3])
        raise KeyError(
            f"update_weights: {len(unknown)} name(s) are not in the model, e.g. {unknown[:3]}; "
            f"expected HF parameter names such as {sample}"
        )
    for name, tensor in named_tensors.items():
        target = targets[name]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"update_weights: tensor {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(target.shape)}"
            )
    copied = 0
    for name, tensor in named_tensors.items():
        target = targets[name]
        if target.data_ptr() == tensor.data_ptr() and target.device == tensor.device:
            continue
        target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
        copied += 1
    return copied


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a `.safetensors` file, or of every such file in a folder (sharded HF checkpoints)."""
    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"no .safetensors file at {p}; give a file or a folder holding some")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors
