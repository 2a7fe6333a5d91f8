"""veRL's Hydra keys work as aliases of ours on the command line (issue 29): a veRL GRPO or Search-R1 command line
loads after changing the entry point; keys with no meaning here are refused, naming the fix."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ConfigError

MODEL = "model.path=/m"


def test_verl_keys_set_our_keys_and_one_info_line_lists_them(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rlloom.core_rl.config.compat.verl_aliases"):
        cfg = load_config(
            None,
            [
                MODEL,
                "actor_rollout_ref.actor.optim.lr=3e-6",
                "data.train_batch_size=16",
                "algorithm.advantage.estimator=rloo",
                "actor_rollout_ref.rollout.n=6",
                "trainer.total_training_steps=7",
                "algorithm.kl_ctrl.kl_coef=0.002",
                "actor_rollout_ref.actor.entropy_coeff=0.01",
                "data.max_response_length=1024",
            ],
        )
    assert cfg.actor.lr == 3e-6
    assert cfg.data.train_batch_size == 16
    assert cfg.algorithm.advantage.estimator == "rloo"
    assert cfg.rollout.n == 6
    assert cfg.trainer.total_steps == 7
    assert cfg.algorithm.kl.reward_coef == 0.002
    assert cfg.algorithm.entropy.coef == 0.01
    assert cfg.rollout.max_tokens == 1024
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "actor_rollout_ref.actor.optim.lr -> actor.lr" in lines[0]
    assert "data.max_response_length -> rollout.max_tokens" in lines[0]
    assert "algorithm.policy_loss.dual_clip=3" in lines[0]  # veRL's default dual clip is named, since it is not ours
    assert cfg.algorithm.policy_loss.dual_clip is None


def test_values_are_translated_where_verl_spells_them_differently() -> None:
    cfg = load_config(
        None,
        [
            MODEL,
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "actor_rollout_ref.rollout.top_k=-1",
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            "actor_rollout_ref.actor.kl_loss_type=mse",
            "trainer.resume_mode=disable",
        ],
    )
    assert (cfg.trainer.save_every, cfg.trainer.val_every, cfg.rollout.top_k) == (0, 0, 0)
    assert cfg.algorithm.policy_loss.name == "ppo"
    assert cfg.algorithm.kl.loss_type == "k2"
    assert cfg.trainer.resume == "never"


def test_ppo_mini_batch_size_is_prompts_as_in_verl_and_trajectories_with_search_r1s_n_agent() -> None:
    verl = load_config(None, [MODEL, "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.actor.ppo_mini_batch_size=8"])
    assert verl.actor.mini_batch_size == 8  # veRL multiplies it by rollout.n: prompts, as here
    fork = ["actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.rollout.n_agent=5"]
    assert load_config(None, [MODEL, *fork]).actor.mini_batch_size == 52


def test_clip_ratio_sets_both_bounds_and_the_specific_one_wins_in_any_order() -> None:
    for order in (1, -1):
        items = ["actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio=0.1"]
        cfg = load_config(None, [MODEL, *items[::order]])
        assert (cfg.algorithm.policy_loss.clip_low, cfg.algorithm.policy_loss.clip_high) == (0.1, 0.28)


def test_filter_groups_turn_dynamic_sampling_on_keeping_the_files_settings(tmp_path: Path) -> None:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("model:\n  path: /m\nalgorithm:\n  dynamic_sampling:\n    filter_key: acc\n")
    cfg = load_config(
        yaml_file, ["algorithm.filter_groups.max_num_gen_batches=10", "algorithm.filter_groups.enable=true"]
    )
    assert cfg.algorithm.dynamic_sampling is not None
    assert (cfg.algorithm.dynamic_sampling.filter_key, cfg.algorithm.dynamic_sampling.max_rounds) == ("acc", 10)
    off = load_config(yaml_file, ["algorithm.filter_groups.enable=false"])
    assert off.algorithm.dynamic_sampling is None
    with pytest.raises(ConfigError, match="max_num_gen_batches <= 0 means unlimited"):
        load_config(yaml_file, ["algorithm.filter_groups.max_num_gen_batches=0"])


@pytest.mark.parametrize(
    ("item", "hint"),
    [
        ("trainer.n_gpus_per_node=8", "distributed.num_ranks"),
        ("data.train_files=x.parquet", "--train-data"),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size=128", "actor_rollout_ref is split here"),
        ("actor_rollout_ref.rollout.name=sglang", "use vllm or hf"),
        ("trainer.resume_mode=resume_path", "resume_from_path"),
    ],
)
def test_keys_without_a_meaning_here_stay_clear_errors(item: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint):
        load_config(None, [MODEL, item])


# Search-R1's train_grpo.sh (github.com/PeterGriffinJin/Search-R1), $VARS filled in
SEARCH_R1 = [
    "data.train_files=data/train.parquet",
    "data.val_files=data/test.parquet",
    "data.train_data_num=null",
    "data.val_data_num=null",
    "data.train_batch_size=512",
    "data.val_batch_size=256",
    "data.max_prompt_length=4096",
    "data.max_response_length=500",
    "data.max_start_length=2048",
    "data.max_obs_length=500",
    "data.shuffle_train_dataloader=True",
    "algorithm.advantage.estimator=grpo",
    "actor_rollout_ref.model.path=/models/qwen",
    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.285",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size=64",
    "actor_rollout_ref.actor.fsdp_config.param_offload=true",
    "actor_rollout_ref.actor.fsdp_config.grad_offload=true",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size=128",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.ref.log_prob_micro_batch_size=128",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "algorithm.no_think_rl=false",
    "actor_rollout_ref.rollout.n_agent=5",
    "actor_rollout_ref.rollout.temperature=1",
    "actor_rollout_ref.actor.state_masking=true",
    "trainer.logger=['wandb']",
    "+trainer.val_only=false",
    "+trainer.val_before_train=true",
    "trainer.default_hdfs_dir=null",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=100",
    "trainer.test_freq=50",
    "trainer.project_name=Search-R1",
    "trainer.experiment_name=nq-search-r1-grpo-qwen2.5-3b-em",
    "trainer.total_epochs=15",
    "trainer.total_training_steps=1005",
    "trainer.default_hdfs_dir=null",
    "trainer.default_local_dir=verl_checkpoints/nq-search-r1-grpo-qwen2.5-3b-em",
    "max_turns=2",
    'retriever.url="http://127.0.0.1:8000/retrieve"',
    "retriever.topk=3",
]

# refused on purpose: data files are the app's flags; GPU/FSDP/micro-batch settings have no meaning (micro-
# batches fill actor.max_tokens_per_micro_batch); Search-R1's own keys (state masking is always on, data caps, the
# retriever is --retrieval-url, max_turns counts differently: search.max_turns); Hydra's `+` prefix
REFUSED_PREFIXES = (
    "data.train_files",
    "data.val_files",
    "data.train_data_num",
    "data.val_data_num",
    "data.val_batch_size",
    "data.max_start_length",
    "data.max_obs_length",
    "data.shuffle_train_dataloader",
    "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.actor.fsdp_config.",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.ref.",
    "actor_rollout_ref.actor.state_masking",
    "algorithm.no_think_rl",
    "+trainer.",
    "trainer.default_hdfs_dir",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "max_turns",
    "retriever.",
)


def test_search_r1_command_line_loads_with_the_search_agents_grpo_config() -> None:
    settings = pytest.importorskip("rlloom_apps.search_agent.settings")
    import rlloom_apps.search_agent as app

    bundled = Path(app.__file__).parent / "configs" / "grpo.yaml"
    kept = [item for item in SEARCH_R1 if not item.startswith(REFUSED_PREFIXES)]
    for item in SEARCH_R1:
        if item.startswith(REFUSED_PREFIXES):
            with pytest.raises(ConfigError):
                settings.load_train_config(bundled, [item])
    cfg, search = settings.load_train_config(bundled, kept)
    assert cfg.model.path == "/models/qwen"
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.rollout.max_tokens) == (512, 4096, 500)
    assert (cfg.rollout.n, cfg.rollout.temperature) == (5, 1.0)
    assert cfg.actor.padding_free  # use_remove_padding: packed micro-batches (varlen attention on a GPU)
    # vLLM rollouts, as Search-R1 runs them: the engine and its memory share
    assert (cfg.rollout.engine, cfg.rollout.vllm.gpu_memory_utilization) == ("vllm", 0.6)
    assert cfg.rollout.vllm.tensor_parallel_size == 1
    # Search-R1's fork counts ppo_mini_batch_size in trajectories: 256 of n_agent 5 is 52 prompts (ceil)
    assert (cfg.actor.lr, cfg.actor.warmup_ratio, cfg.actor.mini_batch_size) == (1e-6, 0.285, 52)
    assert cfg.algorithm.kl.use_loss and cfg.algorithm.kl.loss_coef == 0.001
    assert cfg.algorithm.kl.loss_type == "low_var_kl"
    assert (cfg.trainer.save_every, cfg.trainer.val_every, cfg.trainer.total_steps) == (100, 50, 1005)
    assert cfg.trainer.trackers == ["wandb"]
    assert (cfg.trainer.project, cfg.trainer.run_name) == ("Search-R1", "nq-search-r1-grpo-qwen2.5-3b-em")
    assert cfg.trainer.output_dir == "verl_checkpoints/nq-search-r1-grpo-qwen2.5-3b-em"
    assert search.top_k == 3  # the bundled value (Search-R1's retriever.topk=3 is the app's search.top_k)


@pytest.mark.parametrize(("verl", "ours"), [("grpo_vectorized", "grpo"), ("rloo_vectorized", "rloo")])
def test_verl_vectorized_estimator_names_are_the_same_estimators(verl: str, ours: str) -> None:
    from rlloom.core_rl.algorithms.estimators import get_advantage_estimator as get_advantage

    assert get_advantage(verl) is get_advantage(ours)
    assert load_config(None, [MODEL, f"algorithm.advantage.estimator={verl}"]).algorithm.advantage.estimator == verl
