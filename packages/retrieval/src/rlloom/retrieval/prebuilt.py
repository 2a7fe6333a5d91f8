"""Adopt Search-R1's prebuilt wiki-18 indexes as index folders, without re-encoding or re-indexing.

- `import_faiss_index`: a faiss index whose row i embeds line i of the corpus (Search-R1's `e5_Flat.index`,
  64.5 GB of fp32 for wiki-18's 21M passages, or its `e5_HNSW64.index`). The file is memory-mapped
  (`faiss.IO_FLAG_MMAP_IFC`), not read into RAM: its vectors are copied chunk by chunk into the fp16 embeddings
  file a dense index keeps, so the import holds one chunk (`_CHUNK` vectors) in memory, not the index. With a
  compressed `index_type` (`sq8`, `ivfpq`, `hnsw`) the import also measures that index's recall@1/3/10 against
  exact (Flat) search and writes it to `dense/import_report.json`. The encoder settings must be the ones the
  vectors were made with (the `e5` preset for Search-R1's); `load_index` checks that the model folder re-embeds
  the first passage to the stored vector, so a wrong model, prefix or pooling is refused at load.
- `import_lucene_index`: a pyserini/Anserini Lucene index of the corpus (Search-R1's `wiki-18-bm25-index`,
  built with `JsonCollection`), hard-linked (or copied across filesystems) into the folder; Lucene doc ids are
  mapped to passage rows (directly when the corpus ids are the row numbers, as in wiki-18; else through a
  sorted hash table stored beside it). Needs the `lucene` extra.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tqdm.auto import tqdm

from rlloom.retrieval.corpus import check_corpus_file, file_checksum, read_corpus
from rlloom.retrieval.docstore import DocStore, write_docstore
from rlloom.retrieval.manifest import Manifest, atomic_folder, check_output_folder, package_versions, write_manifest

_CHUNK = 65_536  # vectors per read: 200 MB of fp32 at e5's 768 dimensions
RECALL_KS = (1, 3, 10)
REPORT = "import_report.json"


def import_faiss_index(
    corpus: str | Path,
    faiss_file: str | Path,
    out_dir: str | Path,
    *,
    preset: str | None = "e5",
    recall_probes: int = 200,
    **options: Any,
) -> Path:
    """Make a dense index folder at `out_dir` from `corpus` (row i = faiss vector i) and a faiss index file.

    `options` are `DenseConfig` fields (`model` is required: the encoder that made the vectors, for queries);
    `preset` fills in the rest (default `e5`, Search-R1's settings). Any faiss index that can reconstruct its
    vectors works (Flat, HNSW-Flat); it is memory-mapped, not read whole. The folder's own faiss index kind is
    `index_type` (default flat); for another kind, `recall_probes` stored vectors are searched in it and exactly,
    and recall@1/3/10 is written to `dense/import_report.json` (`import_report(out_dir)`; 0 probes: skipped).
    """
    from rlloom.retrieval.dense import DENSE_DIR, DenseConfig
    from rlloom.retrieval.index import backend_config
    from rlloom.retrieval.presets import apply_preset

    try:  # the import copies vectors: faiss only, no encoder (and so no torch) until the index is loaded
        import faiss
    except ImportError:
        raise ImportError(
            "import-faiss needs the `dense` extra (faiss-cpu): pip install 'rlloom-retrieval[dense]'"
        ) from None

    corpus, faiss_file, out_dir = Path(corpus), Path(faiss_file), Path(out_dir)
    check_corpus_file(corpus)
    check_output_folder(out_dir)
    if not faiss_file.is_file():
        raise ValueError(f"--faiss {faiss_file} is not a file; give the faiss index, e.g. Search-R1's e5_Flat.index")
    backend, options = apply_preset(preset, "dense", options) if preset else ("dense", options)
    config = backend_config(backend, {"cache_dir": None, **options})
    assert isinstance(config, DenseConfig)
    index = read_faiss_mapped(faiss_file)
    with atomic_folder(out_dir) as tmp:
        count = write_docstore(tmp, read_corpus(corpus), source=str(corpus))
        if count != index.ntotal:
            raise ValueError(
                f"{corpus} holds {count} passages but {faiss_file} holds {index.ntotal} vectors; they must be the "
                "same corpus, line i embedded as vector i"
            )
        target = tmp / DENSE_DIR
        target.mkdir()
        _copy_vectors(index, target / "embeddings.f16.npy", config.normalize)
        del index  # unmaps the source file
        if config.index_type != "flat":  # flat is rebuilt from the fp16 file at load, like a built index
            from rlloom.retrieval.dense import build_faiss

            stored = np.load(target / "embeddings.f16.npy", mmap_mode="r")
            compressed = build_faiss(stored, config)
            faiss.write_index(compressed, str(target / "faiss.index"))
            if config.index_type == "hnsw":  # search as the served index will (DenseBackend sets the same)
                compressed.hnsw.efSearch = config.hnsw_ef_search
            elif config.index_type == "ivfpq":
                compressed.nprobe = config.ivf_nprobe
            if recall_probes > 0:
                report = {
                    "index_type": config.index_type,
                    "probes": min(recall_probes, count),
                    "probe_kind": "stored passage vectors, each probe's own passage left out of both rankings",
                    **recall_against_flat(stored, compressed, recall_probes),
                }
                (target / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
            del compressed
        write_manifest(
            tmp,
            Manifest(
                backend="dense",
                params=config.model_dump(mode="json"),
                corpus_path=str(corpus.resolve()),
                corpus_sha256=file_checksum(corpus),
                doc_count=count,
                versions=package_versions("faiss-cpu", "faiss-gpu-cu12", "sentence-transformers", "numpy"),
            ),
        )
    return out_dir


def _copy_vectors(index: Any, out: Path, normalize: bool) -> None:
    """The index's vectors, chunk by chunk, into an fp16 .npy (L2-normalised again when the config says so)."""
    n, dim = int(index.ntotal), int(index.d)
    tmp = out.with_name(out.name + ".partial")
    store = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(n, dim))
    with tqdm(total=n, desc="import: copying vectors", unit="vec", disable=n < 1_000_000) as bar:
        for lo in range(0, n, _CHUNK):
            vectors = index.reconstruct_n(lo, min(_CHUNK, n - lo)).astype(np.float32, copy=False)
            if normalize:
                vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            store[lo : lo + len(vectors)] = vectors.astype(np.float16)
            bar.update(len(vectors))
    store.flush()
    del store
    os.replace(tmp, out)


def read_faiss_mapped(faiss_file: Path) -> Any:
    """Open a faiss index with its vectors memory-mapped (`IO_FLAG_MMAP_IFC`, faiss >= 1.8): pages are read from
    the file as they are touched and stay reclaimable page cache, so a 64 GB Flat index needs no 64 GB of RAM.
    Index kinds that cannot be mapped are read whole."""
    import faiss

    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    first: RuntimeError | None = None
    for flags in ([flag] if flag is not None else []) + [0]:
        try:
            return faiss.read_index(str(faiss_file), flags)
        except RuntimeError as err:
            first = first or err
    assert first is not None
    raise ValueError(f"--faiss {faiss_file} is not a faiss index ({str(first).splitlines()[0]})") from None


def import_report(index_dir: str | Path) -> dict[str, Any] | None:
    """The recall report an import wrote (`dense/import_report.json`), or None."""
    from rlloom.retrieval.dense import DENSE_DIR

    path = Path(index_dir) / DENSE_DIR / REPORT
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def recall_against_flat(
    vectors: NDArray[np.float16], index: Any, probes: int, ks: tuple[int, ...] = RECALL_KS, chunk: int = _CHUNK
) -> dict[str, float]:
    """recall@k of `index` against exact inner-product search over `vectors`, for `probes` sampled stored vectors
    as queries (each probe's own row left out of both rankings, since both find it first).

    The exact search streams over `vectors` in chunks, so it holds `chunk` rows, not the corpus.
    """
    n = int(vectors.shape[0])
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(probes, n), replace=False))
    queries = np.ascontiguousarray(vectors[rows], dtype=np.float32)
    depth = min(max(ks) + 1, n)
    best_scores = np.full((len(rows), depth), -np.inf, dtype=np.float32)
    best_rows = np.full((len(rows), depth), -1, dtype=np.int64)
    for lo in range(0, n, chunk):
        block = np.asarray(vectors[lo : lo + chunk], dtype=np.float32)
        scores = queries @ block.T
        ids = np.broadcast_to(np.arange(lo, lo + len(block)), scores.shape)
        merged_scores = np.concatenate([best_scores, scores], axis=1)
        merged_rows = np.concatenate([best_rows, ids], axis=1)
        keep = np.argsort(-merged_scores, axis=1, kind="stable")[:, :depth]
        best_scores = np.take_along_axis(merged_scores, keep, axis=1)
        best_rows = np.take_along_axis(merged_rows, keep, axis=1)
    _, found = index.search(queries, depth)
    out = {}
    for k in ks:
        if k + 1 > depth:
            continue
        total = 0.0
        for q, row in enumerate(rows.tolist()):
            exact = [r for r in best_rows[q].tolist() if r != row][:k]
            approx = set([r for r in found[q].tolist() if r != row and r >= 0][:k])
            total += len(approx.intersection(exact)) / max(len(exact), 1)
        out[f"recall@{k}"] = round(total / len(rows), 4)
    return out


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link a file (Lucene segment files are written once, so sharing them is safe), else copy it."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def import_lucene_index(corpus: str | Path, lucene_dir: str | Path, out_dir: str | Path, **options: Any) -> Path:
    """Make a lucene index folder at `out_dir` from `corpus` and a pyserini/Anserini Lucene index of it.

    `options` are `LuceneConfig` query-time fields (`k1`, `b`, `threads`; Anserini's defaults). The Lucene
    index's files are hard-linked into the folder (copied when on another filesystem); its doc ids must be the
    corpus's passage ids (`id` / `_id`), as `JsonCollection` indexes them.
    """
    from rlloom.retrieval.index import backend_config
    from rlloom.retrieval.lucene import LUCENE_DIR, LuceneConfig, _import_pyserini, write_id_lookup

    corpus, lucene_dir, out_dir = Path(corpus), Path(lucene_dir), Path(out_dir)
    check_corpus_file(corpus)
    check_output_folder(out_dir)
    if not (lucene_dir.is_dir() and any(lucene_dir.glob("segments_*"))):
        raise ValueError(
            f"--lucene {lucene_dir} is not a Lucene index folder (no segments_* file); give the folder that "
            "pyserini.index.lucene wrote, e.g. Search-R1's wiki-18-bm25-index/bm25"
        )
    _, searcher_cls = _import_pyserini()
    searcher = searcher_cls(str(lucene_dir))
    lucene_docs = int(searcher.num_docs)
    probe_ids = [searcher.doc(i).docid() for i in np.linspace(0, max(lucene_docs - 1, 0), min(lucene_docs, 50))
                 .astype(int).tolist()] if lucene_docs else []  # fmt: skip
    searcher.close()
    with atomic_folder(out_dir) as tmp:
        count = write_docstore(tmp, read_corpus(corpus), source=str(corpus))
        if count != lucene_docs:
            raise ValueError(
                f"{corpus} holds {count} passages but the Lucene index {lucene_dir} holds {lucene_docs} documents; "
                "they must index the same corpus"
            )
        store = DocStore(tmp)
        docids = "row" if all(store.doc_id(i) == str(i) for i in range(count)) else "corpus-id"
        config = backend_config("lucene", {**options, "docids": docids})
        assert isinstance(config, LuceneConfig)
        if docids == "corpus-id":
            lookup = write_id_lookup(tmp, store)
            missing = [d for d in probe_ids if lookup.row(d) is None]
        else:
            missing = [d for d in probe_ids if not (d.isdigit() and int(d) < count and store.doc_id(int(d)) == d)]
        if missing:
            raise ValueError(
                f"the Lucene index {lucene_dir} holds doc ids that are not passage ids of {corpus} (e.g. "
                f"{', '.join(map(repr, missing[:3]))}); import it with the corpus it was built from"
            )
        del store
        shutil.copytree(lucene_dir, tmp / LUCENE_DIR, copy_function=_link_or_copy)
        write_manifest(
            tmp,
            Manifest(
                backend="lucene",
                params=config.model_dump(mode="json"),
                corpus_path=str(corpus.resolve()),
                corpus_sha256=file_checksum(corpus),
                doc_count=count,
                versions=package_versions("pyserini"),
            ),
        )
    return out_dir
