"""The bundled `grpo.yaml` reproduces Search-R1's published GRPO run (scripts/nq_hotpotqa/v0.2/train_grpo.sh with
verl/trainer/config/ppo_trainer.yaml defaults, github.com/PeterGriffinJin/Search-R1)."""

from __future__ import annotations

from rlloom_apps.search_agent.settings import CONFIGS, load_train_config

# Search-R1's published values (v0.2 launch script + its ppo_trainer.yaml)
TRAIN_BATCH_SIZE = 512  # data.train_batch_size
N_AGENT = 5  # actor_rollout_ref.rollout.n_agent
ROLLOUT_N = 1  # ppo_trainer.yaml rollout.n (fsdp_workers.py multiplies ppo_mini_batch_size by it)
PPO_MINI_BATCH_SIZE = 256  # actor_rollout_ref.actor.ppo_mini_batch_size


def _optimizer_steps(rows: int, mini_batch_rows: int) -> int:
    return len(range(0, rows, mini_batch_rows))  # veRL's batch.split / rlloom's ppo_minibatches: last one smaller


def test_grpo_makes_search_r1s_ten_optimizer_steps_per_training_step() -> None:
    published = _optimizer_steps(TRAIN_BATCH_SIZE * N_AGENT, PPO_MINI_BATCH_SIZE * ROLLOUT_N)
    assert published == 10
    cfg, _ = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/models/x"])
    assert (cfg.data.train_batch_size, cfg.rollout.n) == (TRAIN_BATCH_SIZE, N_AGENT)
    rows = cfg.data.train_batch_size * cfg.rollout.n
    assert _optimizer_steps(rows, cfg.mini_batch_rows("actor")) == published
    assert cfg.actor.ppo_epochs == 1


def test_grpo_sampling_and_schedule_match_the_published_run() -> None:
    cfg, search = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/models/x"])
    assert (cfg.rollout.temperature, cfg.rollout.top_p) == (1.0, 0.95)
    assert (cfg.trainer.total_steps, cfg.trainer.val_every, cfg.trainer.save_every) == (1005, 100, 100)
    assert cfg.actor.lr == 1e-6 and cfg.actor.warmup_ratio == 0.285
    assert (search.top_k, search.max_turns) == (3, 5)  # max_turns=4 searches + the answer turn


def test_the_8_gpu_config_is_grpo_on_8_ranks() -> None:
    one, search_one = load_train_config(CONFIGS / "grpo.yaml", ["model.path=/models/x"])
    eight, search_eight = load_train_config(CONFIGS / "grpo_8gpu.yaml", ["model.path=/models/x"])
    assert eight.distributed.num_ranks == 8 and one.distributed.num_ranks == 1
    assert search_eight == search_one
    skip = {"distributed", "trainer", "rollout"}
    assert eight.model_dump(exclude=skip) == one.model_dump(exclude=skip)
    vllm = {"engine", "vllm"}  # rollouts on vLLM, as Search-R1's 8-GPU run: its rollout.name and memory share
    assert eight.rollout.model_dump(exclude=vllm) == one.rollout.model_dump(exclude=vllm)
    assert (eight.rollout.engine, one.rollout.engine) == ("vllm", "hf")
    assert (eight.rollout.vllm.gpu_memory_utilization, eight.rollout.vllm.tensor_parallel_size) == (0.6, 1)
    assert eight.trainer.model_dump(exclude={"output_dir"}) == one.trainer.model_dump(exclude={"output_dir"})
