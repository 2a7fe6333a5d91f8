"""The run's stateful parts, registered once: a checkpoint's `trainer_state.pt` is what they save, under the keys
every rlloom checkpoint has used (step, actor, critic, loader, ptx_loader, kl_controller, entropy_controller,
prompt_filter, reference, ema, rng), and a resume hands each part its own entry back, in registration order.

A feature with state registers a part where it is built; `Trainer.save` and the resume loop over the registry, so
adding one touches no checkpoint code. A part switched off in this run is saved as None, as before, so older
rlloom versions and older checkpoints read the same file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class StatefulPart:
    """One entry of `trainer_state.pt`: how to take it, and how to give it back on resume."""

    key: str
    save: Callable[[], Any]
    load: Callable[[Any], None]
    load_none: bool = False  # call `load(None)` when the checkpoint has no state for it (a run without the feature)


class RunState:
    """The registry: parts in the order they are restored (the RNG streams last, after everything that loads)."""

    def __init__(self) -> None:
        self._parts: dict[str, StatefulPart] = {}

    def register(
        self, key: str, save: Callable[[], Any], load: Callable[[Any], None], *, load_none: bool = False
    ) -> None:
        if key in self._parts:
            raise ValueError(f"the checkpoint key {key!r} is registered twice")
        self._parts[key] = StatefulPart(key, save, load, load_none)

    def register_part(self, key: str, part: Stateful | None) -> None:
        """An object with `state_dict`/`load_state_dict`; None for a part this run does not have, saved as None (its
        key stays in the file, as older runs wrote it)."""
        if part is None:
            self.register(key, lambda: None, lambda _state: None)
        else:
            self.register(key, part.state_dict, part.load_state_dict)

    @property
    def keys(self) -> list[str]:
        return list(self._parts)

    def state_dict(self) -> dict[str, Any]:
        return {key: part.save() for key, part in self._parts.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Give each registered part its entry; a missing or None entry is skipped unless the part asked for it."""
        for key, part in self._parts.items():
            value = state.get(key)
            if value is not None or part.load_none:
                part.load(value)
