"""Reading a training config: YAML, then dotted `key=value` overrides (values parsed as YAML), then validation.

Unknown keys are blamed on where they were typed (the file, or the command-line override) and name the nearest
valid key; an app's own section (`search:`, `vision:`) is read and checked beside `RLConfig`'s.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from rlloom.core_rl.config.compat.verl_aliases import Translated, log_aliases, search_r1_mini_batch, translate
from rlloom.core_rl.config.keys import (
    ConfigError,
    KeyedValueError,
    check_keys,
    check_override_key,
    hydra_prefix_error,
    section_model,
    validation_message,
)
from rlloom.core_rl.config.migration import LEGACY_KEYS, migrate_config, renamed_key, set_flat_override
from rlloom.core_rl.config.schema import RLConfig

SectionT = TypeVar("SectionT", bound=BaseModel)


def load_config_with_section(
    path: str | Path, section: str, model: type[SectionT], overrides: Sequence[str] = ()
) -> tuple[RLConfig, SectionT]:
    """A YAML config holding `RLConfig`'s sections plus one app section (`search:`, `vision:` ...).

    Dotted overrides reach both (`vision.max_pixels=12544`, `actor.lr=1e-6`); each part is validated, and an
    error in the app section names its key and the valid ones.
    """
    loaded = _read_yaml(path)
    errors, good = _check_sources(loaded, overrides, source=str(path), extra={section: model})
    log_aliases([t for _, t in _parse_overrides(good)])
    apply_overrides(loaded, good)
    try:
        extra = model.model_validate(loaded.pop(section, None) or {})
    except ValidationError as err:
        errors.append(validation_message(err, prefix=f"{section}.", skip_unknown=bool(errors)))
    return _validate(loaded, errors), extra  # raises every error found, the app section's included


def demo_overrides(
    *, model_path: Path, output_dir: Path, seed: int, steps: int | None = None, tokenizer_path: Path | None = None
) -> list[str]:
    """The dotted overrides a demo puts on its bundled config before the user's: its own model and run folder,
    its seed, a fresh start (never resume), and `--steps` when given."""
    own = [f"model.path={model_path}", f"trainer.output_dir={output_dir}", f"trainer.seed={seed}"]
    own.append("trainer.resume=never")
    if tokenizer_path is not None:
        own.append(f"model.tokenizer_path={tokenizer_path}")
    if steps is not None:
        own.append(f"trainer.total_steps={steps}")
    return own


def bundled_config(name: str, folder: Path, names: Sequence[str]) -> Path:
    """An app's bundled config by name (`folder/<name>.yaml` for a name in `names`), or a YAML path."""
    if name in names:
        return folder / f"{name}.yaml"
    path = Path(name)
    if not path.is_file():
        raise ConfigError(f"--config {name}: neither a bundled config ({', '.join(names)}) nor a YAML file")
    return path


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RLConfig:
    """Read YAML (optional), apply `a.b.c=value` overrides (values parsed as YAML), validate."""
    raw = _read_yaml(path) if path is not None else {}
    errors, good = _check_sources(raw, overrides, source=str(path) if path is not None else "config")
    log_aliases([t for _, t in _parse_overrides(good)])
    apply_overrides(raw, good)
    return _validate(raw, errors)


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set each `a.b.c=value` (value parsed as YAML) in the nested dict `raw`, in place; returns `raw`.

    Apps whose config files add their own sections next to `RLConfig`'s use this before splitting them off. The
    file's flat keys of earlier configs move to their sections first, and an override of a flat key lands there
    too (`config_migration`), so an override wins over the file whichever form either uses. veRL's keys are read
    as ours (`config_verl_aliases`).
    """
    migrated = _migrated(raw)
    raw.clear()
    raw.update(migrated)
    for _, override in _parse_overrides(overrides):
        key, value = override.key, override.value
        if override.section_switch and value == {} and isinstance(_get_dotted(raw, key), dict):
            continue  # veRL's `enable=true` turns the section on; what the file set inside it stays
        if value is None and _clears_to_default(key):
            _delete_dotted(raw, key)  # `key=null` on a key that cannot be null: back to its default
        elif not set_flat_override(raw, key, value):
            _set_dotted(raw, key, value)
    return raw


def config_from_dict(raw: Mapping[str, Any], *, source: str = "config") -> RLConfig:
    """Validate a nested dict, reporting unknown keys with the nearest valid name (`ConfigError`, one line per
    problem, each naming its dotted key)."""
    check_keys(_migrated(raw), RLConfig, prefix="", source=source)
    return _validate(raw)


def _read_yaml(path: str | Path) -> dict[str, Any]:
    loaded = yaml.safe_load(Path(path).read_text())
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded or {}


def _check_sources(
    file_raw: Mapping[str, Any],
    overrides: Sequence[str],
    *,
    source: str,
    extra: Mapping[str, type[BaseModel]] | None = None,
) -> tuple[list[str], list[str]]:
    """Unknown keys, blamed on where they were typed: the YAML file, or the command-line override.

    Returns every problem found (one line each, so one run reports them all) and the overrides without one."""
    extra = extra or {}
    errors: list[str] = []
    try:
        check_keys(_migrated(file_raw), RLConfig, prefix="", source=source, extra_sections=tuple(extra))
    except ConfigError as err:
        errors.append(str(err))
    strict = {name: model for name, model in extra.items() if model.model_config.get("extra") == "forbid"}
    for name, model in strict.items():
        if isinstance(file_raw.get(name), Mapping):
            try:
                check_keys(file_raw[name], model, prefix=f"{name}.", source=source)
            except ConfigError as err:
                errors.append(str(err))
    good: list[str] = []
    for item in overrides:
        try:
            _check_override(item, extra, strict)
        except ConfigError as err:
            errors.append(str(err))
        else:
            good.append(item)
    return errors, good


def _check_override(item: str, extra: Mapping[str, type[BaseModel]], strict: Mapping[str, type[BaseModel]]) -> None:
    for _, override in _parse_overrides([item]):
        key, value = override.key, override.value
        head, _, rest = key.partition(".")
        where = f"command-line override {item!r}"
        if key in LEGACY_KEYS:
            continue  # a flat key of earlier configs: read into its section when the config is validated
        if head in extra and rest:
            if head in strict:
                check_override_key(rest, value, strict[head], source=where, extra=(), root=f"{head}.")
        else:
            check_override_key(key, value, RLConfig, source=where, extra=tuple(extra))


def _migrated(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` with the flat keys of earlier configs in their sections, for the key checks."""
    try:
        return migrate_config(raw)
    except KeyedValueError as err:
        raise ConfigError(f"{err.key}: {err}") from None


def _parse_overrides(overrides: Sequence[str]) -> list[tuple[str, Translated]]:
    """Each override as typed, with our key and value (veRL's keys translated)."""
    items = list(overrides)
    parsed = search_r1_mini_batch([_parse_override(item) for item in items])
    out: list[tuple[str, Translated]] = []
    for item, pair in zip(items, parsed, strict=True):
        out.extend((item, dataclasses.replace(t, key=renamed_key(t.key, t.value))) for t in translate([pair]))
    return sorted(out, key=lambda pair: not pair[1].fan_out)  # veRL's clip_ratio before clip_ratio_low/high


def _clears_to_default(key: str) -> bool:
    """Whether `key` names an `RLConfig` field with a default that does not take None (`rollout.top_k`): there
    `key=null` clears what the file set. Fields that take None (`algorithm.tis`, `trainer.total_steps`) get None."""
    node: type[BaseModel] | None = RLConfig
    field = None
    for part in key.split("."):
        if node is None or part not in node.model_fields:
            return False
        field = node.model_fields[part]
        node = section_model(field.annotation)
    if field is None or field.is_required():
        return False
    return not _accepts_none(field.annotation)


def _accepts_none(annotation: Any) -> bool:
    return annotation is None or annotation is type(None) or type(None) in typing.get_args(annotation)


def _delete_dotted(raw: dict[str, Any], key: str) -> None:
    *parents, leaf = key.split(".")
    node: Any = raw
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(leaf, None)


def _get_dotted(raw: Mapping[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def _parse_override(item: str) -> tuple[str, Any]:
    hydra = hydra_prefix_error(item)
    if hydra is not None:
        raise hydra
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not key=value (e.g. trainer.total_steps=200)")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise ConfigError(f"command-line override {item!r}: the value is not valid YAML ({problem})") from None
    return key.strip(), parsed


def _validate(raw: Mapping[str, Any], errors: Sequence[str] = ()) -> RLConfig:
    """`RLConfig` from `raw`; `errors` found before (unknown keys) are raised with pydantic's, all at once."""
    try:
        config = RLConfig.model_validate(raw)
    except ValidationError as err:
        lines = [*errors, validation_message(err, root=RLConfig, skip_unknown=bool(errors))]
        raise ConfigError("\n".join(line for line in lines if line)) from None
    if errors:
        raise ConfigError("\n".join(errors))
    # user code is imported here, not in a validator: Ray workers re-validate the config where the file may not be
    if config.data.sampler.class_path is not None:
        from rlloom.core_rl.data.samplers import check_sampler_config  # torch: only for a sampler named

        check_sampler_config(config.data.sampler.class_path, config.data.sampler.kwargs)
    return config


def _set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value
