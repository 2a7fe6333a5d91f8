"""`load_causal_lm` picks the model class from the checkpoint's config: causal LMs as before, VLMs too.

transformers 5 does not map `qwen2_5_vl` to `AutoModelForCausalLM`, so a Qwen2.5-VL checkpoint loads as its
image-text-to-text class; a saved one (what `Trainer.save` writes) loads back with the same weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2ForCausalLM,
)

from rlloom.core_rl.config.schema import ModelConfig
from rlloom.core_rl.workers.actor import load_causal_lm, model_class

CPU = torch.device("cpu")


def _tiny_vl_dir(root: Path) -> Path:
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
        },
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
                       "fullatt_block_indexes": [0]},
        image_token_id=60, video_token_id=61, vision_start_token_id=62, vision_end_token_id=63,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(root / "vl")
    return root / "vl"


def test_text_models_keep_the_causal_lm_class(tiny_model_dir: Path) -> None:
    assert model_class(str(tiny_model_dir)) is AutoModelForCausalLM
    model = load_causal_lm(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU)
    assert type(model) is Qwen2ForCausalLM


def test_a_qwen2_5_vl_checkpoint_loads_saves_and_reloads(tmp_path: Path) -> None:
    path = _tiny_vl_dir(tmp_path)
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_pretrained(path)  # why the fallback exists
    assert model_class(str(path)) is AutoModelForImageTextToText
    model = load_causal_lm(ModelConfig(path=str(path)), str(path), CPU)
    assert type(model) is Qwen2_5_VLForConditionalGeneration
    ids = torch.tensor([[1, 2, 3, 4]])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, 64)
    model.save_pretrained(tmp_path / "saved")  # as Trainer.save's PolicyActor.save_pretrained does
    again = load_causal_lm(ModelConfig(path=str(path)), str(tmp_path / "saved"), CPU)
    assert type(again) is Qwen2_5_VLForConditionalGeneration
    torch.testing.assert_close(again(input_ids=ids).logits, logits, rtol=0, atol=0)
