"""When the engine's weights may change while groups are being generated.

An `InflightWeightUpdate` engine pauses its requests at a token boundary, takes the weights, and resumes them under
the new version. Any other engine must not be generating while its tensors are overwritten: generation holds the
`UpdateGate` for reading (a whole request, or with `partial_rollout=reprefill` one chunk) and the push holds it for
writing, so the push waits only for what is in progress, and new requests or chunks wait for the push.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from rlloom.core_rl.contracts.engines import InflightWeightUpdate, RolloutEngine


class UpdateGate:
    """A readers-writer lock that prefers the writer (a waiting push blocks new readers)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writing or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def push_guard(
    engine: RolloutEngine, gate: UpdateGate, version: Callable[[], int], on_pushed: Callable[[], None]
) -> Callable[[], AbstractContextManager[None]]:
    """What surrounds a weight push in async mode: pause/resume(version) on an `InflightWeightUpdate` engine,
    else the gate's write side. `version()` is the version being pushed; `on_pushed` wakes the generator. A push
    that fails names the step and stops the run."""

    @contextmanager
    def guard() -> Iterator[None]:
        step = version()
        try:
            if isinstance(engine, InflightWeightUpdate):
                engine.pause_generation()
                try:
                    yield
                finally:  # after a failed push too: the paused requests must end for the run to stop
                    engine.resume_generation(step)
            else:
                with gate.writing():
                    yield
        except Exception as exc:
            raise RuntimeError(f"weight sync of step {step} to the rollout engine failed: {exc}") from exc
        on_pushed()

    return guard


__all__ = ["UpdateGate", "push_guard"]
