"""Qwen2-VL / Qwen2.5-VL model inputs from chat messages with images, without torchvision or qwen_vl_utils.

HF's `Qwen2VLProcessor` needs torchvision (which fails to import against our CPU torch) and `qwen_vl_utils`
imports torchvision and torchaudio, so we do their job here with the torchvision-free PIL image processor:
load and fit each image (`image.py`), compute `pixel_values` / `image_grid_thw`, expand each `<|image_pad|>`
to the image's token count, and check that tokens and vision features agree *before* anything reaches a model
(the token/feature mismatch is the most reported VLM-RL failure). The 3-D M-RoPE positions are computed
explicitly here and passed to every forward (engine prefill, decode steps and actor), because a Qwen2.5-VL
forward without them silently falls back to 1-D positions in transformers 5.x.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from rlloom.core_rl.contracts.generation import check_chat_template_kwargs
from rlloom.multimodal.image import (
    ImageInput,
    VisionGrid,
    check_aspect_ratio,
    fit_pixel_budget,
    fitted_size,
    load_image,
    vision_grid,
)


class QwenVLProcessing(BaseModel):
    """How images become vision tokens; must match the model's vision config (patch, merge, temporal sizes)."""

    model_config = ConfigDict(extra="forbid")

    min_pixels: int = Field(default=56 * 56, gt=0, description="Images are scaled up to at least this many pixels.")
    max_pixels: int = Field(
        default=28 * 28 * 1280,
        gt=0,
        description="Images are scaled down to at most this many pixels; lower it when prompts run out of room.",
    )
    patch_size: int = Field(default=14, gt=0, description="ViT patch side in pixels (vision_config.patch_size).")
    merge_size: int = Field(default=2, gt=0, description="Patches merged per side into one token (spatial_merge_size).")
    temporal_patch_size: int = Field(default=2, gt=0, description="Frames per patch; a still image is repeated.")
    max_prompt_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Reject prompts longer than this after image expansion (never truncated through vision tokens).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra chat-template variables for every prompt (data.apply_chat_template_kwargs), e.g. "
        "{enable_thinking: false} for a thinking-switch template.",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_chat_template_kwargs(value, "QwenVLProcessing.chat_template_kwargs")
        return value

    def image_processor(self) -> Qwen2VLImageProcessorPil:
        """The PIL (torchvision-free) Qwen2-VL image processor with these sizes; builds offline."""
        return Qwen2VLImageProcessorPil(
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
            patch_size=self.patch_size,
            temporal_patch_size=self.temporal_patch_size,
            merge_size=self.merge_size,
        )

    def vision_grid(self, height: int, width: int) -> VisionGrid:
        """The grid and token count `process_images` / `build_vision_inputs` give an image of this size: the pixel
        budget's resize (`fit_pixel_budget`) and then the processor's `smart_resize`, which can land one patch row
        or column away from `smart_resize` of the original size alone."""
        fit_w, fit_h = fitted_size(width, height, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
        return vision_grid(
            fit_h,
            fit_w,
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            min_pixels=self.min_pixels,
            max_pixels=self.max_pixels,
        )


@dataclass(frozen=True, slots=True)
class VisionTokenIds:
    """The special token ids of a Qwen-VL vocabulary (also in the model config's top level)."""

    image_pad: int
    video_pad: int
    vision_start: int
    vision_end: int

    @classmethod
    def from_config(cls, config: Any) -> VisionTokenIds:
        """Read them from a `Qwen2VLConfig` / `Qwen2_5_VLConfig`."""
        return cls(
            image_pad=int(config.image_token_id),
            video_pad=int(config.video_token_id),
            vision_start=int(config.vision_start_token_id),
            vision_end=int(config.vision_end_token_id),
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> VisionTokenIds:
        """Look them up by their Qwen names; a tokenizer without them raises."""
        names = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
        ids = [tokenizer.convert_tokens_to_ids(n) for n in names]
        missing = [n for n, i in zip(names, ids, strict=True) if i is None or i == tokenizer.unk_token_id]
        if missing:
            raise ValueError(f"tokenizer has no {missing}; use the Qwen-VL model's own tokenizer")
        return cls(*(int(i) for i in ids))


@dataclass(frozen=True, slots=True)
class VisionInputs:
    """One prompt ready for a Qwen-VL forward: expanded ids, image tensors and explicit M-RoPE positions."""

    input_ids: list[int]  # <|image_pad|> expanded to each image's token count
    pixel_values: torch.Tensor  # (total patches, C * temporal_patch * patch * patch)
    image_grid_thw: torch.Tensor  # (images, 3): temporal, patch rows, patch columns
    position_ids: torch.Tensor  # (3, len(input_ids)) temporal/height/width rope positions
    rope_delta: int  # a generated token at index i (0-based, i >= len(input_ids)) sits at i + rope_delta

    def engine_inputs(self) -> dict[str, Any]:
        """What `GenerationRequest.multimodal` carries for `HFEngine`: image tensors plus prompt positions."""
        return {
            "pixel_values": self.pixel_values,
            "image_grid_thw": self.image_grid_thw,
            "position_ids": self.position_ids,
        }

    def positions_with_response(self, response_len: int) -> torch.Tensor:
        """(3, prompt + response) positions for a teacher-forced actor forward over prompt plus response."""
        return continue_positions(self.position_ids, response_len)


def continue_positions(prompt_positions: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Extend (3, L) M-RoPE positions by `new_tokens` text tokens: each is one past the largest so far."""
    start = int(prompt_positions.max()) + 1 if prompt_positions.numel() else 0
    tail = torch.arange(start, start + new_tokens, dtype=prompt_positions.dtype, device=prompt_positions.device)
    return torch.cat([prompt_positions, tail.expand(3, -1)], dim=-1)


def with_text_row(positions: torch.Tensor) -> torch.Tensor:
    """(3, ..., L) -> (4, ..., L): prepend 0..L-1, the layout transformers wants for packed (padding-free) batches."""
    text = torch.arange(positions.shape[-1], dtype=positions.dtype, device=positions.device)
    return torch.cat([text.expand(1, *positions.shape[1:]), positions], dim=0)


def process_images(images: Sequence[ImageInput], processing: QwenVLProcessing) -> tuple[torch.Tensor, torch.Tensor]:
    """Load, fit to the pixel budget and patchify images: `pixel_values` and `image_grid_thw` (images, 3)."""
    if not images:
        raise ValueError("process_images needs at least one image")
    fitted = [
        fit_pixel_budget(load_image(i), min_pixels=processing.min_pixels, max_pixels=processing.max_pixels)
        for i in images
    ]
    for i, image in enumerate(fitted):
        check_aspect_ratio(image.width, image.height, f"image {i}")
    out = processing.image_processor()(images=fitted, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"].long()


def image_token_counts(image_grid_thw: torch.Tensor, merge_size: int) -> list[int]:
    """<|image_pad|> tokens per image: t * h * w patches, merged merge_size x merge_size into one token."""
    return [int(t * h * w) // merge_size**2 for t, h, w in image_grid_thw.tolist()]


def expand_image_pads(prompt_ids: Sequence[int], counts: Sequence[int], image_pad: int) -> list[int]:
    """Replace the i-th single `<|image_pad|>` with counts[i] copies (a raw, vLLM-style prompt -> model ids)."""
    found = sum(1 for t in prompt_ids if t == image_pad)
    if found != len(counts):
        raise ValueError(
            f"prompt has {found} <|image_pad|> tokens but {len(counts)} images were given; expected one "
            "unexpanded <|image_pad|> per image (render image content parts with the model's chat template)"
        )
    out: list[int] = []
    pending = iter(counts)
    for token in prompt_ids:
        out.extend([image_pad] * next(pending) if token == image_pad else [token])
    return out


def check_vision_tokens(
    input_ids: Sequence[int],
    image_grid_thw: torch.Tensor,
    tokens: VisionTokenIds,
    *,
    merge_size: int,
    max_prompt_tokens: int | None = None,
) -> None:
    """Raise unless the expanded ids hold exactly the image tokens the grids need, in whole runs, and fit.

    A prompt cut through its vision tokens, a generated <|image_pad|> or a mismatched image budget all end in
    transformers' "Image features and image tokens do not match" deep inside a forward; here they are named.
    """
    counts = image_token_counts(image_grid_thw, merge_size)
    pads = sum(1 for t in input_ids if t == tokens.image_pad)
    fix = "raise the max prompt length or lower max_pixels (never truncate through vision tokens)"
    if pads != sum(counts):
        raise ValueError(
            f"prompt holds {pads} <|image_pad|> tokens but the images' grids {image_grid_thw.tolist()} need "
            f"{sum(counts)} (sum of t*h*w / merge_size^2 = {counts}); the prompt was truncated or built for "
            f"other image sizes: {fix}"
        )
    if tokens.video_pad in input_ids:
        raise ValueError("prompt holds <|video_pad|> tokens; video inputs are not supported yet")
    runs = _pad_runs(input_ids, tokens.image_pad)
    if not _splits_into(runs, counts):
        raise ValueError(f"<|image_pad|> runs {runs} do not split into the images' token counts {counts} in order")
    if max_prompt_tokens is not None and len(input_ids) > max_prompt_tokens:
        raise ValueError(
            f"prompt has {len(input_ids)} tokens after expanding images to {counts} tokens, over the limit of "
            f"{max_prompt_tokens}: {fix}, or drop the sample"
        )


def mrope_position_ids(
    input_ids: Sequence[int], image_grid_thw: torch.Tensor, image_pad: int, merge_size: int
) -> tuple[torch.Tensor, int]:
    """(3, L) temporal/height/width rope positions and the rope delta of an expanded prompt (images only).

    Text tokens advance all three rows together; an image's tokens share its start position on the temporal
    row and take start + row / start + column on the other two; the text after it resumes at start plus the
    larger grid side. Equal to the model's `get_rope_index` (tested), but a pure function of ids and grids.
    """
    grids = [(t, h // merge_size, w // merge_size) for t, h, w in image_grid_thw.tolist()]
    pieces: list[torch.Tensor] = []
    pos, i, image = 0, 0, 0
    ids = list(input_ids)
    while i < len(ids):
        if ids[i] == image_pad:
            if image >= len(grids):
                raise ValueError(f"more <|image_pad|> tokens than the {len(grids)} images' grids account for")
            t, h, w = grids[image]
            tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
            pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
            pos += max(h, w)
            i += t * h * w
            image += 1
        else:
            end = i
            while end < len(ids) and ids[end] != image_pad:
                end += 1
            pieces.append(torch.arange(pos, pos + end - i).expand(3, -1))
            pos += end - i
            i = end
    positions = torch.cat(pieces, dim=-1) if pieces else torch.zeros(3, 0, dtype=torch.long)
    if positions.shape[-1] != len(ids):
        raise ValueError("the last image's <|image_pad|> run is cut short; see check_vision_tokens")
    delta = int(positions.max()) + 1 - len(ids) if ids else 0
    return positions, delta


def build_vision_inputs(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    processing: QwenVLProcessing | None = None,
    *,
    images: Sequence[ImageInput] = (),
    tokens: VisionTokenIds | None = None,
) -> VisionInputs:
    """Render chat messages (HF content parts, `{"type": "image", "image": <source>}`, or OpenAI's
    `{"type": "image_url", "image_url": {"url": <path, file:// or data: URI>}}`) into `VisionInputs`.

    Images are taken from the image parts in order; a part without an `"image"` key takes the next of
    `images`. The chat template must emit one `<|vision_start|><|image_pad|><|vision_end|>` per image part.
    """
    processing = processing or QwenVLProcessing()
    tokens = tokens or VisionTokenIds.from_tokenizer(tokenizer)
    messages = [_with_image_parts(m) for m in messages]
    sources = _collect_images(messages, images)
    text = tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True, **processing.chat_template_kwargs
    )
    raw_ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    pixel_values, grid = process_images(sources, processing)
    counts = image_token_counts(grid, processing.merge_size)
    input_ids = expand_image_pads(raw_ids, counts, tokens.image_pad)
    check_vision_tokens(
        input_ids, grid, tokens, merge_size=processing.merge_size, max_prompt_tokens=processing.max_prompt_tokens
    )
    positions, delta = mrope_position_ids(input_ids, grid, tokens.image_pad, processing.merge_size)
    return VisionInputs(input_ids, pixel_values, grid, positions, delta)


def _with_image_parts(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """OpenAI's `image_url` parts as HF `image` parts, so the chat template and `_collect_images` see one form."""
    content = message.get("content")
    if isinstance(content, str) or content is None:
        return message
    parts = [_image_part(part) if part.get("type") == "image_url" else part for part in content]
    return {**message, "content": parts}


def _image_part(part: Mapping[str, Any]) -> dict[str, Any]:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    if not isinstance(url, str) or not url:
        raise ValueError('an image_url content part needs {"image_url": {"url": <path or data: URI>}}')
    if url.startswith(("http://", "https://")):
        raise ValueError(f"image_url {url[:80]}: images are not downloaded; give a local path or a data: URI")
    return {"type": "image", "image": url.removeprefix("file://")}


def _collect_images(messages: Sequence[Mapping[str, Any]], extra: Sequence[ImageInput]) -> list[ImageInput]:
    """The image of every image content part, in order; parts without one take the next of `extra`."""
    pending = iter(extra)
    out: list[ImageInput] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) or content is None:
            continue
        for part in content:
            if part.get("type") != "image":
                continue
            if "image" in part:
                out.append(part["image"])
            else:
                source = next(pending, None)
                if source is None:
                    raise ValueError("an image content part has no 'image' and `images` ran out; pass one per part")
                out.append(source)
    if next(pending, None) is not None:
        raise ValueError(f"{len(extra)} `images` given but fewer image content parts need one")
    if not out:
        raise ValueError("messages hold no image content part; send text-only prompts as plain prompt_ids")
    return out


def _pad_runs(input_ids: Sequence[int], image_pad: int) -> list[int]:
    """Lengths of the maximal runs of consecutive `image_pad` tokens."""
    runs: list[int] = []
    previous = False
    for token in input_ids:
        is_pad = token == image_pad
        if is_pad and previous:
            runs[-1] += 1
        elif is_pad:
            runs.append(1)
        previous = is_pad
    return runs


def _splits_into(runs: list[int], counts: list[int]) -> bool:
    """Whether consecutive image token counts add up run by run (adjacent images may share one run)."""
    queue = list(counts)
    for run in runs:
        total = 0
        while queue and total < run:
            total += queue.pop(0)
        if total != run:
            return False
    return not queue
