"""model.disable_dropout: a checkpoint whose config has dropout trains with ratio 1 before its first step."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from rlloom.core_rl.config.schema import ModelConfig
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.actor import load_causal_lm
from rlloom.core_rl.workers.critic import ValueModel
from rlloom.core_rl.workers.dropout import disable_dropout


def two_train_mode_forwards(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    model.train()
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        return model(input_ids=ids).logits, model(input_ids=ids).logits


def test_a_qwen2_checkpoint_with_attention_dropout_loads_without_it(tmp_path: Path) -> None:
    tok = char_tokenizer()
    model = tiny_qwen2(tok)
    model.config.attention_dropout = 0.5
    model.save_pretrained(tmp_path)
    cpu = torch.device("cpu")
    with_dropout = load_causal_lm(ModelConfig(path=str(tmp_path), disable_dropout=False), str(tmp_path), cpu)
    first, second = two_train_mode_forwards(with_dropout)
    assert not torch.equal(first, second)  # the premise: train mode samples dropout masks
    loaded = load_causal_lm(ModelConfig(path=str(tmp_path)), str(tmp_path), cpu)
    first, second = two_train_mode_forwards(loaded)
    assert torch.equal(first, second)
    loaded.eval()
    with torch.no_grad():
        eval_logits = loaded(input_ids=torch.arange(3, 40).unsqueeze(0)).logits
    torch.testing.assert_close(first, eval_logits)  # the update's pass equals the old-log-prob pass
    critic = ValueModel.from_pretrained(ModelConfig(path=str(tmp_path)), str(tmp_path))
    assert all(getattr(m, "attention_dropout", 0.0) == 0.0 for m in critic.modules())


def test_dropout_modules_and_rates_are_zeroed_and_counted() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=64))
    rates = [m.p for m in gpt2.modules() if isinstance(m, nn.Dropout)]
    assert rates and all(p == 0.1 for p in rates)  # GPT-2's config: resid, embd and attn dropout 0.1
    assert disable_dropout(gpt2) == len(rates)
    assert all(m.p == 0.0 for m in gpt2.modules() if isinstance(m, nn.Dropout))
    assert disable_dropout(gpt2) == 0  # nothing left to change
