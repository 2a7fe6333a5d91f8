"""Adopt a prebuilt faiss index (Search-R1's wiki-18 `e5_Flat.index`) as a dense index folder, without re-encoding.

Encoding wiki-18's 21M passages with e5 takes GPU-hours; Search-R1 publishes the vectors as a faiss `IndexFlatIP`
whose row i embeds line i of `wiki-18.jsonl`. `import_faiss_index` reads them back in chunks into the fp16
embeddings file a dense index keeps, stores the corpus beside them and writes the manifest, so `load_index` and
`rlloom-retrieval serve` use it like one built here. The encoder settings must be the ones the vectors were made
with (the `e5` preset for Search-R1's); `load_index` checks that the model folder re-embeds the first passage to
the stored vector, so a wrong model, prefix or pooling is refused at load rather than served.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from rlloom.retrieval.corpus import check_corpus_file, file_checksum, read_corpus
from rlloom.retrieval.docstore import write_docstore
from rlloom.retrieval.manifest import Manifest, atomic_folder, check_output_folder, package_versions, write_manifest

_CHUNK = 65_536  # vectors per read: 200 MB of fp32 at e5's 768 dimensions


def import_faiss_index(
    corpus: str | Path, faiss_file: str | Path, out_dir: str | Path, *, preset: str | None = "e5", **options: Any
) -> Path:
    """Make a dense index folder at `out_dir` from `corpus` (row i = faiss vector i) and a faiss index file.

    `options` are `DenseConfig` fields (`model` is required: the encoder that made the vectors, for queries);
    `preset` fills in the rest (default `e5`, Search-R1's settings). Any faiss index that can reconstruct its
    vectors works (Flat, HNSW-Flat); the folder's own faiss index kind is `index_type` (default flat).
    """
    from rlloom.retrieval.dense import DENSE_DIR, DenseConfig, _require_dense
    from rlloom.retrieval.index import backend_config
    from rlloom.retrieval.presets import apply_preset

    _require_dense()
    import faiss

    corpus, faiss_file, out_dir = Path(corpus), Path(faiss_file), Path(out_dir)
    check_corpus_file(corpus)
    check_output_folder(out_dir)
    if not faiss_file.is_file():
        raise ValueError(f"--faiss {faiss_file} is not a file; give the faiss index, e.g. Search-R1's e5_Flat.index")
    backend, options = apply_preset(preset, "dense", options) if preset else ("dense", options)
    config = backend_config(backend, {"cache_dir": None, **options})
    assert isinstance(config, DenseConfig)
    try:
        index = faiss.read_index(str(faiss_file))
    except RuntimeError as err:
        raise ValueError(f"--faiss {faiss_file} is not a faiss index ({str(err).splitlines()[0]})") from None
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
        if config.index_type != "flat":  # flat is rebuilt from the fp16 file at load, like a built index
            from rlloom.retrieval.dense import build_faiss

            faiss.write_index(
                build_faiss(np.load(target / "embeddings.f16.npy", mmap_mode="r"), config), str(target / "faiss.index")
            )
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
