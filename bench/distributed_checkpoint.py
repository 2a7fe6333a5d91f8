"""Checkpoint save time and bytes per rank: DCP shards (what a ranked run writes now) vs the full-state save.

One FSDP2 actor on T Ray ranks (gloo, one thread each), trained one update so AdamW has its moments, then saved
both ways into the same kind of step folder, alternating the two each repeat:

- full (before issue 27): every rank gathers the whole optimizer state (`full_training_state`), the driver
  fetches rank 0's copy through Ray and `torch.save`s it into trainer_state.pt, and rank 0 gathers the weights
  and writes HF safetensors;
- sharded: each rank writes its own shard of weights + optimizer with `torch.distributed.checkpoint`, the
  driver `torch.save`s only the small scheduler/shuffling state.

Reported: median wall time of the save as the driver sees it, bytes each process wrote, and the full-size
state bytes each process built in memory for the save (the full way: 2 moments x parameters on every rank).
Then both checkpoints are read back on the same ranks and their weights compared (they must be equal).

Run: .venv/bin/python bench/distributed_checkpoint.py [--ranks 2] [--repeats 3] [--hidden 512 --layers 8]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.distributed.ray_group import RayActorGroup
from rlloom.core_rl.run.sharded_checkpoint import resolved, shard_bytes, shards_path
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm

CPU = torch.device("cpu")


def make_batch(vocab: int, rows: int = 4) -> TrajectoryBatch:
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(rows):
        ids = torch.randint(10, vocab, (16 + 32,), generator=gen).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:16], response_ids=ids[16:], loss_mask=[1] * 32, group_id=str(i)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def folder_bytes(path: Path) -> int:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file())


def save_full(group: RayActorGroup, step: Path) -> dict[str, int]:
    step.mkdir(parents=True)
    state = group.state_dict()  # every rank gathers the whole optimizer; Ray brings rank 0's to the driver
    group.save_pretrained(str(step))  # rank 0 gathers and writes the HF weights
    torch.save({"actor": state}, step / "trainer_state.pt")
    return {"rank 0": folder_bytes(step) - (step / "trainer_state.pt").stat().st_size,
            "driver": (step / "trainer_state.pt").stat().st_size}  # fmt: skip


def save_sharded(group: RayActorGroup, step: Path, ranks: int) -> dict[str, int]:
    step.mkdir(parents=True)
    group.save_shards(str(shards_path(step, "actor")))
    torch.save({"actor": group.shard_state()}, step / "trainer_state.pt")
    files = shard_bytes(shards_path(step, "actor"))
    written = {f"rank {r}": files[f"__{r}_0.distcp"] for r in range(ranks)}
    written["rank 0"] += files[".metadata"] + files["config.json"]
    written["driver"] = (step / "trainer_state.pt").stat().st_size
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-dcp-"))
    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, hidden_size=args.hidden, num_layers=args.layers, intermediate_size=4 * args.hidden)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    n_params = sum(p.numel() for p in model.parameters())
    cfg = RLConfig.model_validate(
        {
            "model": {"path": str(root / "model")},
            "rollout": {"n": 1, "max_tokens": 32},
            "algorithm": {"advantage": {"estimator": "reinforce_plus_plus"}},
            "actor": {"lr": 1e-5, "ppo_epochs": 1, "mini_batch_size": 4, "max_tokens_per_micro_batch": 512},
            "trainer": {"device": "cpu", "seed": 0},
            "distributed": {"num_ranks": args.ranks, "cpus_per_rank": 1.0, "timeout_s": 600},
        }
    )
    ray.init(num_cpus=args.ranks, include_dashboard=False, log_to_driver=False)
    group = RayActorGroup(cfg, total_steps=10, weights_path=str(root / "model"), with_reference=False)
    # one update, so AdamW holds its moments (their size is what a checkpoint is mostly made of)
    batch = make_batch(model.config.vocab_size)
    batch["old_logprobs"] = group.compute_logprobs(batch, temperature=1.0)[0]
    group.update_policy(batch)

    times: dict[str, list[float]] = {"full": [], "sharded": []}
    written: dict[str, dict[str, int]] = {}
    for repeat in range(args.repeats):
        for kind in ("full", "sharded") if repeat % 2 == 0 else ("sharded", "full"):
            step = root / kind / f"step_{repeat}"
            start = time.perf_counter()
            written[kind] = save_full(group, step) if kind == "full" else save_sharded(group, step, args.ranks)
            times[kind].append(time.perf_counter() - start)
            if repeat < args.repeats - 1:
                shutil.rmtree(step)

    # both read back: the sharded one on the ranks (from the base weights), the full one in one process
    last = args.repeats - 1
    shards_step = root / "sharded" / f"step_{last}"
    saved = dict(group.named_weights())
    group.close()
    fresh = RayActorGroup(cfg, total_steps=10, weights_path=str(root / "model"), with_reference=False)
    fresh.load_state_dict(resolved(torch.load(shards_step / "trainer_state.pt")["actor"], shards_step))
    reloaded = dict(fresh.named_weights())
    fresh.close()
    full_step = root / "full" / f"step_{last}"
    one = PolicyActor(load_causal_lm(cfg.model, str(full_step), CPU), actor=cfg.actor, algorithm=cfg.algorithm,
                      total_steps=10, mini_batch_rows=4, max_response_length=32, device=CPU)  # fmt: skip
    one.load_state_dict(torch.load(full_step / "trainer_state.pt", weights_only=False)["actor"])
    same = all(torch.equal(reloaded[k], v) and torch.equal(one.model.state_dict()[k], v) for k, v in saved.items())
    ray.shutdown()

    moments = 2 * 4 * n_params  # fp32 exp_avg + exp_avg_sq at full size
    print(f"{n_params / 1e6:.1f}M parameters (fp32), {args.ranks} gloo ranks, median of {args.repeats} saves")
    print(f"{'':10} {'save s':>8} " + " ".join(f"{k:>14}" for k in written["sharded"]) + "  full-size state built")
    for kind in ("full", "sharded"):
        cells = " ".join(f"{written[kind].get(k, 0) / 2**20:>11.2f} MiB" for k in written["sharded"])
        built = f"{moments / 2**20:.1f} MiB on every rank" if kind == "full" else "none"
        print(f"{kind:10} {statistics.median(times[kind]):>8.3f} {cells}  {built}")
    print(f"weights read back equal to the saved ones (both formats): {same}")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
