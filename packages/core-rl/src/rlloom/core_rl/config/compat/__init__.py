"""Third-party config names: veRL's Hydra keys as aliases, TRL's field names as hints, and the generated table of
both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.config.compat.verl_infra import CommandLine as CommandLine
    from rlloom.core_rl.config.compat.verl_infra import read_verl_infrastructure as read_verl_infrastructure
    from rlloom.core_rl.config.compat.verl_infra import split_key_value as split_key_value

_EXPORTS = {
    "CommandLine": "verl_infra",
    "read_verl_infrastructure": "verl_infra",
    "split_key_value": "verl_infra",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
