"""What a run reports: per-step metrics, trackers, the generation log and reward curves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.observe.curves import add_plot_command as add_plot_command
    from rlloom.core_rl.observe.curves import read_curves as read_curves
    from rlloom.core_rl.observe.curves import run_plot_command as run_plot_command

_EXPORTS = {
    "add_plot_command": "curves",
    "read_curves": "curves",
    "run_plot_command": "curves",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
