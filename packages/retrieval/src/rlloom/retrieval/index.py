"""Building and loading index folders: passages once in a memory-mapped store, one backend's files beside them.

`build_index` streams the corpus into the passage store (hashing the file on the way), builds the backend from
the store in batches, writes the manifest last, and swaps the folder into place atomically. `load_index` checks
the manifest and returns an `IndexRetriever`, which implements `Retriever`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rlloom.retrieval.bm25 import BM25Backend, BM25Config
from rlloom.retrieval.corpus import check_corpus_file, file_checksum, read_corpus
from rlloom.retrieval.docstore import DocStore, write_docstore
from rlloom.retrieval.hybrid import HybridBackend, HybridConfig
from rlloom.retrieval.manifest import (
    Manifest,
    atomic_folder,
    check_output_folder,
    package_versions,
    read_manifest,
    write_manifest,
)
from rlloom.retrieval.presets import apply_preset
from rlloom.retrieval.ranking import Ranking, RankingBackend
from rlloom.retrieval.types import EncoderMismatchError, Hit, IndexLoadError

BACKENDS = ("bm25", "dense", "lucene", "hybrid")
_LIBRARIES = ("bm25s", "PyStemmer", "numpy", "faiss-cpu", "faiss-gpu-cu12", "sentence-transformers", "pyserini")


def config_class(backend: str) -> type[BaseModel]:
    """The config model of a backend (its fields are the `build_index` options)."""
    if backend == "bm25":
        return BM25Config
    if backend == "dense":
        from rlloom.retrieval.dense import DenseConfig

        return DenseConfig
    if backend == "lucene":
        from rlloom.retrieval.lucene import LuceneConfig

        return LuceneConfig
    if backend == "hybrid":
        return HybridConfig
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def backend_config(backend: str, options: dict[str, Any]) -> BaseModel:
    """Validate a backend's options into its config model; any error is one line naming the option and the fix."""
    model = config_class(backend)
    try:
        config = model(**options)
    except ValidationError as err:
        raise ValueError(f"{backend} backend: {_one_line(err, model)}") from None
    if isinstance(config, HybridConfig):  # check the parts now, not after the passage store is written
        for name, spec in (("first", config.first), ("second", config.second)):
            try:
                backend_config(spec.backend, spec.options())
            except ValueError as err:
                raise ValueError(f"hybrid part {name!r}: {err}") from None
    return config


def _one_line(err: ValidationError, model: type[BaseModel]) -> str:
    parts = []
    for e in err.errors(include_url=False):
        name = ".".join(str(p) for p in e["loc"]) or "options"
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown option {name!r}; valid options: {', '.join(model.model_fields)}")
        elif e["type"] == "missing":
            parts.append(f"option {name!r} is required")
        else:
            message = str(e["msg"]).removeprefix("Value error, ")
            parts.append(f"option {name}={e['input']!r}: {message}")
    return "; ".join(parts)


def check_load_options(path: Path, manifest: Manifest, overrides: dict[str, Any]) -> None:
    """Refuse overrides of build-time fields: they would be accepted and silently ignored by the stored index."""
    model = config_class(manifest.backend)
    query_time: frozenset[str] = getattr(model, "QUERY_TIME", frozenset())
    fixed = [name for name in overrides if name in model.model_fields and name not in query_time]
    if not fixed:
        return
    built = ", ".join(f"{name}={manifest.params.get(name)!r}" for name in fixed)
    wanted = " ".join(f"--opt {name}={_cli_value(overrides[name])}" for name in fixed)
    one = len(fixed) == 1
    raise ValueError(
        f"{', '.join(fixed)} {'is' if one else 'are'} fixed when the index is built ({path} has {built}) and cannot "
        f"change at load; to change {'it' if one else 'them'}, rebuild: `rlloom-retrieval build-index --corpus "
        f"{manifest.corpus_path} --out {path} --backend {manifest.backend} {wanted}` (plus the index's other "
        f"options), or drop {'it' if one else 'them'}. Options that apply at load: "
        f"{', '.join(sorted(query_time)) or 'none'}"
    )


def _cli_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _build_backend(
    backend: str, config: BaseModel, folder: Path, store: DocStore, corpus_sha256: str
) -> RankingBackend:
    batches = store.iter_contents()
    if isinstance(config, BM25Config):
        built = BM25Backend.build(batches, len(store), config)
        built.save(folder)
        return built
    if isinstance(config, HybridConfig):
        parts = []
        for name, spec in (("part0", config.first), ("part1", config.second)):
            sub = folder / name
            sub.mkdir()
            parts.append(
                _build_backend(spec.backend, backend_config(spec.backend, spec.options()), sub, store, corpus_sha256)
            )
        return HybridBackend(parts[0], parts[1], config, _passage_fetcher(store))
    if backend == "dense":
        from rlloom.retrieval.dense import DenseBackend

        batches = store.iter_contents(batch_size=getattr(config, "chunk_size", 4096))
        return DenseBackend.build(batches, len(store), config, folder, corpus_sha256)  # type: ignore[arg-type]
    if backend == "lucene":
        from rlloom.retrieval.lucene import LuceneBackend

        return LuceneBackend.build(store, config, folder)  # type: ignore[arg-type]
    raise ValueError(f"unknown backend {backend!r}")


def _load_backend(backend: str, config: BaseModel, folder: Path, store: DocStore) -> RankingBackend:
    if isinstance(config, BM25Config):
        return BM25Backend.load(folder, config)
    if isinstance(config, HybridConfig):
        first = _load_backend(
            config.first.backend, backend_config(config.first.backend, config.first.options()), folder / "part0", store
        )
        second = _load_backend(
            config.second.backend,
            backend_config(config.second.backend, config.second.options()),
            folder / "part1",
            store,
        )
        return HybridBackend(first, second, config, _passage_fetcher(store))
    if backend == "dense":
        from rlloom.retrieval.dense import DenseBackend

        probe = store.document(0).contents if len(store) else None
        return DenseBackend.load(folder, config, probe)  # type: ignore[arg-type]
    if backend == "lucene":
        from rlloom.retrieval.lucene import LuceneBackend

        return LuceneBackend.load(folder, config, store)  # type: ignore[arg-type]
    raise IndexLoadError(f"unknown backend {backend!r} in the manifest")


def _passage_fetcher(store: DocStore) -> Any:
    return lambda rows: [store.document(r).contents for r in rows]


def build_index(
    corpus: str | Path,
    out_dir: str | Path,
    backend: str | None = None,
    *,
    preset: str | None = None,
    **options: Any,
) -> Path:
    """Build a `backend` index (default bm25) of `corpus` (Search-R1 or BEIR JSONL, optionally gzip) into
    `out_dir`; return it.

    Options are the backend's config fields (`BM25Config`, `DenseConfig`, `LuceneConfig`, `HybridConfig`);
    `preset` (`presets.PRESETS`: `bm25-pyserini`, `e5`) picks the backend and fills in options, which `options`
    override. `out_dir` must be new, an empty folder or an existing rlloom index (anything else raises
    `FileExistsError`, since the folder is replaced as a whole); an existing index is replaced only once the new
    one is complete.
    """
    if preset is not None:
        backend, options = apply_preset(preset, backend, options)
    backend = backend or "bm25"
    corpus, out_dir = Path(corpus), Path(out_dir)
    check_corpus_file(corpus)
    check_output_folder(out_dir)
    config = backend_config(backend, options)
    checksum = file_checksum(corpus)
    with atomic_folder(out_dir) as tmp:
        count = write_docstore(tmp, read_corpus(corpus), source=str(corpus))
        if count == 0:
            raise ValueError(f"corpus {corpus} holds no passages")
        store = DocStore(tmp)
        _build_backend(backend, config, tmp, store, checksum)
        manifest = Manifest(
            backend=backend,
            params=config.model_dump(mode="json"),
            corpus_path=str(corpus.resolve()),
            corpus_sha256=checksum,
            doc_count=count,
            versions=package_versions(*_LIBRARIES),
        )
        write_manifest(tmp, manifest)
    return out_dir


class IndexRetriever:
    """A loaded index: the passage store plus the backend ranking its rows; implements `Retriever`."""

    def __init__(self, path: Path, manifest: Manifest, store: DocStore, backend: RankingBackend) -> None:
        self.path, self.manifest, self.store, self.backend = path, manifest, store, backend

    def rank(self, queries: list[str], k: int) -> list[Ranking]:
        """Rows and scores only (no passage text): what eval and fusion need."""
        return self.backend.rank(queries, k)

    def hits(self, ranking: Ranking) -> list[Hit]:
        out = []
        for row, score in zip(ranking.rows.tolist(), ranking.scores.tolist(), strict=True):
            doc = self.store.document(row)
            out.append(Hit(doc_id=doc.doc_id, score=score, text=doc.text, title=doc.title))
        return out

    def has_document(self, doc_id: str) -> bool:
        try:
            self.store.row_of(doc_id)
        except KeyError:
            return False
        return True

    def over_window(self, queries: list[str]) -> dict[int, str]:
        """Queries (by position) that the backend's encoder cuts to its token window, with that window; empty
        for bm25 and lucene, which read a query whole."""
        check = getattr(self.backend, "over_window", None)
        return check(queries) if check is not None else {}

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return [self.hits(r) for r in self.rank(queries, k)]


def load_index(path: str | Path, corpus: str | Path | None = None, **overrides: Any) -> IndexRetriever:
    """Load an index folder. With `corpus`, also check it was built from that exact file.

    `overrides` change query-time settings without rebuilding (the config's `QUERY_TIME` fields: `n_threads` for
    bm25, `hnsw_ef_search`, `device`, ... for dense); a build-time field raises `ValueError` naming it.
    """
    path = Path(path)
    manifest = read_manifest(path)
    check_load_options(path, manifest, overrides)
    if corpus is not None:
        actual = file_checksum(corpus)
        if actual != manifest.corpus_sha256:
            raise IndexLoadError(
                f"index {path} was built from a corpus with sha256 {manifest.corpus_sha256[:12]}…, but {corpus} has "
                f"{actual[:12]}…; rebuild with `rlloom-retrieval build-index --corpus {corpus} --out {path}`"
            )
    store = DocStore(path)
    if len(store) != manifest.doc_count:
        raise IndexLoadError(f"{path}: passage store holds {len(store)} docs, manifest says {manifest.doc_count}")
    try:
        config = backend_config(manifest.backend, {**manifest.params, **overrides})
    except ValueError as err:
        if manifest.backend == "dense" and "model" not in overrides:  # the model folder moved since the build
            raise IndexLoadError(
                f"{path}: {err}. If the model now lives elsewhere, pass its folder: load_index(path, model=...) or "
                "`--opt model=/new/folder` (the index checks it is the same encoder)"
            ) from None
        raise
    try:
        backend = _load_backend(manifest.backend, config, path, store)
    except IndexLoadError:
        raise
    except EncoderMismatchError as err:
        raise IndexLoadError(f"{path}: {err}") from None
    except (OSError, ValueError, KeyError) as err:
        raise IndexLoadError(
            f"{path}: {manifest.backend} index files are unreadable ({err}); rebuild the index"
        ) from None
    if backend.doc_count != manifest.doc_count:
        raise IndexLoadError(
            f"{path}: the {manifest.backend} index covers {backend.doc_count} docs, the manifest says "
            f"{manifest.doc_count}; rebuild the index"
        )
    return IndexRetriever(path, manifest, store, backend)
