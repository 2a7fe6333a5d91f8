"""Finished, not yet trained groups in a checkpoint: saved with their trajectories (tokens, behaviour log-probs,
per-token policy versions, rewards) so a resume trains them as the uninterrupted run would, instead of generating
them again under the resumed weights. Plain dicts and lists, so the checkpoint does not pickle our classes."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.streaming.buffer import Group

_TRAJECTORY_FIELDS = tuple(f.name for f in fields(Trajectory))


def group_state(group: Group) -> dict[str, Any]:
    """One finished group as plain data."""
    return {
        "draw": group.draw,
        "position": group.position,
        "row_id": group.row_id,
        "start_version": group.start_version,
        "trajectories": [{name: getattr(t, name) for name in _TRAJECTORY_FIELDS} for t in group.trajectories],
        "errors": list(group.errors),
        "penalties": list(group.penalties),
        "record_prefix": group.record_prefix,
        "record_rows": list(group.record_rows),
    }


def restored_group(state: dict[str, Any], index: int) -> Group:
    """A group saved by `group_state`, admitted as `index` (its place in the resumed run's admission order)."""
    try:
        trajectories = [Trajectory(**t) for t in state["trajectories"]]
        return Group(
            index=index,
            draw=int(state["draw"]),
            position=int(state["position"]),
            row_id=int(state["row_id"]),
            start_version=int(state["start_version"]),
            trajectories=trajectories,
            errors=list(state["errors"]),
            penalties=list(state["penalties"]),
            record_prefix=str(state["record_prefix"]),
            record_rows=[int(r) for r in state["record_rows"]],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"checkpoint loader.finished: a saved group cannot be restored ({exc!r}); resume from another "
            "checkpoint, or delete the 'finished' entry of its loader state to generate those groups again"
        ) from exc


__all__ = ["group_state", "restored_group"]
