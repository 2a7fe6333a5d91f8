"""Tiny random Qwen2.5-VL and Qwen2-VL models and a Qwen-VL-style tokenizer built in-process, for CPU tests and
demos offline.

`qwen_vl_char_tokenizer()` is core-rl's character tokenizer plus the Qwen vision special tokens and a chat
template that renders image content parts as `<|vision_start|><|image_pad|><|vision_end|>`, like Qwen's own.
`tiny_qwen2_5_vl(tokenizer)` is a randomly initialised `Qwen2_5_VLForConditionalGeneration` of about 0.17M
parameters (text hidden 64, 2 layers, M-RoPE sections [2, 3, 3]; a 2-block ViT of width 32) whose vision
token ids are the tokenizer's, so the whole image path (ViT, merger, placeholder scatter, 3-D rope) runs.
`tiny_qwen2_vl(tokenizer)` is the same text model on Qwen2-VL's vision tower (full attention in every block,
no window attention), the other model family the engine and actor support.
`save_tiny_vl_model(root)` writes both as folders a trainer config can name (`model.path`, `model.tokenizer_path`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from rlloom.core_rl.tiny import DEFAULT_ALPHABET, SavedTinyModel, char_tokenizer
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionTokenIds

VISION_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def qwen_vl_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """core-rl's character tokenizer with the Qwen vision special tokens and a Qwen-VL chat template."""
    tok = char_tokenizer(alphabet)
    tok.add_tokens(VISION_SPECIAL_TOKENS, special_tokens=True)  # skipped when decoding, never split
    tok.chat_template = QWEN_VL_CHAT_TEMPLATE
    return tok


def tiny_qwen2_5_vl(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vision_width: int = 32,
    vision_depth: int = 2,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Qwen2_5_VLForConditionalGeneration:
    """A randomly initialised Qwen2.5-VL whose vocabulary and vision token ids match `tokenizer`.

    ViT patch 14, merge 2, temporal patch 2 as in the released models, so `QwenVLProcessing()` defaults fit.
    """
    vision = VisionTokenIds.from_tokenizer(tokenizer)
    config = Qwen2_5_VLConfig(
        text_config=_text_config(
            tokenizer,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
        ),
        vision_config={
            "depth": vision_depth,
            "hidden_size": vision_width,
            "intermediate_size": 2 * vision_width,
            "num_heads": 2,
            "out_hidden_size": hidden_size,  # the merger projects into the text model's width
            "window_size": 56,
            "fullatt_block_indexes": [vision_depth - 1],
        },
        image_token_id=vision.image_pad,
        video_token_id=vision.video_pad,
        vision_start_token_id=vision.vision_start,
        vision_end_token_id=vision.vision_end,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    return _finish(model, tokenizer, dtype)


def tiny_qwen2_vl(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vision_width: int = 32,
    vision_depth: int = 2,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Qwen2VLForConditionalGeneration:
    """A randomly initialised Qwen2-VL (patch 14, merge 2, temporal patch 2, as released) on `tokenizer`."""
    vision = VisionTokenIds.from_tokenizer(tokenizer)
    config = Qwen2VLConfig(
        text_config=_text_config(
            tokenizer,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
        ),
        vision_config={
            "depth": vision_depth,
            "embed_dim": vision_width,
            "hidden_size": hidden_size,  # the merger projects into the text model's width
            "mlp_ratio": 2,
            "num_heads": 2,
        },
        image_token_id=vision.image_pad,
        video_token_id=vision.video_pad,
        vision_start_token_id=vision.vision_start,
        vision_end_token_id=vision.vision_end,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    return _finish(model, tokenizer, dtype)


def _text_config(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
) -> dict[str, object]:
    """The language model of both tiny VLMs: Qwen2 with multimodal rotary embeddings."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": max_position_embeddings,
        # temporal/height/width halves of the rotary frequencies; must sum to head_dim / 2
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e6,
            "mrope_section": _mrope_section(hidden_size // num_heads),
        },
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }


_VLM = TypeVar("_VLM", Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration)


def _finish(model: _VLM, tokenizer: PreTrainedTokenizerFast, dtype: torch.dtype) -> _VLM:
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    torch.nn.Module.to(model, dtype)  # transformers wraps `.to` with a signature mypy cannot follow
    return model


def save_tiny_vl_model(
    root: str | Path,
    *,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    vision_tokens_unlikely: bool = False,
    **shape: int,
) -> SavedTinyModel:
    """Save `tiny_qwen2_5_vl` on `qwen_vl_char_tokenizer` as loadable folders (`model`, `tokenizer`); `shape`
    goes to `tiny_qwen2_5_vl` (e.g. hidden_size=128, num_heads=2, num_kv_heads=1: head_dim 64 for vLLM on CPU);
    `vision_tokens_unlikely`: `make_vision_tokens_unlikely` (for log-prob comparisons with vLLM).

    As in core-rl's `save_tiny_model`, the tokenizer gets its own folder: `AutoTokenizer` on a Qwen-VL model
    folder would build Qwen's BPE tokenizer, which does not fit this character vocabulary. The model folder also
    holds the image processor's preprocessor_config.json (QwenVLProcessing's defaults), as released models do:
    vLLM builds its image processor from it.
    """
    root = Path(root)
    tokenizer = qwen_vl_char_tokenizer()
    model = tiny_qwen2_5_vl(tokenizer, seed=seed, max_position_embeddings=max_position_embeddings, **shape)  # type: ignore[arg-type]
    if vision_tokens_unlikely:
        make_vision_tokens_unlikely(model, tokenizer)
    model.save_pretrained(root / "model")
    QwenVLProcessing().image_processor().save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "tokenizer")
    return SavedTinyModel(model=root / "model", tokenizer=root / "tokenizer")


def make_vision_tokens_unlikely(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
    """Give a random tiny VLM what a trained one has: vision tokens (image/video pad, vision start) that are never
    likely outputs. Every (tied) embedding row gets 0.05 on dimension 0 and the vision tokens' -50, so a text token's
    final hidden state carries that dimension and scores them about e^-50 below the rest (the 0.05 shifts every
    other logit alike; RMSNorm keeps the input side as it was). Engines never sample them, and vLLM reports the
    log-probs of the distribution it samples from (renormalised without them), so tests that compare its log-probs
    with a full-vocabulary forward need their share negligible."""
    vision = VisionTokenIds.from_tokenizer(tokenizer)
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        assert isinstance(embed, torch.Tensor)
        embed[:, 0] = 0.05
        embed[[vision.image_pad, vision.video_pad, vision.vision_start], 0] = -50.0


def _mrope_section(head_dim: int) -> list[int]:
    """Qwen's 2:3:3 split of head_dim / 2 rotary frequencies over temporal, height and width ([2, 3, 3] at 16)."""
    half = head_dim // 2
    temporal = half // 4
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]
