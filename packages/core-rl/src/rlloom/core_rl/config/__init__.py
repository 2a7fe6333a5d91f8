"""The training config: the schema and its sections, loading with `key=value` overrides, migration of older keys,
and (under `compat/`) veRL's and TRL's names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlloom.core_rl.facade import lazy_attribute

if TYPE_CHECKING:
    from rlloom.core_rl.config.loading import bundled_config as bundled_config
    from rlloom.core_rl.config.loading import config_from_dict as config_from_dict
    from rlloom.core_rl.config.loading import demo_overrides as demo_overrides
    from rlloom.core_rl.config.loading import load_config as load_config
    from rlloom.core_rl.config.loading import load_config_with_section as load_config_with_section
    from rlloom.core_rl.config.naming import unknown_row_names as unknown_row_names
    from rlloom.core_rl.config.schema import ConfigError as ConfigError
    from rlloom.core_rl.config.schema import KeyedValueError as KeyedValueError
    from rlloom.core_rl.config.schema import RLConfig as RLConfig

_EXPORTS = {
    "ConfigError": "schema",
    "KeyedValueError": "schema",
    "RLConfig": "schema",
    "bundled_config": "loading",
    "config_from_dict": "loading",
    "demo_overrides": "loading",
    "load_config": "loading",
    "load_config_with_section": "loading",
    "unknown_row_names": "naming",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
