"""The inside of a batch-scoring worker process: receive items over a socket, score them, reply.

Started by `rlloom.rewards.batch.ScoringPool` as `python -c` with its socket's file descriptor and memory cap on
the command line. It caps its own address space, ignores Ctrl-C (the parent's to handle), and ends itself and its
process group if the parent dies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from rlloom.rewards.items import ScoreItem, error_result, score_item
from rlloom.rewards.registry import ScorerLoadError, get_scorer, is_loaded
from rlloom.rewards.types import ScoreResult

LOADED = "loaded"  # notice sent once a new scorer is imported, so the item's own deadline starts after it


def _limit_memory(limit_mb: int | None) -> None:
    if not limit_mb:
        return
    try:
        import resource

        limit = limit_mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass  # not POSIX: the timeout remains the bound


def wire(result: ScoreResult) -> tuple[float, dict[str, float], str | None, str | None, dict[str, Any]]:
    return (result.score, result.components, result.extracted, result.error, result.details)


def _die_with_parent(parent: int) -> None:
    """If the scoring process dies (even by SIGKILL), end this worker and whatever its scorer started, even
    when the scorer is stuck and never reads the socket's EOF."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)


def serve(conn: Connection, memory_limit_mb: int | None) -> None:
    """Worker loop: receive (index, spec, response, ground_truth, extra_info), reply (index, result, exiting)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _limit_memory(memory_limit_mb)
    threading.Thread(target=_die_with_parent, args=(os.getppid(),), daemon=True).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, spec, response, ground_truth, extra_info = message
        exiting = False
        try:
            if not is_loaded(spec):
                with contextlib.suppress(ScorerLoadError):  # reported by score_item below
                    get_scorer(spec)
                conn.send((LOADED, index, False))  # the item's own deadline starts now, import time excluded
            item = ScoreItem.model_construct(
                response=response, ground_truth=ground_truth, scorer=spec, data_source=None, extra_info=extra_info
            )
            result = score_item(item)
        except MemoryError:
            result, exiting = (
                error_result("memory", f"scorer exceeded the worker memory cap ({memory_limit_mb} MiB)"),
                True,
            )
        except BaseException as exc:
            result = error_result("exception", f"{type(exc).__name__}: {exc}"[:2000])
        try:  # plain tuples: unpickling a pydantic model costs ~50 us, more than a QA scorer's work
            conn.send((index, wire(result), exiting))
        except Exception as exc:  # an unpicklable detail: report it rather than lose the item
            conn.send((index, wire(error_result("exception", f"result not transferable: {exc}")), exiting))
        if exiting:
            return


def main() -> None:
    """Entry point of a worker subprocess: argv = [fd of its socket end, memory cap in MiB (0 = none)]."""
    fd, limit = int(sys.argv[1]), int(sys.argv[2])
    serve(Connection(fd), limit or None)
