"""Config errors as a user reads them: the dotted key, what is wrong and the fix, one line per problem.

Unknown keys name the nearest valid one (inside list items too), say whether they came from the YAML file or a
command-line override, and turn veRL's and TRL's names into ours (`data.max_response_length` → `rollout.max_tokens`)
as a hint (on the command line veRL's keys are aliases, `config_verl_aliases`, and log that they were).
Pydantic's errors lose their input dump and URL and keep the key.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from rlloom.core_rl.config.compat.synonyms import synonym_hint
from rlloom.core_rl.config.compat.trl_names import TRL_NAMES
from rlloom.core_rl.config.naming import closest_name
from rlloom.core_rl.config.renamed import RENAMED_KEYS


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the key and a fix."""


class KeyedValueError(ValueError):
    """Raised by a validator about one key: the error line names `key` (dotted, as the user types it)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


# veRL's name → ours (or what to do instead); a hint in the unknown-key error, never an alias
VERL_NAMES: dict[str, str] = {
    "data.max_response_length": "rollout.max_tokens",
    "data.train_files": "the app's --train-data flag (reasoning train and search-agent train read data.train_files "
    "itself: one file or a list)",
    "data.val_files": "the app's --val-data flag (reasoning train and search-agent train read data.val_files itself)",
    "data.sampler.class_name": "data.sampler.class_path, which names module and class in one: 'pkg.module:Class' "
    "or 'path/to/file.py:Class'",
    "trainer.total_training_steps": "trainer.total_steps",
    "trainer.default_local_dir": "trainer.output_dir",
    "trainer.save_freq": "trainer.save_every",
    "trainer.test_freq": "trainer.val_every",
    "trainer.logger": "trainer.trackers",
    "trainer.project_name": "trainer.project",
    "trainer.experiment_name": "trainer.run_name",
    "trainer.resume_mode": "trainer.resume",
    "trainer.n_gpus_per_node": "distributed.num_ranks",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl.reward_coef",
    "algorithm.kl_ctrl.type": "algorithm.kl.controller",
    "algorithm.filter_groups.enable": "algorithm.dynamic_sampling (a section: {} or true for the defaults)",
    "critic.optim.lr": "critic.lr",
    "actor_rollout_ref.model.path": "model.path",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "model.gradient_checkpointing",
    "actor_rollout_ref.actor.optim.lr": "actor.lr",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "actor.warmup_steps",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": "actor.warmup_ratio",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "actor.mini_batch_size",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "actor.max_tokens_per_micro_batch",
    "actor_rollout_ref.actor.use_kl_loss": "algorithm.kl.use_loss",
    "actor_rollout_ref.actor.kl_loss_coef": "algorithm.kl.loss_coef",
    "actor_rollout_ref.actor.kl_loss_type": "algorithm.kl.loss_type",
    "actor_rollout_ref.actor.entropy_coeff": "algorithm.entropy.coef",
    "actor_rollout_ref.actor.clip_ratio_low": "algorithm.policy_loss.clip_low",
    "actor_rollout_ref.actor.clip_ratio_high": "algorithm.policy_loss.clip_high",
    "actor_rollout_ref.actor.loss_agg_mode": "algorithm.policy_loss.agg_mode",
    "actor_rollout_ref.rollout.response_length": "rollout.max_tokens",
    "actor_rollout_ref.actor.clip_ratio": "algorithm.policy_loss.clip_low and algorithm.policy_loss.clip_high",
    "actor_rollout_ref.actor.clip_ratio_c": "algorithm.policy_loss.dual_clip",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "algorithm.policy_loss.name",
    "actor_rollout_ref.actor.policy_loss": "algorithm.policy_loss.kwargs, one entry per setting (e.g. "
    "algorithm.policy_loss.kwargs.clip_cov_ratio=0.0002)",
    "actor_rollout_ref.actor.tau_pos": "algorithm.policy_loss.kwargs.tau_pos (with algorithm.policy_loss.name=sapo)",
    "actor_rollout_ref.actor.tau_neg": "algorithm.policy_loss.kwargs.tau_neg (with algorithm.policy_loss.name=sapo)",
    "actor_rollout_ref.actor.ppo_epochs": "actor.ppo_epochs",
    "actor_rollout_ref.actor.grad_clip": "actor.grad_clip",
    "actor_rollout_ref.actor.use_dynamic_bsz": "actor.max_tokens_per_micro_batch (micro-batches always fill a "
    "token budget)",
    "actor_rollout_ref.model.lora_rank": "model.lora_rank",
    "actor_rollout_ref.rollout.n": "rollout.n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.top_k": "rollout.top_k",
    "actor_rollout_ref.rollout.val_kwargs.n": "rollout.val_n",
    "actor_rollout_ref.rollout.val_kwargs.temperature": "rollout.val_temperature",
    "actor_rollout_ref.rollout.val_kwargs.top_p": "rollout.val_top_p",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.advantage.norm_by_std",
    "algorithm.filter_groups.max_num_gen_batches": "algorithm.dynamic_sampling.max_rounds",
    "algorithm.rollout_is_threshold": "algorithm.tis.cap",
    "algorithm.rollout_is_mode": "algorithm.tis.mode",
    "critic.cliprange_value": "critic.value_clip",
    "trainer.max_actor_ckpt_to_keep": "trainer.keep_last",
}
_VERL_SECTIONS = {
    "actor_rollout_ref": "veRL's actor_rollout_ref is split here into model, actor and rollout (loss settings such "
    "as use_kl_loss and clip ratios live in algorithm)",
    "reward_model": "rewards are a plain function given to train(reward_fn=...); DAPO's overlong buffer is "
    "algorithm.overlong.buffer",
    "custom_reward_function": "rewards are a plain function given to train(reward_fn=...)",
}


def check_keys(
    raw: Mapping[str, Any],
    model: type[BaseModel],
    *,
    prefix: str,
    source: str,
    extra_sections: Sequence[str] = (),
) -> None:
    """Raise `ConfigError` for the keys of `raw` (nested) that `model` does not have, naming the nearest one.

    `extra_sections`: top-level keys an app adds (`search`, `vision`), valid here and listed among the valid keys.
    """
    fields = model.model_fields
    problems: list[str] = []
    for key, value in raw.items():
        if key in extra_sections:
            continue
        if key not in fields:
            leaves = _leaf_keys(f"{prefix}{key}", value)
            message = unknown_key_message(prefix, str(key), model, extra_sections, full_keys=leaves)
            problems.append(f"{source}: {message}")
            continue
        try:
            check_value(value, fields[key].annotation, prefix=f"{prefix}{key}", source=source)
        except ConfigError as err:
            problems.append(str(err))
    if problems:  # every unknown key of the file at once, one line each
        raise ConfigError("\n".join(problems))


def check_value(value: Any, annotation: Any, *, prefix: str, source: str) -> None:
    """Check the keys inside `value` when the field holds a section or a list of them (`max_tokens_schedule`)."""
    section = section_model(annotation)
    if isinstance(value, Mapping) and section is not None:
        check_keys(value, section, prefix=f"{prefix}.", source=source)
    elif isinstance(value, list) and typing.get_origin(annotation) is list:
        (item_type,) = typing.get_args(annotation) or (None,)
        if _is_model(item_type):
            for index, item in enumerate(value):
                if isinstance(item, Mapping):
                    check_keys(item, item_type, prefix=f"{prefix}[{index}].", source=source)


def unknown_key_message(
    prefix: str,
    key: str,
    model: type[BaseModel],
    extra_sections: Sequence[str] = (),
    *,
    full_keys: Sequence[str] = (),
) -> str:
    """`unknown key 'a.b'; did you mean 'a.c'? Valid keys here: ...` (or veRL's name translated).

    `full_keys`: the dotted keys the user set under the unknown one, matched against veRL's names.
    """
    full = f"{prefix}{key}"
    valid = sorted([*model.model_fields, *extra_sections])
    verl = [(k, h) for k in [*full_keys, full] if (h := verl_hint(k)) is not None]
    if verl:
        full, hint = verl[0][0], verl[0][1]
        return f"unknown key '{full}'; {hint} Valid keys here: {', '.join(valid)}"
    return f"unknown key '{full}'{_nearest(prefix, key, valid)} Valid keys here: {', '.join(valid)}"


def _nearest(prefix: str, key: str, valid: Sequence[str]) -> str:
    """`; did you mean 'x'?`: a peer's name for a setting (`learning_rate` → `actor.lr`), else the nearest valid
    key, or the new place of a near miss of a renamed `algorithm` key (`adv_estimtor` → `advantage.estimator`)."""
    synonym = synonym_hint(key)
    if synonym is not None and synonym[0] != f"{prefix}{key}":
        target, note = synonym
        return f"; did you mean '{target}'{f' {note}' if note else ''}? ({key} is what other trainers call it)"
    renamed = RENAMED_KEYS if prefix == "algorithm." else {}
    close = closest_name(key, [*valid, *renamed])
    if close is None:
        return ""
    return f"; did you mean '{prefix}{renamed.get(close, close)}'?"


def verl_hint(key: str) -> str | None:
    """The hint for a veRL key (full dotted name, or any key under a veRL-only section) or a TRL `GRPOConfig`
    name, else None."""
    for verl, ours in VERL_NAMES.items():
        if key == verl or key.startswith(f"{verl}."):
            return f"that is veRL's name; here it is {ours}."
    if key in TRL_NAMES:
        return f"that is TRL's GRPOConfig name; here it is {TRL_NAMES[key]}."
    section = key.split(".", 1)[0]
    if section in _VERL_SECTIONS:
        return f"{_VERL_SECTIONS[section]}."
    return None


def check_override_key(
    key: str, value: Any, model: type[BaseModel], *, source: str, extra: Sequence[str], root: str = ""
) -> None:
    """Check the dotted key of one override (and the keys inside its value) against `model` (found at `root`)."""
    node: type[BaseModel] = model
    parts = key.split(".")
    for depth, part in enumerate(parts):
        prefix = root + "".join(f"{p}." for p in parts[:depth])
        if depth == 0 and part in extra:
            return  # the app section validates its own keys
        if part not in node.model_fields:
            leaves = _leaf_keys(root + key, value)
            message = unknown_key_message(prefix, part, node, extra if depth == 0 else (), full_keys=leaves)
            raise ConfigError(f"{source}: {message}")
        annotation = node.model_fields[part].annotation
        if depth == len(parts) - 1:
            check_value(value, annotation, prefix=root + key, source=source)
        elif (section := section_model(annotation)) is not None:
            node = section
        elif depth == len(parts) - 2 and typing.get_origin(annotation) is dict:
            return  # one entry of a mapping field, as veRL sets them (data.apply_chat_template_kwargs.enable_thinking)
        else:
            raise ConfigError(f"{source}: '{prefix}{part}' is a value, not a section")


def hydra_prefix_error(item: str) -> ConfigError | None:
    """veRL's Hydra overrides `+key=v` (append), `++key=v` (force) and `~key` (delete) have no meaning here."""
    if not item.startswith(("+", "~")):
        return None
    bare = item.lstrip("+~")
    return ConfigError(
        f"command-line override {item!r}: the leading '{item[: len(item) - len(bare)]}' is Hydra syntax (veRL), not "
        f"needed here: every key exists with its default and is set as key=value (e.g. {bare}); an unknown key "
        "is an error, never appended"
    )


def validation_message(
    err: ValidationError, *, prefix: str = "", root: type[BaseModel] | None = None, skip_unknown: bool = False
) -> str:
    """Pydantic's errors as `dotted.key: message` lines, without the input dump and the documentation URL.

    With `root` (the validated model), a missing section is reported by the required keys inside it
    (`model.path: missing`, not `model: missing`). `skip_unknown`: leave out unknown keys (already reported by
    the key checks, with a better hint)."""
    lines = []
    for problem in err.errors():
        if skip_unknown and problem["type"] == "extra_forbidden":
            continue
        cause = (problem.get("ctx") or {}).get("error")
        if isinstance(cause, KeyedValueError):
            lines.append(f"{cause.key}: {str(cause).replace('. Did you mean', '; did you mean')}")
            continue
        key = prefix + _dotted(problem["loc"])
        message = str(cause) if isinstance(cause, BaseException) else problem["msg"]
        message = message.replace(". Did you mean", "; did you mean")
        value = problem.get("input")
        shown = "" if isinstance(cause, BaseException) or isinstance(value, Mapping | list) else f" (got {value!r})"
        if problem["type"] == "missing":
            key = _first_required_leaf(root, problem["loc"], key) if root is not None else key
            message = f"missing; set it in the YAML or as an override ({key}=...)"
            shown = ""
        lines.append(f"{key or 'config'}: {_lower_first(message)}{shown}")
    return "\n".join(dict.fromkeys(lines))


def _first_required_leaf(root: type[BaseModel], loc: Sequence[int | str], key: str) -> str:
    """`model` -> `model.path` when the missing thing is a section whose first required field is `path`."""
    model: Any = root
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) and _is_model(model) else None
        if field is None:
            return key
        model = field.annotation
    while _is_model(model):
        required = [name for name, field in model.model_fields.items() if field.is_required()]
        if not required:
            return key
        key, model = f"{key}.{required[0]}", model.model_fields[required[0]].annotation
    return key


def _leaf_keys(key: str, value: Any) -> list[str]:
    """The dotted keys of the values set at or under `key` (`a: {b: 1}` → ['a.b'])."""
    if not isinstance(value, Mapping) or not value:
        return [key]
    return [leaf for k, v in value.items() for leaf in _leaf_keys(f"{key}.{k}", v)]


def _dotted(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _is_model(annotation: Any) -> typing.TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds: its model, also when the section is optional (`TISConfig | None`)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if _is_model(candidate):
            return candidate
    return None
