"""Configs written for the flat algorithm keys load into the nested sections that replaced them, with one hint
per key; a setting left for a feature that stays off is refused, naming it; the sections themselves cannot hold
such a setting."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.migration import LEGACY_KEYS, MODE_SWITCH, REMOVED_KEYS, migrate_config
from rlloom.core_rl.config.schema import AlgorithmConfig, ConfigError, RLConfig


def test_every_flat_key_lands_in_its_section() -> None:
    flat = [
        "model.path=/m",
        "algorithm.tis_cap=2.0",
        "algorithm.tis_mode=sequence_mask",
        "algorithm.dynamic_sampling=true",
        "algorithm.filter_band=[0.1, 0.9]",
        "algorithm.filter_key=accuracy",
        "algorithm.max_sampling_rounds=5",
        "algorithm.overlong_buffer=16",
        "algorithm.overlong_penalty_factor=0.5",
        "algorithm.adaptive_entropy=true",
        "algorithm.entropy_coef=0.001",
        "algorithm.target_entropy=0.3",
        "algorithm.entropy_coef_step=0.0001",
        "algorithm.max_entropy_coef=0.005",
        "algorithm.use_kl_loss=true",
        "algorithm.ref_model_sync_steps=7",
        "algorithm.ref_model_mixup_alpha=0.9",
        "algorithm.ptx_coef=0.05",
        "data.ptx_files=[p.jsonl]",
        "data.ptx_batch_size=4",
        "data.ptx_max_length=64",
    ]
    assert {item.split("=")[0] for item in flat[1:]} - {"algorithm.dynamic_sampling", "algorithm.use_kl_loss"} == set(
        LEGACY_KEYS - set(REMOVED_KEYS) - {MODE_SWITCH}
    )  # the list above covers every flat key (trainer.one_step_off_policy: test_async_units)
    nested = [
        "model.path=/m",
        "algorithm.tis={cap: 2.0, mode: sequence_mask}",
        "algorithm.dynamic_sampling={filter_band: [0.1, 0.9], filter_key: accuracy, max_rounds: 5}",
        "algorithm.overlong={buffer: 16, penalty_factor: 0.5}",
        "algorithm.entropy={coef: 0.001, adaptive: {target: 0.3, step: 0.0001, max_coef: 0.005}}",
        "algorithm.use_kl_loss=true",
        "algorithm.ref_sync={every: 7, alpha: 0.9}",
        "algorithm.ptx={coef: 0.05, files: [p.jsonl], batch_size: 4, max_length: 64}",
    ]
    assert load_config(None, flat) == load_config(None, nested)


def test_each_flat_key_gets_one_hint(caplog: pytest.LogCaptureFixture) -> None:
    from rlloom.core_rl.config import migration as config_migration

    config_migration._hinted.discard("algorithm.overlong_buffer")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            load_config(None, ["model.path=/m", "algorithm.overlong_buffer=8"])
    hints = [r.getMessage() for r in caplog.records if "algorithm.overlong_buffer" in r.getMessage()]
    assert hints == [
        "config: algorithm.overlong_buffer is now algorithm.overlong.buffer; it was read as that (write the new key to "
        "silence this)"
    ]


def test_switched_off_features_keep_only_their_defaults() -> None:
    off = load_config(None, ["model.path=/m", "algorithm.overlong_buffer=0", "algorithm.overlong_penalty_factor=1.0"])
    assert off.algorithm.overlong is None
    assert load_config(None, ["model.path=/m", "algorithm.ref_model_sync_steps=0"]).algorithm.ref_sync is None
    with pytest.raises(
        ConfigError, match=r"^algorithm.overlong_penalty_factor: 0.5 is a setting of algorithm.overlong"
    ):
        load_config(None, ["model.path=/m", "algorithm.overlong_penalty_factor=0.5"])
    with pytest.raises(ConfigError, match=r"^algorithm.max_sampling_rounds: 5 is a setting of algorithm.dynamic_samp"):
        load_config(None, ["model.path=/m", "algorithm.dynamic_sampling=false", "algorithm.max_sampling_rounds=5"])


def test_a_key_given_both_ways_in_one_file_is_refused(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text("model: {path: /m}\nalgorithm: {tis: {cap: 3}, tis_cap: 2}\n")
    with pytest.raises(ConfigError, match=r"^algorithm.tis_cap: given as well as algorithm.tis.cap=3"):
        load_config(both)
    # on the command line the later override wins, as overrides do
    later = load_config(None, ["model.path=/m", "algorithm.tis={cap: 3}", "algorithm.tis_cap=2"])
    assert later.algorithm.tis is not None and later.algorithm.tis.cap == 2.0


def test_python_construction_reads_flat_keys_too() -> None:
    algo = AlgorithmConfig(entropy_coef=0.01, dynamic_sampling=True)  # type: ignore[call-arg]
    assert algo.entropy.coef == 0.01 and algo.dynamic_sampling is not None and algo.dynamic_sampling.max_rounds == 3
    config = RLConfig.model_validate(
        {"model": {"path": "/m"}, "algorithm": {"ptx_coef": 0.1}, "data": {"ptx_files": ["p.jsonl"]}}
    )
    assert config.algorithm.ptx is not None and config.algorithm.ptx.files == ["p.jsonl"]
    assert "ptx_files" not in config.data.model_dump()


def test_migration_leaves_its_input_alone_and_new_configs_as_they_are() -> None:
    raw = {"model": {"path": "/m"}, "algorithm": {"tis_cap": 2.0}, "data": {"ptx_files": []}}
    before = repr(raw)
    migrated = migrate_config(raw)
    assert repr(raw) == before
    assert migrated["algorithm"] == {"tis": {"cap": 2.0}} and migrated["data"] == {}
    nested = {"model": {"path": "/m"}, "algorithm": {"tis": {"cap": 2.0}, "entropy": {"coef": 0.1}}}
    assert migrate_config(nested) == nested


def test_losses_declare_what_they_support() -> None:
    from rlloom.core_rl.algorithms import LossTraits, policy_loss_traits, register_policy_loss
    from rlloom.core_rl.algorithms.policy_loss import POLICY_LOSSES, ppo_policy_loss

    assert policy_loss_traits("ppo") == LossTraits(dual_clip=True, sequence_level=False)
    assert policy_loss_traits("gspo") == LossTraits(dual_clip=False, sequence_level=False)
    assert policy_loss_traits("gmpo") == LossTraits(dual_clip=False, sequence_level=True)

    def plain(*args, **kwargs):  # type: ignore[no-untyped-def]
        return ppo_policy_loss(*args, **kwargs)

    register_policy_loss("test_sequence_loss", sequence_level=True)(plain)
    try:
        with pytest.raises(ConfigError, match="^algorithm.policy_loss.agg_mode: token-mean but"):
            load_config(None, ["model.path=/m", "algorithm.policy_loss.name=test_sequence_loss"])
        with pytest.raises(
            ConfigError, match="^algorithm.tis: algorithm.policy_loss.name=test_sequence_loss has a sequence"
        ):
            load_config(
                None,
                [
                    "model.path=/m",
                    "algorithm.policy_loss.name=test_sequence_loss",
                    "algorithm.policy_loss.agg_mode=seq-mean-token-mean",
                    "algorithm.tis={cap: 2}",
                ],
            )
    finally:
        POLICY_LOSSES.unregister("test_sequence_loss")


def test_an_override_wins_over_the_file_whichever_form_either_uses(tmp_path: Path) -> None:
    nested = tmp_path / "nested.yaml"
    nested.write_text("model: {path: /m}\nalgorithm:\n  entropy: {coef: 0.001}\n  dynamic_sampling: {max_rounds: 4}\n")
    flat = tmp_path / "flat.yaml"
    flat.write_text("model: {path: /m}\nalgorithm:\n  entropy_coef: 0.001\n  dynamic_sampling: true\n")
    for path in (nested, flat):
        for override in ("algorithm.entropy_coef=0.0", "algorithm.entropy.coef=0.0"):
            assert load_config(path, [override]).algorithm.entropy.coef == 0.0, (path.name, override)
        rounds = load_config(path, ["algorithm.max_sampling_rounds=7"]).algorithm.dynamic_sampling
        assert rounds is not None and rounds.max_rounds == 7
        assert load_config(path, ["algorithm.dynamic_sampling=false"]).algorithm.dynamic_sampling is None
    # a switch at 0 turns its section off; a setting for a section the config leaves off is still refused
    assert (
        load_config(nested, ["algorithm.overlong={buffer: 8}", "algorithm.overlong_buffer=0"]).algorithm.overlong
        is None
    )
    with pytest.raises(ConfigError, match="^algorithm.tis_mode: 'token_mask' is a setting of algorithm.tis"):
        load_config(nested, ["algorithm.tis_mode=token_mask"])
    both_orders = [["algorithm.max_sampling_rounds=2", "algorithm.dynamic_sampling=true"],
                   ["algorithm.dynamic_sampling=true", "algorithm.max_sampling_rounds=2"]]  # fmt: skip
    for order in both_orders:
        config = load_config(None, ["model.path=/m", *order]).algorithm.dynamic_sampling
        assert config is not None and config.max_rounds == 2, order


def test_a_key_that_no_longer_does_anything_is_dropped_with_a_hint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rlloom.core_rl.config import migration as config_migration

    config_migration._hinted.discard("trainer.bf16_autocast")
    old = tmp_path / "old.yaml"
    old.write_text("model: {path: /m, dtype: bfloat16}\ntrainer: {bf16_autocast: true}\n")
    with caplog.at_level(logging.WARNING):
        config = load_config(old, ["trainer.bf16_autocast=false"])
    assert config.model.dtype == "bfloat16" and config.model.param_dtype == "float32"
    assert "bf16_autocast" not in config.trainer.model_dump()
    assert [r.getMessage() for r in caplog.records if "bf16_autocast" in r.getMessage()] == [
        "config: trainer.bf16_autocast no longer does anything and was ignored; model.dtype (the compute dtype: "
        "bfloat16 autocasts forwards and keeps fp32 master weights, on CPU and GPU alike) decides now"
    ]


# the advantage, policy-loss and KL settings, flat before issue 38, and their places now
SECTION_KEYS = {
    "adv_estimator": ("advantage.estimator", "rloo"),
    "norm_adv_by_std": ("advantage.norm_by_std", False),
    "adv_epsilon": ("advantage.epsilon", 1e-4),
    "adv_std_scope": ("advantage.std_scope", "group"),
    "gamma": ("advantage.gamma", 0.99),
    "lam": ("advantage.lam", 0.95),
    "policy_loss": ("policy_loss.name", "sapo"),
    "policy_loss_kwargs": ("policy_loss.kwargs", {"tau_pos": 1.0, "tau_neg": 1.05}),
    "clip_low": ("policy_loss.clip_low", 0.1),
    "clip_high": ("policy_loss.clip_high", 0.28),
    "loss_agg_mode": ("policy_loss.agg_mode", "seq-mean-token-mean"),
    "use_kl_loss": ("kl.use_loss", True),
    "kl_loss_coef": ("kl.loss_coef", 0.02),
    "kl_loss_type": ("kl.loss_type", "k2"),
    "use_kl_in_reward": ("kl.use_in_reward", True),
    "kl_in_reward_type": ("kl.reward_type", "k3"),
    "kl_controller": ("kl.controller", "adaptive"),
    "kl_coef": ("kl.reward_coef", 0.05),
    "target_kl": ("kl.target", 3.0),
    "kl_horizon": ("kl.horizon", 500),
}


def _nested(pairs: dict[str, object]) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for dotted, value in pairs.items():
        section, leaf = dotted.split(".")
        out.setdefault(section, {})[leaf] = value
    return out


def test_flat_objective_keys_load_into_their_sections_from_a_file_and_the_command_line(tmp_path: Path) -> None:
    from rlloom.core_rl.config.renamed import LOSS_NAME, RENAMED_KEYS

    assert set(SECTION_KEYS) == {*RENAMED_KEYS, "policy_loss"} - {"dual_clip"}  # dual_clip: not with sapo, below
    assert {new for new, _ in SECTION_KEYS.values()} | {"policy_loss.dual_clip"} == {*RENAMED_KEYS.values(), LOSS_NAME}
    new = _nested(dict(SECTION_KEYS.values()))
    expected = load_config(None, ["model.path=/m", *(f"algorithm.{s}={v}" for s, v in new.items())])
    assert expected.algorithm.policy_loss.kwargs == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert expected.algorithm.kl.horizon == 500 and expected.algorithm.advantage.lam == 0.95
    flat_file = tmp_path / "flat.yaml"
    flat_file.write_text(
        yaml.safe_dump({"model": {"path": "/m"}, "algorithm": {k: v for k, (_, v) in SECTION_KEYS.items()}})
    )
    assert load_config(flat_file) == expected
    overrides = [f"algorithm.{key}={json.dumps(value)}" for key, (_, value) in SECTION_KEYS.items()]
    assert load_config(None, ["model.path=/m", *overrides]) == expected
    # one entry of the renamed mapping, and the dual clip of a loss that has one
    tau = load_config(None, ["model.path=/m", "algorithm.policy_loss=sapo", "algorithm.policy_loss_kwargs.tau_neg=2"])
    assert tau.algorithm.policy_loss.kwargs == {"tau_neg": 2.0}
    dual = load_config(None, ["model.path=/m", "algorithm.dual_clip=3"]).algorithm.policy_loss
    assert (dual.name, dual.dual_clip) == ("ppo", 3.0)


def test_an_override_of_either_form_wins_over_a_file_of_either_form(tmp_path: Path) -> None:
    flat = tmp_path / "flat.yaml"
    flat.write_text("model: {path: /m}\nalgorithm:\n  clip_high: 0.28\n  policy_loss: ppo\n")
    nested = tmp_path / "nested.yaml"
    nested.write_text("model: {path: /m}\nalgorithm:\n  policy_loss: {name: ppo, clip_high: 0.28}\n")
    for path in (flat, nested):
        for override in ("algorithm.clip_high=0.3", "algorithm.policy_loss.clip_high=0.3"):
            loss = load_config(path, [override]).algorithm.policy_loss
            assert (loss.name, loss.clip_high) == ("ppo", 0.3), (path.name, override)


def test_a_flat_key_and_its_new_key_disagreeing_in_one_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text("model: {path: /m}\nalgorithm:\n  use_kl_loss: true\n  kl: {use_loss: false}\n")
    with pytest.raises(ConfigError, match=r"algorithm.use_kl_loss: given as well as algorithm.kl.use_loss=False"):
        load_config(path)
    path.write_text("model: {path: /m}\nalgorithm:\n  use_kl_loss: true\n  kl: {use_loss: true}\n")
    assert load_config(path).algorithm.kl.use_loss


def test_each_renamed_key_gets_one_hint(caplog: pytest.LogCaptureFixture) -> None:
    from rlloom.core_rl.config import migration as config_migration

    config_migration._hinted.discard("algorithm.kl_loss_coef")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            load_config(None, ["model.path=/m", "algorithm.kl_loss_coef=0.01"])
    hints = [r.getMessage() for r in caplog.records if "algorithm.kl_loss_coef" in r.getMessage()]
    assert hints == [
        "config: algorithm.kl_loss_coef is now algorithm.kl.loss_coef; it was read as that (write the new key to "
        "silence this)"
    ]
