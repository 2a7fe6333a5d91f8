"""Building a run: its folder, its parts, its state, checkpoints (whole and sharded) and their export."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.run.checkpoint import fresh_run_dir as fresh_run_dir
    from rlloom.core_rl.run.checkpoint import latest_checkpoint as latest_checkpoint

_EXPORTS = {
    "fresh_run_dir": "checkpoint",
    "latest_checkpoint": "checkpoint",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
