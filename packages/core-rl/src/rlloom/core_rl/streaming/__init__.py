"""Fully asynchronous RL (`trainer.mode=async`, issue 42): a generator thread streams finished groups into a
buffer under AReaL's bounded-staleness admission (`buffer`, `generator`), weights are pushed while requests run
(`gate`: pause/resume, or waiting only for the requests or chunks in progress; `chunked`: partial rollouts by
re-prefill), and the trainer takes the oldest groups first (`rollouts`), logging their staleness (`staleness`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.streaming.buffer import GroupBuffer as GroupBuffer
    from rlloom.core_rl.streaming.buffer import admits as admits
    from rlloom.core_rl.streaming.chunked import chunked_collector as chunked_collector
    from rlloom.core_rl.streaming.gate import UpdateGate as UpdateGate
    from rlloom.core_rl.streaming.rollouts import AsyncRollouts as AsyncRollouts
    from rlloom.core_rl.streaming.rollouts import background_rollouts as background_rollouts
    from rlloom.core_rl.streaming.staleness import staleness_metrics as staleness_metrics

_EXPORTS = {
    "AsyncRollouts": "rollouts",
    "GroupBuffer": "buffer",
    "UpdateGate": "gate",
    "admits": "buffer",
    "background_rollouts": "rollouts",
    "chunked_collector": "chunked",
    "staleness_metrics": "staleness",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
