"""Test-run plumbing for every session: the order in which pytest-xdist hands whole test files to its workers.

pytest finds this file above every test folder (the sessions pass `--rootdir` at the repository root). It changes
no test, only which worker runs which file when: with `--dist loadfile` (a file's tests stay on one worker, so a
module's engine or model starts once), xdist queues files by their number of tests and gives each worker two at
the start. Our slowest files hold one to six tests of a minute or more each (ranks, Ray nodes, vLLM engines), so
they came last and one worker ran them alone at the end. Here files go longest first, by the seconds CI measured
(.ci/test_durations.json, refreshed with `python3 .ci/test_durations.py`), and a worker gets its next file when it
starts its current file's last test, so no long file waits behind another on a busy worker.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).parent / ".ci" / "test_durations.json"
UNKNOWN_TEST_SECONDS = 0.5  # a file CI has not timed yet counts this much per test
XDIST_ORDER_ENV = "RLLOOM_XDIST_ORDER"
"""`xdist`: keep xdist's own file order. isolated-core-rl sets it: its longest files all start rank processes or
Ray nodes, and run side by side they slowed each other (idle fresh-clone CI: 418 s of tests against 313 s in
xdist's order, which pairs them with short files; test_distributed.py alone 318 s against 240 s)."""


def _file_seconds() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile" or os.environ.get(XDIST_ORDER_ENV) == "xdist":
        return None  # xdist's own schedulers for every other mode, and where a session asks for xdist's order
    from xdist.scheduler import LoadFileScheduling

    seconds = _file_seconds()

    class LongestFileFirst(LoadFileScheduling):  # type: ignore[misc]
        """xdist's file scheduling with two changes: the next file is the longest left, and a worker's next file
        is sent when one test of its current files remains (the worker holds its last test back until it knows
        what runs after it, so sending earlier only ties a file to a worker that is still busy)."""

        def _expected(self, scope: str) -> float:
            path = scope.split("::", 1)[0]
            return seconds.get(path, UNKNOWN_TEST_SECONDS * len(self.workqueue[scope]))

        def _assign_work_unit(self, node: Any) -> None:
            longest = max(self.workqueue, key=self._expected)
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node: Any) -> None:
            if self.workqueue and not node.shutting_down and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return LongestFileFirst(config, log)
