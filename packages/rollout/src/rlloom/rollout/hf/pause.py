"""`PauseGate`: the token-boundary pause behind `HFEngine`'s in-flight weight updates (core-rl's
`InflightWeightUpdate`), and the policy version every sampled token is labelled with.

A decode registers while it runs (`decoding()`) and calls `checkpoint()` between two steps, after a token was
sampled and before it is fed to the model. `pause()` returns once every running decode is parked there (or none
runs), so the trainer may then change the weights: the tokens sampled so far came from the old ones, and the next
forward (the first after `resume`) uses the new ones, with the keys/values computed so far kept or recomputed
(`HFEngineConfig.inflight_kv`). A decode that starts during the pause waits in `decoding()`, so requests
submitted then wait too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class PauseGate:
    """Parks decodes at token boundaries while paused; `version` labels the tokens sampled now."""

    def __init__(self, version: int = 0) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._stepping = 0  # decodes running between two checkpoints (not parked)
        self.version = version
        self.pauses = 0  # pauses so far (a test or a metric can tell an update happened in flight)
        self.changes = 0  # resumes that followed a weight change (a pause without one re-prefills nothing)

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        """Stop every running decode at its next token boundary; returns once they all stopped."""
        with self._cond:
            self._paused = True
            self.pauses += 1
            self._cond.wait_for(lambda: self._stepping == 0)

    def resume(self, version: int, *, weights_changed: bool = True) -> None:
        """Let parked and waiting decodes go on, labelling what they sample from now on `version`;
        `weights_changed=False` says the pause changed no weight, so a parked decode's keys/values still hold.

        Without a pause before it, it only relabels (the version the next tokens carry)."""
        with self._cond:
            self.version = version
            self.changes += bool(weights_changed)
            self._paused = False
            self._cond.notify_all()

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Held by a decode from its first forward to its last; waits first while paused."""
        with self._cond:
            self._cond.wait_for(lambda: not self._paused)
            self._stepping += 1
        try:
            yield
        finally:
            with self._cond:
                self._stepping -= 1
                self._cond.notify_all()

    def checkpoint(self) -> bool:
        """Between two steps of a decode: park while paused. True if the weights changed while it was parked."""
        if not self._paused:  # the common case, without the lock; a pause that races it parks at the next step
            return False
        with self._cond:
            if not self._paused:
                return False
            changes = self.changes
            self._stepping -= 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._paused)
            self._stepping += 1
            return self.changes != changes
