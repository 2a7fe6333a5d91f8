"""`rollout.engine` and `rollout.vllm` (issue 30): the rollout engine is config, with colocated vLLM defaults, set
from YAML, dotted overrides or veRL's names, and a wrong value names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError

MODEL = "model.path=/m"


def test_default_is_hf_and_the_vllm_section_is_colocated() -> None:
    cfg = load_config(None, [MODEL])
    assert cfg.rollout.engine == "hf"
    vllm = cfg.rollout.vllm
    assert vllm.gpu_memory_utilization == 0.5  # half the GPU left to the actor
    assert vllm.enable_prefix_caching and vllm.tensor_parallel_size == 1
    assert vllm.enable_sleep_mode is None  # where the platform has it


def test_yaml_and_overrides_set_the_engine_and_its_settings(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  engine: vllm\n  vllm:\n    gpu_memory_utilization: 0.4\n    enforce_eager: true\n")
    cfg = load_config(path, [MODEL, "rollout.vllm.max_model_len=4096"])
    assert cfg.rollout.engine == "vllm"
    assert (cfg.rollout.vllm.gpu_memory_utilization, cfg.rollout.vllm.enforce_eager) == (0.4, True)
    assert cfg.rollout.vllm.max_model_len == 4096 and cfg.rollout.vllm.enable_prefix_caching


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("rollout.engine=sglang", "rollout.engine"),
        ("rollout.vllm.gpu_memory_utilization=1.5", "rollout.vllm.gpu_memory_utilization"),
        ("rollout.vllm.gpu_mem=0.5", "unknown key 'rollout.vllm.gpu_mem'.*gpu_memory_utilization"),
    ],
)
def test_bad_values_and_keys_name_the_key(item: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(None, [MODEL, item])


def test_verl_rollout_keys_map_onto_the_section() -> None:
    cfg = load_config(
        None,
        [
            MODEL,
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.max_model_len=8192",
            "actor_rollout_ref.rollout.dtype=bfloat16",
            "actor_rollout_ref.rollout.max_num_seqs=64",
        ],
    )
    vllm = cfg.rollout.vllm
    assert cfg.rollout.engine == "vllm"
    assert (vllm.gpu_memory_utilization, vllm.tensor_parallel_size, vllm.enforce_eager) == (0.6, 2, True)
    assert (vllm.max_model_len, vllm.dtype, vllm.max_num_seqs) == (8192, "bfloat16", 64)


def test_vllm_dtype_is_unset_by_default_and_checked() -> None:
    assert load_config(None, [MODEL]).rollout.vllm.dtype is None  # the actor's compute dtype
    with pytest.raises(ConfigError, match="rollout.vllm.dtype"):
        load_config(None, [MODEL, "rollout.vllm.dtype=fp8"])
