"""The adapters' tests run against the real peer libraries (TRL, veRL, verifiers), which only the
`tests-adapters` nox session installs; elsewhere (the `docs` session runs tests/) they are not collected."""

from __future__ import annotations

import os
from typing import Any

import pytest

collect_ignore_glob = [] if os.environ.get("RLLOOM_ADAPTER_TESTS") else ["test_*.py"]

CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 <>/\\{}()[].,:;=?#+-*'\"\n")
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def char_tokenizer() -> Any:
    """A character-level fast tokenizer with a chat template, built in-process (no hub)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<unk>", *CHARS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok
