"""The GPU check's `retrieval_encoding`: dense retrieval encoding throughput on the device, through rlloom's own
encoding path (`rlloom.retrieval.dense.load_encoder` + `encode` with the `e5` preset, as bench/retrieval_encoding.py
runs it on a CPU), for a BERT of e5-base-v2's shape (12 x 768, 30,522-token vocabulary) with random weights.

Everything is built in-process, because the lent machine has no network and no ../shared data: a WordPiece
`BertTokenizer` over a generated vocabulary and synthetic passages of 100 words whose token count is that of
HotpotQA's Wikipedia paragraphs under bert-base-uncased (132 tokens with the `passage: ` prefix, as the CPU bench
measured), queries of 18 words (26 tokens). The vectors are meaningless; only the timing is kept, and the check
compares the half-precision vectors with fp32's (a cast that broke the encoder would show).

The path itself runs fp32 (`DenseConfig` has no dtype option); fp16 and bf16 are a copy of the loaded encoder cast
with `.to(dtype)`, labelled as such: what a dtype option would give.
"""

from __future__ import annotations

import copy
import importlib
import math
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WIKI18_PASSAGES = 21_015_324
TURN_QUERIES = 2_560  # one Search-R1 training turn: 512 prompts x 5 samples
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "passage", "query", ":")
STEM_LETTERS = "abcdefghijklmnop"  # whole words use only these ...
SUFFIX_LETTERS = "qrstuvwxyz"  # ... and suffix pieces only these, so a stem+suffix word is exactly 2 tokens
# the dense path's imports beyond the GPU check's own: sentence-transformers (and what it imports at once:
# scikit-learn, scipy, joblib, cloudpickle, threadpoolctl, narwhals), and rlloom.retrieval's package (bm25s,
# PyStemmer, tqdm); scripts/gpu_wheels.py --retrieval collects their wheels
NEEDED = (
    "sentence_transformers",
    "sklearn",
    "scipy",
    "joblib",
    "cloudpickle",
    "threadpoolctl",
    "narwhals",
    "bm25s",
    "Stemmer",
    "tqdm",
)
MIN_HALF_COSINE = 0.99  # a half-precision vector against fp32's, same passage
RETRIEVAL_SRC = Path(__file__).resolve().parents[1] / "packages" / "retrieval" / "src"


@dataclass(frozen=True)
class EncodingSizes:
    """The encoder's shape and the work measured; FULL_ENCODING for a GPU, TINY_ENCODING for the CPU dry run."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    suffixes: int  # '##' pieces in the vocabulary
    passages: int  # passages encoded per timed repeat
    queries: int  # queries per timed repeat (full size: one Search-R1 turn)
    batch_size: int
    repeats: int


FULL_ENCODING = EncodingSizes(12, 768, 12, 3072, 30_522, 1000, 8192, TURN_QUERIES, 512, 2)
TINY_ENCODING = EncodingSizes(2, 64, 4, 128, 1_000, 100, 16, 8, 8, 1)
PASSAGE_WORDS, PASSAGE_SPLIT = 100, 28  # 100 words, 28 of them stem+suffix: 128 pieces + 'passage', ':' + [CLS], [SEP]
QUERY_WORDS, QUERY_SPLIT = 18, 4  # 22 pieces + 'query', ':' + [CLS], [SEP]


def _spell(number: int, letters: str, width: int) -> str:
    digits = []
    for _ in range(width):
        number, digit = divmod(number, len(letters))
        digits.append(letters[digit])
    return "".join(reversed(digits))


def vocabulary(size: int, suffixes: int) -> tuple[list[str], list[str], list[str]]:
    """(vocabulary in id order, whole words, suffix pieces without '##'): `size` entries in all."""
    stems = size - len(SPECIALS) - suffixes
    if stems <= 0 or suffixes > len(SUFFIX_LETTERS) ** 3 or stems > len(STEM_LETTERS) ** 4:
        raise ValueError(
            f"vocabulary of {size} with {suffixes} suffixes cannot be spelt; raise vocab or lower suffixes"
        )
    words = [_spell(i, STEM_LETTERS, 4) for i in range(stems)]
    pieces = [_spell(i, SUFFIX_LETTERS, 3) for i in range(suffixes)]
    return [*SPECIALS, *words, *("##" + p for p in pieces)], words, pieces


def wordpiece_tokenizer(size: int, suffixes: int) -> Any:
    """bert-base-uncased's kind of tokenizer (WordPiece, lower case, [CLS] ... [SEP]) over a generated vocabulary."""
    from transformers import BertTokenizer

    vocab, _, _ = vocabulary(size, suffixes)
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})
    if len(tokenizer) != size:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} ids, wanted {size} (transformers' BertTokenizer(vocab=))")
    return tokenizer


def texts(count: int, words: int, split: int, vocab: tuple[list[str], list[str]], seed: int) -> list[str]:
    """`count` texts of `words` words, `split` of them a stem followed by a suffix piece (two tokens)."""
    stems, pieces = vocab
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chosen = [rng.choice(stems) for _ in range(words)]
        for position in rng.sample(range(words), split):
            chosen[position] += rng.choice(pieces)
        out.append(" ".join(chosen))
    return out


def e5_shaped_folder(folder: Path, sizes: EncodingSizes) -> Path:
    """A randomly initialised BERT of the sizes' shape and its tokenizer, saved as a Hugging Face model folder."""
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = wordpiece_tokenizer(sizes.vocab, sizes.suffixes)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=sizes.vocab, hidden_size=sizes.hidden, num_hidden_layers=sizes.layers,
        num_attention_heads=sizes.heads, intermediate_size=sizes.intermediate, max_position_embeddings=512,
        type_vocab_size=2,
    )  # fmt: skip
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def missing_modules() -> list[str]:
    """Each module of NEEDED that does not import, with the module it lacks when that is another one."""
    missing = []
    for name in NEEDED:
        try:
            importlib.import_module(name)
        except ImportError as err:
            lacking = err.name if isinstance(err, ModuleNotFoundError) else None
            missing.append(name if lacking in (None, name) else f"{name} (lacks {lacking})")
    return missing


def import_dense() -> Any:
    """rlloom.retrieval.dense, from this working tree's sources when it is not installed (namespace package)."""
    try:
        return importlib.import_module("rlloom.retrieval.dense")
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("rlloom") or not RETRIEVAL_SRC.is_dir():
            raise
        sys.path.append(str(RETRIEVAL_SRC))
        return importlib.import_module("rlloom.retrieval.dense")


def faiss_placeholder() -> str:
    """`load_encoder` demands faiss before it loads an encoder, though encoding never calls it; without faiss (a
    28 MiB wheel the device call cannot carry with the rest) a module that raises on any use satisfies that demand."""
    try:
        importlib.import_module("faiss")
        return "installed"
    except ImportError:
        from types import ModuleType

        class Unusable(ModuleType):
            def __getattr__(self, name: str) -> Any:
                raise RuntimeError(f"faiss.{name}: faiss is not installed; the encoding check must not use it")

        sys.modules["faiss"] = Unusable("faiss")
        return "absent: placeholder for load_encoder's import guard (encoding never calls faiss)"


def timed_rate(encode: Any, items: list[str], repeats: int, sync: Any) -> float:
    """Items a second, median of `repeats` after a warm-up batch."""
    encode(items[:64])
    seconds = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        encode(items)
        sync()
        seconds.append(time.perf_counter() - t0)
    return len(items) / statistics.median(seconds)


def missing_note(missing: list[str]) -> str:
    return (
        f"the dense encoding path needs {', '.join(missing)}: run `python scripts/gpu_wheels.py --retrieval X.Y` "
        f"here for the machine's Python X.Y (python={platform.python_version()}) and carry .whl (docs/gpu_check.md)"
    )


def measure(ctx: Any) -> dict[str, Any]:
    """passages/s and queries/s of the e5 preset's encoding path on the device, fp32 and cast to fp16/bf16; the
    caller checks `problems(figures)`. Needs every module of NEEDED (`missing_modules()` first)."""
    import numpy as np
    import torch

    faiss = faiss_placeholder()
    dense = import_dense()
    from rlloom.retrieval.presets import PRESETS

    sizes = TINY_ENCODING if ctx.tiny else FULL_ENCODING
    _, stems, pieces = vocabulary(sizes.vocab, sizes.suffixes)
    passages = texts(sizes.passages, PASSAGE_WORDS, PASSAGE_SPLIT, (stems, pieces), seed=1)
    queries = texts(sizes.queries, QUERY_WORDS, QUERY_SPLIT, (stems, pieces), seed=2)
    if ctx.cuda:  # this check's peak, not the earlier checks' (the 3B update's tens of GiB)
        gc_collect(ctx)
        torch.cuda.reset_peak_memory_stats()
    with tempfile.TemporaryDirectory(prefix="rlloom-e5-shape-") as tmp:
        t0 = time.perf_counter()
        folder = e5_shaped_folder(Path(tmp), sizes)
        config = dense.DenseConfig(model=str(folder), device=str(ctx.device), batch_size=sizes.batch_size,
                                   cache_dir=None, **PRESETS["e5"].options)  # fmt: skip
        encoder = dense.load_encoder(config)
        build_s = time.perf_counter() - t0
        tokenizer = encoder.tokenizer
        lengths = [len(ids) for ids in tokenizer([config.passage_prefix + p for p in passages])["input_ids"]]
        q_lengths = [len(ids) for ids in tokenizer([config.query_prefix + q for q in queries])["input_ids"]]
        figures: dict[str, Any] = {
            "encoder": f"e5-base-v2 shape ({sizes.layers} x {sizes.hidden}, vocab {sizes.vocab}), random weights",
            "path": "rlloom.retrieval.dense load_encoder + encode, e5 preset",
            "faiss": faiss,
            "batch_size": sizes.batch_size,
            "passages": sizes.passages,
            "queries": sizes.queries,
            "mean_passage_tokens": statistics.mean(lengths),
            "mean_query_tokens": statistics.mean(q_lengths),
            "build_and_load_s": build_s,
        }
        reference = dense.encode(encoder, [config.passage_prefix + p for p in passages[:64]], config)
        norms = np.linalg.norm(reference, axis=1)
        figures["vector_dim"] = int(reference.shape[1])
        figures["vector_norm_min"], figures["vector_norm_max"] = float(norms.min()), float(norms.max())
        for label, dtype in (("fp32", None), ("fp16_cast", torch.float16), ("bf16_cast", torch.bfloat16)):
            model = encoder if dtype is None else copy.deepcopy(encoder).to(dtype)

            def run(items: list[str], prefix: str, model: Any = model) -> Any:
                return dense.encode(model, [prefix + item for item in items], config)

            p_rate = timed_rate(lambda b: run(b, config.passage_prefix), passages, sizes.repeats, ctx.sync)
            q_rate = timed_rate(lambda b: run(b, config.query_prefix), queries, sizes.repeats, ctx.sync)
            figures[f"{label}_passages_per_s"] = p_rate
            figures[f"{label}_queries_per_s"] = q_rate
            figures[f"{label}_wiki18_hours"] = WIKI18_PASSAGES / p_rate / 3600
            figures[f"{label}_turn_{TURN_QUERIES}_queries_s"] = TURN_QUERIES / q_rate
            if dtype is not None:
                vectors = run(passages[:64], config.passage_prefix)
                figures[f"{label}_min_cosine_vs_fp32"] = float((vectors * reference).sum(axis=1).min())
                del model
        if ctx.cuda:
            figures["peak_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    dense._ENCODERS.clear()  # the folder is gone; a later load must not find this encoder cached
    gc_collect(ctx)
    return figures


def problems(figures: dict[str, Any], hidden: int) -> list[str]:
    """What makes the check FAIL: vectors not unit-length of the model's width, half precision off fp32's, a rate
    that is not a positive number."""
    found = []
    if figures["vector_dim"] != hidden:
        found.append(f"vectors of {figures['vector_dim']} dimensions, the model's hidden size is {hidden}")
    if not (abs(figures["vector_norm_min"] - 1) <= 1e-3 and abs(figures["vector_norm_max"] - 1) <= 1e-3):
        found.append(
            f"the e5 preset normalises, yet norms span {figures['vector_norm_min']}..{figures['vector_norm_max']}"
        )
    for label in ("fp16_cast", "bf16_cast"):
        if not figures[f"{label}_min_cosine_vs_fp32"] >= MIN_HALF_COSINE:
            found.append(f"{label} vectors differ from fp32's (cosine < {MIN_HALF_COSINE})")
    rates = [v for k, v in figures.items() if k.endswith("_per_s")]
    if not all(rate > 0 and math.isfinite(rate) for rate in rates):
        found.append("a rate is not a positive finite number")
    return found


def gc_collect(ctx: Any) -> None:
    import gc

    import torch

    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()
