"""Batch scoring survives scorers that hang, crash, segfault, exhaust memory or raise; order and time hold.

The misbehaving scorers are defined in this file and loaded by the workers as "path/to/this_file.py:name",
exactly as a user's custom scorer file would be.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rlloom.rewards.batch import ScoreItem, ScoringPool, as_item, ascore_batch, score_batch
from rlloom.rewards.types import ScoreResult

HERE = os.path.abspath(__file__)


def echo_length(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    """A well-behaved scorer whose result identifies its item: len(response) / 100."""
    return len(response) / 100


def slow(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    time.sleep(2.0)
    return 1.0


def hang(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    time.sleep(3600)
    return 1.0


def spin(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    while True:  # pure-Python busy loop: no signal-based timeout would help a thread here
        pass


def exit_hard(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    os._exit(3)


def segfault(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV
    return 1.0


def hog_memory(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    chunks = []
    while True:  # 2 GiB steps: hits the 1 GiB cap at once instead of spending seconds zero-filling pages
        chunks.append(bytearray(2 * 1024**3))


def raise_error(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    raise ValueError("bad ground truth format")


def verl_dict(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"score": 0.5, "acc": True, "pred": response}


async def async_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> float:
    await asyncio.sleep(0)
    return 0.25


def spec(name: str) -> str:
    return f"{HERE}:{name}"


@pytest.fixture(scope="module")
def pool() -> Any:
    with ScoringPool(2, timeout=2.0, memory_limit_mb=1024) as p:
        yield p


def test_misbehaving_scorers_get_zero_and_an_error_in_order(pool: ScoringPool) -> None:
    names = ["echo_length", "hang", "echo_length", "exit_hard", "segfault", "echo_length", "hog_memory",
             "raise_error", "spin", "echo_length"]  # fmt: skip
    items = [ScoreItem(response="x" * i, scorer=spec(n)) for i, n in enumerate(names)]
    start = time.monotonic()
    with ScoringPool(1) as fresh:  # what one worker start + scorer import costs on this (maybe busy) machine
        fresh.score([("x", None, spec("echo_length"))])
    spawn_cost = time.monotonic() - start
    start = time.monotonic()
    results = pool.score(items)
    elapsed = time.monotonic() - start
    kinds = [r.details.get("error_kind") for r in results]
    assert kinds == [None, "timeout", None, "crash", "crash", None, "memory", "exception", "timeout", None]
    for i, (name, result) in enumerate(zip(names, results, strict=True)):
        if name == "echo_length":
            assert result.score == pytest.approx(i / 100) and result.error is None
        else:
            assert result.score == 0.0 and result.error
    assert "SIGSEGV" in (results[4].error or "")
    assert "exit code 3" in (results[3].error or "")
    assert "ValueError: bad ground truth format" in (results[7].error or "")
    # bounded by the two 2 s timeouts plus the worker restarts (each a fresh interpreter), never by the hang
    assert pool.respawns >= 5
    assert elapsed < 2 * 2.0 + pool.respawns * spawn_cost + 5.0, (elapsed, spawn_cost)


def test_pool_still_works_after_failures(pool: ScoringPool) -> None:
    pool.score([(("y"), None, spec("segfault"))])
    results = pool.score([("z" * k, None, spec("echo_length")) for k in range(20)])
    assert [r.score for r in results] == pytest.approx([k / 100 for k in range(20)])


def test_scorer_return_shapes_and_async(pool: ScoringPool) -> None:
    dict_result, async_result = pool.score([("ab", None, spec("verl_dict")), ("ab", None, spec("async_scorer"))])
    assert dict_result.score == 0.5 and dict_result.components == {"acc": 1.0} and dict_result.details == {"pred": "ab"}
    assert async_result.score == 0.25


def test_registry_routing_and_load_errors(pool: ScoringPool) -> None:
    results = pool.score(
        [
            {"response": "<answer>Paris</answer>", "ground_truth": {"target": ["Paris"]}, "data_source": "nq"},
            {"response": "x", "data_source": "no_such_dataset"},
            {"response": "x", "scorer": "rlloom.rewards.qa:no_such_function"},
            {"response": "x", "scorer": "/no/such/file.py:fn"},
        ]
    )
    assert results[0].score == 1.0
    assert results[1].details["error_kind"] == "load" and "unknown data_source 'no_such_dataset'" in (
        results[1].error or ""
    )
    assert "no function 'no_such_function'" in (results[2].error or "")
    assert "does not exist" in (results[3].error or "")


def test_item_validation_names_the_index() -> None:
    with pytest.raises(ValueError, match=r"items\[1\]"):
        score_batch([("a", "b", "nq"), {"response": "x"}], workers=0)
    with pytest.raises(TypeError, match=r"items\[0\] is a tuple of 1 element\(s\); a tuple item is \(response, "):
        score_batch([("x",)], workers=0)
    with pytest.raises(TypeError, match=r"items\[2\] is a list of 5 element\(s\)"):
        score_batch([("a", "b", "nq"), ("a", "b", "nq"), ["a", "b", "nq", {}, 1]], workers=0)
    with pytest.raises(TypeError, match=r"items\[0\] is a int"):
        as_item(5, 0)  # type: ignore[arg-type]
    assert as_item(("r", "g", "pkg.mod:fn"), 0).scorer == "pkg.mod:fn"
    assert as_item((b"caf\xe9", "g", "nq"), 0).response == "caf\ufffd"  # non-UTF-8 bytes decoded, not rejected


def test_in_process_mode_and_asyncio_entry_point() -> None:
    items = [("<answer>Paris</answer>", ["paris"]), ("<answer>Rome</answer>", ["paris"])]
    inline = score_batch(items, workers=0, scorer="qa_em")
    assert [r.score for r in inline] == [1.0, 0.0]
    errors = score_batch([("x", None, spec("raise_error"))], workers=0)
    assert errors[0].details["error_kind"] == "exception"

    async def main() -> list[ScoreResult]:
        return await ascore_batch(items, workers=1, timeout=10, scorer="qa_em")

    assert [r.score for r in asyncio.run(main())] == [1.0, 0.0]


def test_items_queued_behind_a_hang_or_crash_are_still_scored() -> None:
    # one worker, so items wait in its queue behind the hanging and the crashing ones; a 1 MB response too
    names = ["echo_length", "echo_length", "hang", "echo_length", "echo_length", "segfault", "echo_length"]
    items = [ScoreItem(response="x" * i, scorer=spec(n)) for i, n in enumerate(names)]
    items.append(ScoreItem(response="y" * 1_000_000, scorer=spec("echo_length")))
    with ScoringPool(1, timeout=1.5) as one:
        results = one.score(items)
    assert [r.details.get("error_kind") for r in results] == [None, None, "timeout", None, None, "crash", None, None]
    assert [r.score for r in results] == pytest.approx([0.0, 0.01, 0.0, 0.03, 0.04, 0.0, 0.06, 10_000.0])


def test_workers_die_with_the_scoring_process(tmp_path: Any) -> None:
    """A parent killed by SIGKILL while its worker hangs must not leave the worker running."""
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "worker.pid"
    script = (
        "import os, sys; from rlloom.rewards.batch import ScoringPool\n"
        "pool = ScoringPool(1, timeout=600)\n"
        "pool._ensure_started()\n"
        f"open({str(pid_file)!r}, 'w').write(str(pool._workers[0].process.pid))\n"
        f"pool.score([('x', None, {spec('hang')!r})])\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    time.sleep(1.0)  # let the hang start
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        try:
            state = Path(f"/proc/{worker}/stat").read_text().split()[2]
        except FileNotFoundError:
            return
        if state == "Z":
            return  # exited; a zombie until its (dead) parent's reaper collects it
        time.sleep(0.2)
    pytest.fail(f"worker {worker} outlived its killed parent")


def test_an_item_that_declares_a_time_budget_gets_it_from_the_pool() -> None:
    """The pool's deadline follows the items' own `time_budget` (code tests' per-case limits add up to it), so a
    slow program becomes failed tests inside the scorer, not a scorer timeout (issue 28)."""
    with ScoringPool(1, timeout=0.5) as pool:
        rushed, budgeted = pool.score(
            [
                {"response": "x", "scorer": f"{HERE}:slow"},
                {"response": "x", "scorer": f"{HERE}:slow", "extra_info": {"time_budget": 3}},
            ]
        )
    assert rushed.error is not None and "timed out" in rushed.error
    assert budgeted.error is None and budgeted.score == 1.0
