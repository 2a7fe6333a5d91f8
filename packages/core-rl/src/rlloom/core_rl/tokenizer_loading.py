"""Load a saved tokenizer as the class it was saved as.

transformers 5 swaps a generic tokenizers-backed tokenizer (`tokenizer_class` "TokenizersBackend" or
"PreTrainedTokenizerFast" in tokenizer_config.json) for the model type's own class when the folder also holds a
model config: a Qwen2 checkpoint then loads `Qwen2Tokenizer`, which rebuilds Qwen's byte-level pre-tokenizer and
silently drops every space and newline of a character or word vocabulary (the tiny tokenizers of tests, demos
and their checkpoints). The folder's tokenizer.json already says exactly how to tokenize, so a generic
declaration is honoured as written; every other folder goes through `AutoTokenizer` unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})


def load_pretrained_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `path` (a folder), loaded as its tokenizer_config.json declares."""
    folder = Path(path)
    if _declares_generic_tokenizer(folder):
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(str(path))
    return tokenizer


def _declares_generic_tokenizer(folder: Path) -> bool:
    config_file, backend_file = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (config_file.is_file() and backend_file.is_file()):
        return False
    try:
        declared = json.loads(config_file.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return False  # AutoTokenizer reports a broken file better than we would
    return declared in GENERIC_TOKENIZER_CLASSES
