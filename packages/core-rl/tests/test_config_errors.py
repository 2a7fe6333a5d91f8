"""Config errors as a first-time user meets them: one line per problem naming the dotted key, unknown keys blamed
on the file or the override that typed them, veRL names translated, and impossible settings refused at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel, ConfigDict

from rlloom.core_rl.config.keys import section_model
from rlloom.core_rl.config.loading import load_config, load_config_with_section
from rlloom.core_rl.config.schema import ActorConfig, ConfigError
from rlloom.core_rl.workers.optim import build_optimizer


def error_of(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["model.path=/m", *overrides])
    return str(caught.value)


def test_value_errors_are_one_line_per_key_without_the_pydantic_dump() -> None:
    assert error_of(["algorithm.advantage.estimator=grpoo"]).startswith(
        "algorithm.advantage.estimator: unknown advantage estimator 'grpoo'; did you mean 'grpo'? Valid names: "
    )
    assert error_of(["actor.lr=abc", "rollout.n=zero"]).splitlines() == [
        "rollout.n: input should be a valid integer, unable to parse string as an integer (got 'zero')",
        "actor.lr: input should be a valid number, unable to parse string as a number (got 'abc')",
    ]
    assert error_of(["trainer.critic_warmup=2"]).startswith(
        "trainer.critic_warmup: 2 but algorithm.advantage.estimator="
    )
    assert error_of(["algorithm.kl.loss_type=k7"]).startswith("algorithm.kl.loss_type: unknown KL estimator 'k7'")
    for message in (error_of(["algorithm.advantage.estimator=grpoo"]), error_of(["trainer.critic_warmup=2"])):
        assert "\n" not in message
        assert "input_value" not in message and "errors.pydantic.dev" not in message and "'model'" not in message


def test_unknown_keys_are_blamed_on_the_override_or_the_file(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model:\n  path: /m\nalgorithm:\n  adv_estimator: grpo\n")
    from_override = error_of(["algorithm.adv_estimtor=grpo"], yaml_file)
    assert from_override.startswith(
        "command-line override 'algorithm.adv_estimtor=grpo': unknown key 'algorithm.adv_estimtor'; "
        "did you mean 'algorithm.advantage.estimator'?"
    )
    assert str(yaml_file) not in from_override
    yaml_file.write_text("model:\n  path: /m\nalgorithm:\n  adv_estimtor: grpo\n")
    assert error_of([], yaml_file).startswith(f"{yaml_file}: unknown key 'algorithm.adv_estimtor'; did you mean")


def test_typos_inside_list_items_name_the_item_and_the_field() -> None:
    message = error_of(["rollout.max_tokens_schedule=[{step: 2, max_token: 12}]"])
    assert "unknown key 'rollout.max_tokens_schedule[0].max_token'" in message
    assert "did you mean 'rollout.max_tokens_schedule[0].max_tokens'?" in message


def test_hydra_plus_and_verl_names_get_their_own_hint() -> None:
    plus = error_of(["+trainer.foo=1"])
    assert plus.startswith("command-line override '+trainer.foo=1': the leading '+' is Hydra syntax")
    assert "did you mean" not in plus
    # veRL's names are aliases on the command line (test_verl_aliases); a veRL key with no alias gets the hint
    assert "here it is distributed.num_ranks" in error_of(["trainer.n_gpus_per_node=8"])
    verl_dyn = error_of(["actor_rollout_ref.actor.use_dynamic_bsz=true"])
    assert "unknown key 'actor_rollout_ref.actor.use_dynamic_bsz'; that is veRL's name; here it is" in verl_dyn


class AppSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: int = 3


def test_an_app_section_is_listed_and_checked(tmp_path: Path) -> None:
    yaml_file = tmp_path / "app.yaml"
    yaml_file.write_text("model:\n  path: /m\nsearch:\n  top_k: 5\n")
    cfg, search = load_config_with_section(yaml_file, "search", AppSection, ["search.top_k=7", "rollout.n=2"])
    assert (search.top_k, cfg.rollout.n) == (7, 2)
    with pytest.raises(ConfigError) as caught:
        load_config_with_section(yaml_file, "search", AppSection, ["serch.top_k=1"])
    assert "unknown key 'serch'; did you mean 'search'? Valid keys here: actor, algorithm, critic, data, " in str(
        caught.value
    )
    assert str(caught.value).endswith("rollout, search, trainer")
    with pytest.raises(ConfigError, match=r"^command-line override 'search.top_kk=1': unknown key 'search.top_kk'"):
        load_config_with_section(yaml_file, "search", AppSection, ["search.top_kk=1"])
    with pytest.raises(ConfigError, match=r"^search.top_k: input should be a valid integer.*\(got 'many'\)$"):
        load_config_with_section(yaml_file, "search", AppSection, ["search.top_k=many"])


def test_overlong_buffer_longer_than_any_response_limit_is_refused_at_load() -> None:
    dapo = ["algorithm.overlong.buffer=4096", "rollout.max_tokens=8"]
    assert error_of(dapo).startswith("algorithm.overlong.buffer: 4096 tokens exceeds the response limit rollout.max")
    staged = [
        "algorithm.overlong.buffer=16",
        "rollout.max_tokens=32",
        "rollout.max_tokens_schedule=[{step: 3, max_tokens: 8}]",
    ]
    assert "rollout.max_tokens_schedule[0].max_tokens=8" in error_of(staged)
    load_config(None, ["model.path=/m", "algorithm.overlong.buffer=8", "rollout.max_tokens=8"])  # the whole limit


def test_policy_loss_options_refused_at_load() -> None:
    assert error_of(["algorithm.policy_loss.name=gspo", "algorithm.policy_loss.dual_clip=3"]).startswith(
        "algorithm.policy_loss.dual_clip: "
    )
    assert error_of(["algorithm.policy_loss.name=gmpo"]).startswith("algorithm.policy_loss.agg_mode: token-mean but")
    gmpo = ["algorithm.policy_loss.name=gmpo", "algorithm.policy_loss.agg_mode=seq-mean-token-mean"]
    assert error_of([*gmpo, "algorithm.top_entropy_quantile=0.2"]).startswith("algorithm.top_entropy_quantile: ")
    assert error_of(["algorithm.tis={cap: 2, mode: sequence}"]).startswith("algorithm.tis.mode: ")
    assert error_of(["algorithm.top_entropy_quantile=0"]).startswith("algorithm.top_entropy_quantile: ")
    assert error_of(["algorithm.advantage.estimator=rloo", "algorithm.advantage.std_scope=batch"]).startswith(
        "algorithm.advantage.std_scope: batch, but algorithm.advantage.estimator=rloo"
    )
    load_config(None, ["model.path=/m", "algorithm.advantage.std_scope=batch"])  # grpo with its std: fine
    # a setting of a feature that is off: the flat keys of earlier configs say so; the sections cannot hold one
    assert error_of(["algorithm.filter_band=[0.01, 0.99]"]).startswith(
        "algorithm.filter_band: [0.01, 0.99] is a setting of algorithm.dynamic_sampling, which is off"
    )
    assert error_of(["algorithm.filter_key=accuracy"]).startswith("algorithm.filter_key: 'accuracy' is a setting of")
    assert error_of(["trainer.ema_beta=0.99", "model.lora_rank=8"]).startswith("trainer.ema_beta: is kept for")
    assert error_of(["rollout.val_n=4"]).startswith("rollout.val_n: 4 samples per prompt, but rollout.val_temperatu")
    band = ["algorithm.dynamic_sampling={filter_band: [0.9, 0.1]}"]
    assert error_of(band).startswith("algorithm.dynamic_sampling.filter_band: [0.9, 0.1] is empty")
    assert error_of(["algorithm.tis_mode=sequence_mask"]).startswith(
        "algorithm.tis_mode: 'sequence_mask' is a setting of algorithm.tis, which is off"
    )
    load_config(None, ["model.path=/m", "algorithm.tis={cap: 2.0, mode: sequence_mask}"])
    assert error_of(["algorithm.ref_model_mixup_alpha=0.9"]).startswith(
        "algorithm.ref_model_mixup_alpha: 0.9 is a setting of algorithm.ref_sync, which is off"
    )
    same_dir = ["trainer.rollout_data_dir=runs/gen", "trainer.validation_data_dir=runs/gen/"]
    assert error_of(same_dir).startswith("trainer.validation_data_dir: 'runs/gen/' is also trainer.rollout_data_dir")
    ok = load_config(None, ["model.path=/m", "algorithm.dynamic_sampling={filter_band: [0.01, 0.99]}"])
    assert ok.algorithm.dynamic_sampling is not None and ok.algorithm.dynamic_sampling.filter_band == (0.01, 0.99)


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "grpo_passk", "opo", "gpg", "reinforce_plus_plus_baseline"]
)
def test_group_estimators_need_two_samples_per_prompt(estimator: str) -> None:
    message = error_of([f"algorithm.advantage.estimator={estimator}", "rollout.n=1"])
    assert message.startswith(f"rollout.n: 1 sample per prompt, but algorithm.advantage.estimator={estimator} compares")


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "remax", "gae"])
def test_estimators_without_groups_take_one_sample(estimator: str) -> None:
    assert (
        load_config(None, ["model.path=/m", f"algorithm.advantage.estimator={estimator}", "rollout.n=1"]).rollout.n == 1
    )


def test_warmup_as_long_as_the_run_is_refused_and_a_ratio_follows_the_run() -> None:
    message = error_of(["actor.warmup_steps=286", "trainer.total_steps=1"])
    assert message.startswith("actor.warmup_steps: 286 warm-up steps but the run has 1 training steps")
    assert "trainer.total_steps" in message and "actor.warmup_ratio" in message
    assert error_of(["actor.warmup_steps=5", "actor.warmup_ratio=0.1"]).startswith("actor.warmup_ratio: 0.1 and ")
    cfg = load_config(None, ["model.path=/m", "actor.warmup_ratio=0.25", "trainer.total_steps=1"])
    assert cfg.actor.warmup_steps_for(1) == 0 and cfg.actor.warmup_steps_for(8) == 2
    # the schedule: lr 0, then half, then the peak from step 2 on (8 steps, ratio 0.25 -> 2 warm-up steps)
    optimizer, scheduler = build_optimizer(
        [torch.nn.Parameter(torch.zeros(1))], ActorConfig(lr=1.0, warmup_ratio=0.25), 8
    )
    lrs = []
    for _ in range(4):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == [0.0, 0.5, 1.0, 1.0]


def test_every_verl_hint_names_a_key_that_exists() -> None:
    from rlloom.core_rl.config.keys import VERL_NAMES
    from rlloom.core_rl.config.schema import RLConfig

    for verl_name, ours in VERL_NAMES.items():
        if " " in ours:  # a sentence ("the app's --train-data flag"), not a key
            continue
        model: Any = RLConfig
        for part in ours.split(".")[:-1]:  # through nested sections, which may be optional (`algorithm.tis`)
            model = section_model(model.model_fields[part].annotation)
        assert ours.split(".")[-1] in model.model_fields, f"{verl_name} -> {ours}: no such key"


def test_a_missing_section_names_the_key_to_set() -> None:
    from rlloom.core_rl.config.loading import load_config

    with pytest.raises(ConfigError, match=r"^model.path: missing; set it in the YAML or as an override \(model.path="):
        load_config(None, ["trainer.seed=1"])
