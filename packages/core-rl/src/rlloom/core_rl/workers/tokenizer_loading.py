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

from rlloom.core_rl.config.keys import ConfigError
from rlloom.core_rl.contracts.engines import HasTokenizer

GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
TOKENIZER_FILE_PREFIXES = ("tokenizer", "vocab", "merges", "spiece", "sentencepiece")
"""Names a tokenizer folder's files start with (tokenizer.json, vocab.json, spiece.model, ...)."""


def has_tokenizer_files(folder: Path) -> bool:
    """Whether `folder` holds a saved tokenizer: without one, `AutoTokenizer` on a model folder builds an empty
    tokenizer that encodes every text to nothing."""
    return folder.is_dir() and any(
        f.name.startswith(TOKENIZER_FILE_PREFIXES) or f.suffix == ".tiktoken" for f in folder.iterdir()
    )


def load_pretrained_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `path` (a folder), loaded as its tokenizer_config.json declares.

    A folder holding no tokenizer files is refused (a model saved without its tokenizer, e.g. `save_tiny_model`'s
    `model` folder, whose tokenizer is beside it).
    """
    folder = Path(path)
    if folder.is_dir() and not has_tokenizer_files(folder):
        raise ValueError(f"no tokenizer in {folder}; give the folder the tokenizer was saved in")
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


PROBE_TEXT = "Hello, world!\n  12 + 34 = 46. <answer>x</answer>"
"""Spaces, a newline, digits, punctuation and a tag: what a mismatched tokenizer gets wrong first."""


def check_engine_tokenizer(engine: object, tokenizer: PreTrainedTokenizerBase, tokenizer_source: str) -> None:
    """Refuse an engine whose tokenizer encodes text differently from the trainer's.

    The trainer scores the engine's token ids with its own tokenizer's chat rendering; two tokenizers that differ
    (an engine loaded from a model folder without the tokenizer beside it, while the trainer reads
    `model.tokenizer_path`) would train on prompts the model never saw, silently. Engines without a tokenizer of
    their own (not `HasTokenizer`: an HTTP endpoint) are not checked.
    """
    engine_tokenizer = engine.tokenizer if isinstance(engine, HasTokenizer) else None
    if engine_tokenizer is None or engine_tokenizer is tokenizer:
        return
    ours = list(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    theirs = list(engine_tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    if ours != theirs:
        raise ConfigError(
            f"the engine's tokenizer ({type(engine_tokenizer).__name__}) encodes text differently from the "
            f"trainer's ({tokenizer_source}): {len(theirs)} vs {len(ours)} tokens for {PROBE_TEXT!r}. Build the "
            "engine with the trainer's tokenizer, e.g. HFEngine.from_pretrained(cfg.model.path, "
            "tokenizer_path=cfg.model.tokenizer_path)"
        )
