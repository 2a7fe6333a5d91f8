"""The index manifest (what was built, from what, with which versions) and atomic index-folder replacement.

Every index folder carries `manifest.json`. Loading checks it before touching any array so that a folder from
another backend, a newer format, a half-written build or a different corpus fails with a message, not a crash
deep inside numpy or faiss.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from rlloom.retrieval.__about__ import __version__
from rlloom.retrieval.types import IndexLoadError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class Manifest(BaseModel):
    """Written last by a build; its presence marks the folder as complete."""

    format_version: int = Field(default=FORMAT_VERSION, description="Layout version; bumped when files change meaning.")
    backend: str = Field(description="bm25, dense, lucene or hybrid.")
    params: dict[str, Any] = Field(description="The backend's validated build config, as JSON.")
    corpus_path: str = Field(description="Corpus file the index was built from (informational).")
    corpus_sha256: str = Field(description="sha256 of the corpus file's bytes.")
    doc_count: int = Field(ge=0, description="Passages in the index.")
    versions: dict[str, str] = Field(description="Versions of rlloom-retrieval and the libraries that wrote files.")
    files: dict[str, int] = Field(default_factory=dict, description="Relative path -> size in bytes, checked on load.")
    created_unix: float = Field(default_factory=time.time)


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions of rlloom-retrieval and the named distributions (missing ones are left out)."""
    found = {"rlloom-retrieval": __version__}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def file_sizes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(folder: Path, manifest: Manifest) -> None:
    manifest.files = file_sizes(folder)
    (folder / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")


def read_manifest(folder: str | Path, expect_backend: str | None = None) -> Manifest:
    """Read and check a manifest: present, parseable, a known format, and every listed file at its recorded size."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise IndexLoadError(f"index folder {folder} does not exist; build it with `rlloom-retrieval build-index`")
    if not path.is_file():
        raise IndexLoadError(
            f"{folder} has no {MANIFEST}: it is not an rlloom index or its build did not finish; rebuild it"
        )
    try:
        manifest = Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, ValidationError) as err:
        raise IndexLoadError(f"{path} is corrupt ({err}); rebuild the index") from None
    if manifest.format_version != FORMAT_VERSION:
        raise IndexLoadError(
            f"{path} has format_version {manifest.format_version}, this rlloom-retrieval reads {FORMAT_VERSION}; "
            "rebuild the index with this version"
        )
    if expect_backend is not None and manifest.backend != expect_backend:
        raise IndexLoadError(f"{folder} holds a {manifest.backend!r} index, not {expect_backend!r}")
    for rel, size in manifest.files.items():
        target = folder / rel
        if not target.is_file():
            raise IndexLoadError(f"index file {target} is missing; rebuild the index")
        if target.stat().st_size != size:
            raise IndexLoadError(
                f"index file {target} is {target.stat().st_size} bytes, the manifest says {size}: it was modified "
                "or truncated; rebuild the index"
            )
    return manifest


def check_output_folder(out_dir: Path, name: str = "out_dir") -> None:
    """Refuse to build into anything but a new path, an empty folder or an existing rlloom index.

    A build replaces the whole folder, so pointing it at a folder of other files would delete them; `name` is
    how the caller knows the path (`out_dir` in Python, `--out` on the command line).
    """
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir():
        raise FileExistsError(f"{name} {out_dir} is an existing file, not an index folder; pass a new folder as {name}")
    if (out_dir / MANIFEST).is_file() or not any(out_dir.iterdir()):
        return
    raise FileExistsError(
        f"{name} {out_dir} is a folder that holds other files and no rlloom index ({MANIFEST}); building there "
        f"would replace the folder and delete them. Pass a new or empty folder as {name}, e.g. {out_dir / 'index'}"
    )


@contextlib.contextmanager
def atomic_folder(out_dir: Path, name: str = "out_dir") -> Iterator[Path]:
    """Yield a fresh temporary folder next to `out_dir`; on success swap it into place, on error delete it.

    `out_dir` may be new, an empty folder or an existing rlloom index (`check_output_folder`), checked before
    and again just before the swap. The old index stays untouched until the new one is complete; the swap is two
    renames on one filesystem, so a crash at any point leaves either the old or the new index (in the short
    window between the renames, the old one sits at `<out_dir>.old-<id>`).
    """
    check_output_folder(out_dir, name)
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{token}")
    tmp.mkdir()
    try:
        yield tmp
        check_output_folder(out_dir, name)  # files may have appeared there during a long build
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out_dir.with_name(f".{out_dir.name}.old-{token}")
    if out_dir.exists():
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)
