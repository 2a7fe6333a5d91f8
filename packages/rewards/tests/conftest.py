"""Shared fixtures: a real HTTP server (uvicorn in a thread) for the clients that talk to one, and the count of
sandboxed processes that the code-execution tests check after each run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn


@contextmanager
def _served(app: Any) -> Iterator[str]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def serve_app() -> Callable[[Any], AbstractContextManager[str]]:
    """`with serve_app(app) as url:` serves an ASGI app on a free local port until the block ends."""
    return _served


SANDBOX_UIDS = 1_000_000  # the code runner draws each run's uids at or above this


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(name, parent pid, uid) of a live process, None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return fields["Name"].strip(), int(fields["PPid"]), int(fields["Uid"].split()[0])


def _holder(info: tuple[str, int, int]) -> int | None:
    """The scoring process whose run holds a sandboxed process: the parent of its first ancestor outside the
    sandbox when that ancestor is the runner's `unshare`; None when nothing holds it (or it is gone)."""
    ancestor: tuple[str, int, int] | None = info
    while ancestor is not None and ancestor[2] >= SANDBOX_UIDS:
        ancestor = _stat(ancestor[1])
    return ancestor[1] if ancestor is not None and ancestor[0] == "unshare" else None


def _sandbox_processes(*, held_by: int | None = None, anywhere: bool = False) -> list[str]:
    """Processes under a sandbox uid that no other live scoring process holds: what this test process's own runs
    left (they are all over when a test asks), and orphans. Runs of other scoring processes on the machine (the
    other pytest-xdist worker's) are left out. With `held_by`, only the runs that process holds; with `anywhere`,
    every one on the machine (for a file that runs alone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        info = _stat(int(entry.name))
        if info is None or info[2] < SANDBOX_UIDS:
            continue
        if not anywhere:
            holder = _holder(info)
            if holder != held_by if held_by is not None else holder not in (None, 1, os.getpid()):
                continue  # another scoring process's live run
        found.append(f"{entry.name}: {info[0]}")
    return found


@pytest.fixture(scope="session")
def sandbox_processes() -> Callable[..., list[str]]:
    """`sandbox_processes()` lists sandboxed processes left by this test process's runs or orphaned (see
    `_sandbox_processes`); `sandbox_processes(held_by=pid)` those of a scoring subprocess's live runs;
    `sandbox_processes(anywhere=True)` every one on the machine."""
    return _sandbox_processes
