"""Single-turn rollouts of image prompts for core-rl's trainer: EasyR1-style rows in, trajectories out.

A row holds `images` (paths, bytes, data URIs or PIL images) and chat messages whose text marks each image's
place with a literal `<image>` (EasyR1 / hiyouga/geometry3k). The text is split on the markers into HF content
parts, rendered with the model's chat template and turned into `VisionInputs` once per row and step (the row's
n samples share the tensors); the engine gets the expanded `prompt_ids` plus `engine_inputs()`, and every
trajectory carries the same `engine_inputs()` in `multimodal`, so the actor's forward sees the pixels and M-RoPE
positions the engine decoded with. Rows without images take core-rl's text path unchanged.

A prompt over `processing.max_prompt_tokens` after image expansion raises (never truncated through vision
tokens, never silently dropped mid-step, which would shrink the batch behind the trainer's back): drop such rows
once before training with `drop_overlong_rows`, as EasyR1's `filter_overlong_prompts` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.core_rl.contracts.protocols import RolloutEngine
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import Row, generation_request
from rlloom.core_rl.phases.collection import CollectFn, sample_trajectories
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionInputs, VisionTokenIds, build_vision_inputs

IMAGE_MARKER = "<image>"
logger = logging.getLogger(__name__)


def row_images(row: Row) -> list[Any]:
    """The row's `images` as a list (a single image is accepted); empty for text rows."""
    images = row.get("images")
    if images is None:
        return []
    if isinstance(images, str | bytes) or not isinstance(images, Sequence):
        return [images]
    return list(images)


def split_image_markers(text: str) -> list[dict[str, Any]]:
    """`"<image>Find x."` -> `[{"type": "image"}, {"type": "text", "text": "Find x."}]` (empty texts dropped)."""
    parts: list[dict[str, Any]] = []
    for i, piece in enumerate(text.split(IMAGE_MARKER)):
        if i > 0:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def vision_messages(row: Row) -> list[dict[str, Any]]:
    """The row's chat messages with `<image>` markers split into content parts (list contents kept as given)."""
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, Sequence) or not prompt:
        raise ValueError(f"image row has no usable 'prompt' (chat messages or a string): {dict(row)!r}")
    messages = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            messages.append({**message, "content": split_image_markers(content)})
        else:
            messages.append(dict(message))
    return messages


def row_vision_inputs(
    row: Row, tokenizer: Any, processing: QwenVLProcessing, tokens: VisionTokenIds | None = None
) -> VisionInputs:
    """`VisionInputs` of one image row; one `<image>` marker (or image content part) per entry of `images`."""
    images = row_images(row)
    row_id = (row.get("extra_info") or {}).get("id", "?")
    where = f"image row (extra_info.id={row_id}, {len(images)} images)"
    messages = vision_messages(row)
    slots = sum(1 for m in messages for p in _parts(m) if p.get("type") == "image" and "image" not in p)
    if slots != len(images):  # named here: build_vision_inputs only sees content parts, not the row's markers
        raise ValueError(
            f"{where}: the prompt has {slots} {IMAGE_MARKER} markers (or image parts without an image) but "
            f"'images' lists {len(images)}; put one {IMAGE_MARKER} in the prompt text per image, in order"
        )
    try:
        return build_vision_inputs(messages, tokenizer, processing, images=images, tokens=tokens)
    except (ValueError, OSError) as err:  # OSError: a missing or unreadable image file
        raise ValueError(f"{where}: {err}") from err


def _parts(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []


def drop_overlong_rows(rows: Sequence[Row], tokenizer: Any, processing: QwenVLProcessing) -> list[Row]:
    """The rows whose prompt fits `processing.max_prompt_tokens` after image expansion (EasyR1's
    `filter_overlong_prompts`); logs how many were dropped. Every image is processed once, so this costs one
    pass of the image processor over the data. Other errors (a missing image, marker/image counts) still raise."""
    limit = processing.max_prompt_tokens
    if limit is None:
        return list(rows)
    unlimited = processing.model_copy(update={"max_prompt_tokens": None})
    tokens = VisionTokenIds.from_tokenizer(tokenizer)
    kept = []
    for row in rows:
        if row_images(row):
            length = len(row_vision_inputs(row, tokenizer, unlimited, tokens).input_ids)
        else:
            length = len(_text_prompt_ids(row, tokenizer, processing))
        if length <= limit:
            kept.append(row)
    if len(kept) < len(rows):
        logger.warning(
            "dropped %d of %d rows whose prompt exceeds max_prompt_tokens=%d after image expansion "
            "(raise the limit or lower max_pixels to keep them)",
            len(rows) - len(kept),
            len(rows),
            limit,
        )
    return kept


def _text_prompt_ids(row: Row, tokenizer: Any, processing: QwenVLProcessing) -> list[int]:
    return render_prompt(tokenizer, generation_request(row, SamplingParams(), processing.chat_template_kwargs))


def row_request(
    row: Row,
    sampling: SamplingParams,
    tokenizer: Any,
    processing: QwenVLProcessing,
    tokens: VisionTokenIds | None = None,
) -> GenerationRequest:
    """The engine request of one row: expanded `prompt_ids` plus the image tensors and M-RoPE positions
    (`engine_inputs()`) for an image row, core-rl's text request otherwise. The row's n samples share the tensors."""
    if not row_images(row):
        return generation_request(row, sampling, processing.chat_template_kwargs)
    inputs = row_vision_inputs(row, tokenizer, processing, tokens)
    return GenerationRequest(prompt_ids=inputs.input_ids, multimodal=inputs.engine_inputs(), sampling=sampling)


class VisionCollector:
    """The core-rl `CollectFactory` `vision_collector` returns; it declares the chat-template variables it renders
    prompts with (`chat_template_kwargs`), which the trainer checks against `data.apply_chat_template_kwargs`."""

    def __init__(self, tokenizer: Any, processing: QwenVLProcessing) -> None:
        self.tokenizer, self.processing = tokenizer, processing
        self.tokens = VisionTokenIds.from_tokenizer(tokenizer)
        self.chat_template_kwargs = dict(processing.chat_template_kwargs)

    def __call__(self, engine: RolloutEngine) -> CollectFn:
        def collect(rows: Sequence[Row], sampling: SamplingParams, prefix: str) -> list[Trajectory]:
            requests = [row_request(row, sampling, self.tokenizer, self.processing, self.tokens) for row in rows]
            return sample_trajectories(engine, rows, requests, prefix)

        return collect


def vision_collector(tokenizer: Any, processing: QwenVLProcessing) -> Callable[[RolloutEngine], CollectFn]:
    """A core-rl `CollectFactory`: `collect_factory=vision_collector(tokenizer, processing)`."""
    return VisionCollector(tokenizer, processing)
