"""Flat keys of earlier rlloom configs, read into the nested sections that replaced them, with a one-line hint.

The advantage, policy-loss and KL settings were flat keys of `algorithm` (`adv_estimator`, `clip_low`,
`use_kl_loss`, ...); they are renamed into `algorithm.advantage`, `algorithm.policy_loss` and `algorithm.kl`
(`RENAMED_KEYS`), in a file as on the command line. Features with settings of their own are sections that are
absent (null) when the feature is off (`algorithm.tis`, `algorithm.dynamic_sampling`, `algorithm.overlong`,
`algorithm.entropy.adaptive`, `algorithm.ref_sync`, `algorithm.ptx`), so a setting of a switched-off feature cannot
exist. Configs written for the flat keys still load: each flat key moves to its place, a switch (`tis_cap`,
`dynamic_sampling: true`, `overlong_buffer`, `adaptive_entropy`, `ref_model_sync_steps`, `ptx_coef`) turns its
section on or off, and a setting left for a feature that stays off is refused, naming it, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rlloom.core_rl.config.keys import ConfigError, KeyedValueError
from rlloom.core_rl.config.renamed import LOSS_NAME, RENAMED_KEYS

logger = logging.getLogger(__name__)

# flat key under `algorithm` → (section path under `algorithm`, its key there)
ALGORITHM_KEYS: dict[str, tuple[str, str]] = {
    "tis_cap": ("tis", "cap"),
    "tis_mode": ("tis", "mode"),
    "filter_band": ("dynamic_sampling", "filter_band"),
    "filter_key": ("dynamic_sampling", "filter_key"),
    "max_sampling_rounds": ("dynamic_sampling", "max_rounds"),
    "overlong_buffer": ("overlong", "buffer"),
    "overlong_penalty_factor": ("overlong", "penalty_factor"),
    "entropy_coef": ("entropy", "coef"),
    "target_entropy": ("entropy.adaptive", "target"),
    "entropy_coef_step": ("entropy.adaptive", "step"),
    "max_entropy_coef": ("entropy.adaptive", "max_coef"),
    "ref_model_sync_steps": ("ref_sync", "every"),
    "ref_model_mixup_alpha": ("ref_sync", "alpha"),
    "ptx_coef": ("ptx", "coef"),
}
# flat key under `data` → key of `algorithm.ptx`
DATA_KEYS: dict[str, str] = {"ptx_files": "files", "ptx_batch_size": "batch_size", "ptx_max_length": "max_length"}
# the flat key that switches each section on (a falsy value: off)
SWITCHES: dict[str, str] = {
    "tis": "tis_cap",
    "overlong": "overlong_buffer",
    "ref_sync": "ref_model_sync_steps",
    "ptx": "ptx_coef",
}
# sections that also take a bare boolean (`dynamic_sampling: true`, `entropy.adaptive: true`) as on with defaults
BOOLEAN_SECTIONS = ("dynamic_sampling", "entropy.adaptive")
# defaults of the settings whose feature may be off without a word (what an unchanged old config holds)
_DEFAULTS: dict[str, Any] = {
    "tis_mode": "token_truncate",
    "filter_band": None,
    "filter_key": None,
    "max_sampling_rounds": 3,
    "overlong_penalty_factor": 1.0,
    "target_entropy": 0.2,
    "entropy_coef_step": 0.001,
    "max_entropy_coef": 0.5,
    "ref_model_mixup_alpha": 0.6,
    "ptx_files": [],
    "ptx_batch_size": 8,
    "ptx_max_length": 1024,
}
# keys that no longer do anything, dropped with a hint saying what replaced them
REMOVED_KEYS: dict[str, str] = {
    "trainer.bf16_autocast": "model.dtype (the compute dtype: bfloat16 autocasts forwards and keeps fp32 master "
    "weights, on CPU and GPU alike)",
}
# a boolean of `trainer` that became a value of trainer.mode
MODE_SWITCH = "trainer.one_step_off_policy"
LEGACY_KEYS = frozenset(
    [f"algorithm.{key}" for key in (*ALGORITHM_KEYS, "adaptive_entropy")]
    + [f"data.{key}" for key in DATA_KEYS]
    + list(REMOVED_KEYS)
    + [MODE_SWITCH]
)
"""Every dotted flat key this module reads (the key checks accept them)."""

_hinted: set[str] = set()


def set_flat_override(raw: dict[str, Any], key: str, value: Any) -> bool:
    """Apply a command-line override of a flat key (`algorithm.entropy_coef=0`) at its new place, so it overrides
    what the file set there as any override does; returns False when `key` is no flat key. A setting whose section
    the config leaves off stays flat, for `migrate_config` to drop (an old default) or refuse."""
    if key not in LEGACY_KEYS:
        return False
    if key in REMOVED_KEYS:
        _hint_removed(key)
        return True
    if key == MODE_SWITCH:
        trainer = raw.setdefault("trainer", {})
        _set_mode(trainer, value)
        return True
    head, _, name = key.partition(".")
    if name == "adaptive_entropy":
        _hint(key, _new_key(name))
        algo = raw.setdefault("algorithm", {})
        current = _get(algo, "entropy.adaptive")
        _put(algo, "entropy.adaptive", (current if isinstance(current, dict) else {}) if value else None)
        return True
    section, leaf = ALGORITHM_KEYS[name] if head == "algorithm" else ("ptx", DATA_KEYS[name])
    algo = raw.setdefault("algorithm", {})
    if (section, leaf) in _SWITCH_LEAVES:
        _hint(key, f"algorithm.{section}.{leaf}")
        if not value and section != "entropy":
            _put(algo, section, None)
            return True
        target = _get(algo, section)
        _put(algo, section, {**(target if isinstance(target, dict) else {}), leaf: value})
        return True
    target = _get(algo, section)
    if isinstance(target, dict):
        _hint(key, f"algorithm.{section}.{leaf}")
        target[leaf] = value
        return True
    return False  # its section is off: left flat for migrate_config


def renamed_key(key: str, value: Any) -> str:
    """The key a command-line override of a renamed `algorithm` key sets now (`algorithm.clip_low` →
    `algorithm.policy_loss.clip_low`, `algorithm.policy_loss_kwargs.tau_pos` → `algorithm.policy_loss.kwargs.tau_pos`,
    `algorithm.policy_loss=gspo` → `algorithm.policy_loss.name`), hinting once; any other key unchanged."""
    head, _, rest = key.partition(".")
    name, dot, tail = rest.partition(".")
    if head != "algorithm":
        return key
    if name == "policy_loss" and not tail and value is not None and not isinstance(value, Mapping):
        _hint("algorithm.policy_loss", f"algorithm.{LOSS_NAME} (algorithm.policy_loss is a section)")
        return f"algorithm.{LOSS_NAME}"
    if name not in RENAMED_KEYS:
        return key
    _hint(f"algorithm.{name}", f"algorithm.{RENAMED_KEYS[name]}")
    return f"algorithm.{RENAMED_KEYS[name]}{dot}{tail}"


def migrate_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a whole config's nested dict with the flat keys of `algorithm` and `data` moved into their
    sections (`data.ptx_*` into `algorithm.ptx`)."""
    out = dict(raw)
    for dotted in REMOVED_KEYS:
        section, _, key = dotted.partition(".")
        if isinstance(out.get(section), Mapping) and key in out[section]:
            _hint_removed(dotted)
            out[section] = {k: v for k, v in out[section].items() if k != key}
    trainer = out.get("trainer")
    if isinstance(trainer, Mapping) and "one_step_off_policy" in trainer:
        out["trainer"] = {k: v for k, v in trainer.items() if k != "one_step_off_policy"}
        _set_mode(out["trainer"], trainer["one_step_off_policy"])
    data = dict(out.get("data") or {}) if isinstance(out.get("data"), Mapping) else out.get("data")
    algorithm = out.get("algorithm")
    moved_data = {key: data.pop(key) for key in DATA_KEYS if isinstance(data, dict) and key in data}
    if not moved_data and not isinstance(algorithm, Mapping):
        return out
    algorithm = migrate_algorithm(dict(algorithm or {}), data_ptx=moved_data)
    out["algorithm"] = algorithm
    if isinstance(data, dict):
        out["data"] = data
    return out


def migrate_algorithm(raw: Mapping[str, Any], *, data_ptx: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`algorithm`'s dict with its flat keys (and `data.ptx_*`, given as `data_ptx`) moved into sections."""
    algo = {key: _copy(value) for key, value in raw.items()}
    _rename_in_sections(algo)
    flat = {key: algo.pop(key) for key in list(algo) if key in ALGORITHM_KEYS or key == "adaptive_entropy"}
    data_ptx = dict(data_ptx or {})
    for key in flat:
        _hint(f"algorithm.{key}", _new_key(key))
    for key in data_ptx:
        _hint(f"data.{key}", f"algorithm.ptx.{DATA_KEYS[key]}")
    for section in BOOLEAN_SECTIONS:  # `dynamic_sampling: true` is the section with its defaults
        value = _get(algo, section)
        if isinstance(value, bool):
            _put(algo, section, {} if value else None)
    if "adaptive_entropy" in flat:
        adaptive = flat.pop("adaptive_entropy")
        if _get(algo, "entropy.adaptive") is None:
            _put(algo, "entropy.adaptive", {} if adaptive else None)
    for section, switch in SWITCHES.items():
        if switch in flat and not flat[switch]:  # 0 / null: the feature is off
            flat.pop(switch)
            if section not in algo:
                algo[section] = None
    for key, (section, leaf) in ALGORITHM_KEYS.items():
        if key not in flat:
            continue
        _move(algo, section, leaf, flat[key], old=f"algorithm.{key}", default=_DEFAULTS.get(key, _NO_DEFAULT))
    for key, leaf in DATA_KEYS.items():
        if key in data_ptx:
            _move(
                algo, "ptx", leaf, data_ptx[key], old=f"data.{key}", default=_DEFAULTS.get(f"ptx_{leaf}", _NO_DEFAULT)
            )
    return algo


def _rename_in_sections(algo: dict[str, Any]) -> None:
    """Move the renamed flat keys of `algo` (and a loss given by name) into their sections, in place."""
    loss = algo.get("policy_loss")
    if loss is not None and not isinstance(loss, Mapping):
        _hint("algorithm.policy_loss", f"algorithm.{LOSS_NAME} (algorithm.policy_loss is a section)")
        algo["policy_loss"] = {"name": loss}
    for old, new in RENAMED_KEYS.items():
        if old not in algo:
            continue
        value = algo.pop(old)
        _hint(f"algorithm.{old}", f"algorithm.{new}")
        section, leaf = new.split(".")
        target = algo.get(section)
        if target is None:
            target = algo[section] = {}
        if not isinstance(target, dict):
            raise KeyedValueError(f"algorithm.{old}", f"algorithm.{section} is {target!r}, not a section of settings")
        if leaf in target and target[leaf] != value:
            raise KeyedValueError(
                f"algorithm.{old}", f"given as well as algorithm.{new}={target[leaf]!r}; keep only algorithm.{new}"
            )
        target[leaf] = value


_NO_DEFAULT = object()
# the keys whose flat form switches their section on (and `entropy.coef`, whose section always exists)
_SWITCH_LEAVES = {("tis", "cap"), ("overlong", "buffer"), ("ref_sync", "every"), ("ptx", "coef"), ("entropy", "coef")}


def _move(algo: dict[str, Any], section: str, leaf: str, value: Any, *, old: str, default: Any) -> None:
    """Put `value` at `algorithm.<section>.<leaf>`; a setting for a section that is off is dropped when it holds
    the old default, refused otherwise."""
    target = _get(algo, section)
    creates = section in ("tis", "overlong", "ref_sync", "ptx", "entropy") and leaf in (
        "cap",
        "buffer",
        "every",
        "coef",
    )
    if target is None and not creates:
        if value == default:
            return
        raise KeyedValueError(
            old,
            f"{value!r} is a setting of algorithm.{section}, which is off; switch it on "
            f"(algorithm.{section}: {{...}}) or leave {old} out",
        )
    if target is None:
        target = {}
        _put(algo, section, target)
    if not isinstance(target, dict):
        raise KeyedValueError(old, f"algorithm.{section} is {target!r}, not a section of settings")
    if leaf in target and target[leaf] != value:
        raise KeyedValueError(
            old, f"given as well as algorithm.{section}.{leaf}={target[leaf]!r}; keep only algorithm.{section}.{leaf}"
        )
    target[leaf] = value


def _set_mode(trainer: dict[str, Any], one_step_off: Any) -> None:
    """`trainer.one_step_off_policy: true` is trainer.mode=one_step_off; false leaves the mode as it is."""
    _hint(MODE_SWITCH, "trainer.mode=one_step_off (sync | one_step_off | async)")
    if one_step_off:
        if trainer.get("mode", "one_step_off") != "one_step_off":
            raise ConfigError(f"{MODE_SWITCH}: true but trainer.mode={trainer['mode']}; keep only trainer.mode")
        trainer["mode"] = "one_step_off"


def _new_key(key: str) -> str:
    if key == "adaptive_entropy":
        return "algorithm.entropy.adaptive (a section: {} for the defaults, null for off)"
    section, leaf = ALGORITHM_KEYS[key]
    return f"algorithm.{section}.{leaf}"


def _hint_removed(old: str) -> None:
    if old not in _hinted:
        _hinted.add(old)
        logger.warning("config: %s no longer does anything and was ignored; %s decides now", old, REMOVED_KEYS[old])


def _hint(old: str, new: str) -> None:
    if old not in _hinted:
        _hinted.add(old)
        logger.warning("config: %s is now %s; it was read as that (write the new key to silence this)", old, new)


def _get(tree: Mapping[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _copy(value: Any) -> Any:
    return {k: _copy(v) for k, v in value.items()} if isinstance(value, Mapping) else value
