"""`reasoning train --dry-run` resolves a veRL-style command line without torch: the whole config as YAML, veRL's
keys read as ours, and its infrastructure keys (micro-batch sizes, nnodes=1, default_hdfs_dir=null) listed once with
why they change nothing (issue 40 item 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

_CLI = """
import sys
from rlloom_apps.reasoning.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("exit", exit.code)
print("torch" in sys.modules, "transformers" in sys.modules)
"""

# veRL's examples/grpo_trainer/run_qwen2-7b.sh style keys (the ones that are not data files)
VERL = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.rollout.n=5",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.default_hdfs_dir=null",
]


def _run(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    rows = tmp_path / "rows.jsonl"
    row = {
        "prompt": [{"role": "user", "content": "1+1?"}],
        "reward_model": {"ground_truth": "2"},
        "data_source": "openai/gsm8k",
    }
    rows.write_text(json.dumps(row) + "\n")
    args = ["train", "--dry-run", "--train-data", str(rows), f"model.path={tmp_path}", *extra]
    done = subprocess.run([sys.executable, "-c", _CLI, *args], capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


def test_dry_run_resolves_a_verl_command_line_without_torch(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, *VERL)
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "False False" and "exit" not in out
    resolved = yaml.safe_load("\n".join(line for line in out.splitlines()[:-1] if not line.startswith("#")))
    assert resolved["distributed"]["num_ranks"] == 8  # n_gpus_per_node x nnodes
    assert (resolved["rollout"]["n"], resolved["actor"]["lr"], resolved["actor"]["mini_batch_size"]) == (5, 1e-6, 256)
    assert resolved["algorithm"]["advantage"]["estimator"] == "grpo"
    ignored = [line for line in out.splitlines() if line.startswith("#   ignored:")]
    assert len(ignored) == 4  # three micro-batch sizes and the HDFS folder, each once
    assert "#   mapped:  trainer.n_gpus_per_node=8 x trainer.nnodes=1 -> distributed.num_ranks=8" in out


def test_dry_run_refuses_what_it_cannot_honour(tmp_path: Path) -> None:
    _, out, err = _run(tmp_path, "trainer.default_hdfs_dir=hdfs://cluster/ckpt")
    assert out.strip().splitlines() == ["exit 2", "False False"]
    assert "'trainer.default_hdfs_dir=hdfs://cluster/ckpt'" in err and "trainer.output_dir" in err
