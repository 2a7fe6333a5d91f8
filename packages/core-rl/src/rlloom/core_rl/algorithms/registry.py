"""Name → function registries, so the config string `adv_estimator=grpo` selects a pure function.

A new estimator or policy loss is one decorated function: no base class, no edit to the trainer, no `if name ==`
chain (the good half of veRL's `core_algos.py`, without its string-typed branches elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from rlloom.core_rl.config.naming import closest_name

F = TypeVar("F", bound=Callable[..., object])


class UnknownNameError(ValueError):
    """A name that is not in a registry (or a list of valid choices); the message lists the valid ones."""


def unknown_name_message(kind: str, name: str, valid: list[str]) -> str:
    """`unknown <kind> 'x'. Did you mean 'y'? Valid names: ...` — shared by every name lookup in the package."""
    close = closest_name(name, valid)
    hint = f" Did you mean {close!r}?" if close else ""
    return f"unknown {kind} {name!r}.{hint} Valid names: {', '.join(sorted(valid))}."


class Registry(Generic[F]):
    """A named set of functions of one kind (advantage estimators, policy losses)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: add the function under `name`; registering a different function twice is an error."""
        if not name or not isinstance(name, str):
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")

        def decorator(fn: F) -> F:
            existing = self._entries.get(name)
            if existing is not None and existing is not fn:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered by {getattr(existing, '__qualname__', existing)!s}; "
                    "choose another name"
                )
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered as `name`; an unknown name raises with the valid names and the nearest one."""
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(unknown_name_message(self.kind, name, list(self._entries))) from None

    def unregister(self, name: str) -> None:
        """Remove `name` (for tests and notebooks that re-define an experiment); unknown names raise."""
        self.get(name)
        del self._entries[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
