"""A saved tokenizer loads back as the class it was saved as, beside a model config too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2, word_tokenizer
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer

TEXT = "reverse 482\nanswer: 284"


@pytest.mark.parametrize("make", [char_tokenizer, lambda: word_tokenizer(["reverse", "482", "answer", "284"])])
def test_tiny_tokenizer_saved_beside_a_qwen2_model_round_trips(tmp_path: Path, make: object) -> None:
    original = make()  # type: ignore[operator]
    tiny_qwen2(original).save_pretrained(tmp_path)  # a checkpoint folder: model config and tokenizer together
    original.save_pretrained(tmp_path)
    loaded = load_pretrained_tokenizer(tmp_path)
    expected = original(TEXT)["input_ids"]
    assert loaded(TEXT)["input_ids"] == expected
    assert loaded.decode(expected) == original.decode(expected)
    assert loaded.chat_template == original.chat_template
    assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<pad>")


def test_a_specific_tokenizer_class_goes_through_auto_tokenizer(tmp_path: Path) -> None:
    char_tokenizer().save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"  # what a real Qwen2.5 checkpoint declares
    config_file.write_text(json.dumps(config))
    assert type(load_pretrained_tokenizer(tmp_path)).__name__ == "Qwen2Tokenizer"
