"""Turn a ranked run's sharded checkpoint into a Hugging Face model folder (`rlloom-core-rl export-hf`).

Ranks write DCP shards (`sharded_checkpoint`); this reads the policy's weights from them in one process (the
optimizer state is never read), builds the model from the saved `config.json` on the meta device, and writes
`save_pretrained` safetensors (a tied LM head is stored once, as transformers does) with the run's tokenizer.
A LoRA policy is exported merged (W + scaling * B @ A), as the rollout engine receives it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from rlloom.core_rl.distributed.fsdp import merge_lora_state
from rlloom.core_rl.run.sharded_checkpoint import ADAPTER_CONFIG, is_sharded, shards_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sharded_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every model tensor of a DCP folder at full size, on CPU (read without a process group)."""
    metadata = FileSystemReader(folder).read_metadata()
    state = {
        key.removeprefix("model."): torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    dcp_load({"model": state}, storage_reader=FileSystemReader(folder), no_dist=True)
    return state


def lora_merged(state: dict[str, torch.Tensor], adapter_config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Plain HF weights from a PeftModel's state: each LoRA layer's scaling from the adapter config, as peft
    computes it (lora_alpha / r, or / sqrt(r) with rslora)."""
    rank, alpha = int(adapter_config["r"]), float(adapter_config["lora_alpha"])
    scaling = alpha / rank**0.5 if adapter_config.get("use_rslora") else alpha / rank
    modules = {name.partition(".lora_A.")[0] for name in state if ".lora_A." in name}
    return merge_lora_state(state, dict.fromkeys(modules, scaling))


def export_hf(checkpoint: str | Path, out: str | Path, *, dtype: str | None = None) -> Path:
    """Write `checkpoint`'s policy (a `step_N/` of a ranked run) as a Hugging Face folder at `out`."""
    step, target = Path(checkpoint), Path(out)
    if not is_sharded(step):
        if (step / "config.json").is_file():
            raise ValueError(
                f"{step} already holds Hugging Face weights (a checkpoint written by one process): load it with "
                "from_pretrained as it is"
            )
        raise FileNotFoundError(f"{step} is not a sharded checkpoint (no sharded/actor/.metadata); give a step_N/")
    folder = shards_path(step, "actor")
    state = sharded_weights(folder)
    if (folder / ADAPTER_CONFIG).is_file():
        state = lora_merged(state, json.loads((folder / ADAPTER_CONFIG).read_text()))
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"--dtype {dtype!r}: choose one of {sorted(DTYPES)}")
        state = {name: value.to(DTYPES[dtype]) if value.is_floating_point() else value for name, value in state.items()}
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    _, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()  # a tied head was saved once: it becomes the loaded embedding again
    untied = [name for name, value in model.state_dict().items() if value.is_meta]
    if unexpected or untied:
        raise ValueError(
            f"{folder}: the shards do not fit the model its config.json describes (missing {untied[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}); was config.json replaced?"
        )
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(step).save_pretrained(target)
    return target


__all__ = ["export_hf", "lora_merged", "sharded_weights"]
