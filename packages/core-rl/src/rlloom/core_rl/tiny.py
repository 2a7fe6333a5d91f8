"""Tiny models built in-process, for tests, demos and benchmarks on machines with no model hub.

`char_tokenizer()` is a real `PreTrainedTokenizerFast` over single characters plus Qwen-style chat special
tokens and a ChatML chat template, so chat rendering, special ids and decoding behave like a real tokenizer.
`word_tokenizer(words)` is the same over whole words (tags such as `<search>` and punctuation are tokens of their
own): a tiny model copies a one-token name far more easily than a five-character one.
`tiny_qwen2()` is a randomly initialised Qwen2 causal LM sized for a 2-core CPU.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DEFAULT_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n\t"


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer: one id per character, special tokens first.

    Unknown characters map to `<|endoftext|>`'s neighbour `<unk>` so odd input never crashes encoding.
    """
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, "<unk>", *chars])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return _chatml_tokenizer(backend)


WORD_PIECES = r"</?[A-Za-z_]+>|\w+|[^\w\s]"
"""A word tokenizer's pieces: an XML-style tag, a run of word characters, or one punctuation mark."""


def word_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over `words` (plus the ChatML special tokens and `<unk>`).

    Text is split on whitespace, then into tags, words and single punctuation marks; each piece is one id, and
    anything outside `words` is `<unk>`. Decoding joins the pieces with single spaces, so
    `<search> zor bak </search>` comes back as written (spacing around punctuation does not).
    """
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys([*SPECIAL_TOKENS, "<unk>", *words]))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(WORD_PIECES), behavior="isolated")]
    )
    return _chatml_tokenizer(backend)


def _chatml_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a tokenizers backend with Qwen's special tokens (EOS `<|im_end|>`) and the ChatML template."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token=None,
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    return tok


def tiny_qwen2(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2ForCausalLM whose vocabulary matches `tokenizer` (about 0.1M parameters)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    torch.nn.Module.to(model, dtype)  # transformers wraps `.to` with a signature mypy cannot follow
    return model


def move_from_start(
    model: Qwen2ForCausalLM, *, seed: int, scale: float = 0.4, embed_scale: float = 4.0
) -> Qwen2ForCausalLM:
    """Add seeded noise of `scale` to every matrix and multiply the embeddings by `embed_scale`, in place; returns
    the model in eval mode. A tiny model's near-uniform start samples one repeated token with near-ties; moved
    away, its greedy text depends on the whole context, so tests can tell two weights (or old keys/values) apart."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * scale)
        model.model.embed_tokens.weight.mul_(embed_scale)
    return model.eval()


@dataclass(frozen=True, slots=True)
class SavedTinyModel:
    """Folders of a saved tiny model: `model` (config + weights) and `tokenizer`, kept apart on purpose."""

    model: Path
    tokenizer: Path


def save_tiny_model(root: str | Path, *, max_position_embeddings: int = 1024, seed: int = 0) -> SavedTinyModel:
    """Save `tiny_qwen2` on `char_tokenizer` as loadable folders: what CLI tests and examples pass as --model.

    The tokenizer goes in its own folder because `AutoTokenizer` reads a qwen2 model folder as Qwen2's BPE
    tokenizer, which silently drops the spaces and newlines of this character vocabulary (rlloom's own loaders use
    `tokenizer_loading.load_pretrained_tokenizer`, which reads either layout right).
    """
    root = Path(root)
    tokenizer = char_tokenizer()
    tiny_qwen2(tokenizer, seed=seed, max_position_embeddings=max_position_embeddings).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "tokenizer")
    return SavedTinyModel(model=root / "model", tokenizer=root / "tokenizer")
