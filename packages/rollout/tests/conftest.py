"""Shared fixtures: the tiny in-process Qwen2 model and character tokenizer from core-rl."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf_engine import HFEngine


@pytest.fixture(scope="session")
def tok() -> Any:
    return char_tokenizer()


@pytest.fixture
def model(tok: Any) -> torch.nn.Module:
    m = tiny_qwen2(tok, seed=0)
    m.eval()
    return m


@pytest.fixture
def engine(model: torch.nn.Module, tok: Any) -> Iterator[HFEngine]:
    eng = HFEngine(model, tok)
    yield eng
    eng.close()


@pytest.fixture
def encode(tok: Any) -> Any:
    def _encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    return _encode
