"""The FSDP2 actor on Ray ranks against the in-process actor, on the same cores, in one run.

Both train the same model on the same batch (13 rows: it does not divide the ranks) with the same config. The
in-process `PolicyActor` gets all T threads; the group gets T ranks of one thread each. Reported:

- per-process memory kept between steps (parameters + AdamW moments), measured from the tensors each process
  holds (its shard under FSDP2): the saving sharding exists for;
- wall-time medians of `compute_logprobs` and `update_policy`, alternating the two sides each repeat;
- the largest weight difference after the timed updates (the two must train the same model).

On a CPU the ranks pay for gloo collectives that a GPU's NCCL makes cheap, so the time ratio here is the overhead
floor of the design, not a speed-up claim.

Then whole RL steps (`Trainer.fit`: rollout with rlloom.rollout's HFEngine, log-probs, update, weight sync), the
same global batch each: 1 process (T threads) vs T ranks with one engine on the driver
(`distributed.rollout_on_ranks=false`) vs T ranks with an engine each (the default): medians of `timing/*_s`
over the steps after the first, and ratios to 1 process. `--engine vllm` samples with vLLM instead (the
engine `rlloom.rollout.training_engine` builds: on the driver, or a replica on each rank), head size 64 for
vLLM's CPU attention; run it with the vLLM venv's Python (`.nox/tests-vllm/bin/python`).

Run: .venv/bin/python bench/distributed.py [--ranks 2] [--repeats 5] [--hidden 384 --layers 6] [--steps 4]
     [--part actor|steps|all] [--engine hf|vllm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ray
import torch

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.protocols import RewardOutput
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.distributed.ray_group import RayActorGroup
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.rollout.training_engine import build_training_engine

CPU = torch.device("cpu")


def make_batch(vocab: int, rows: int, prompt_len: int, response_len: int) -> TrajectoryBatch:
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(rows):
        r = response_len - (i * 7) % (response_len // 2)  # ragged lengths
        ids = torch.randint(10, vocab, (prompt_len + r,), generator=gen).tolist()
        prompt, response = ids[:prompt_len], ids[prompt_len:]
        trajs.append(Trajectory(prompt_ids=prompt, response_ids=response, loss_mask=[1] * r, group_id=str(i // 4)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def length_reward(trajectories: list[Trajectory]) -> list[RewardOutput]:
    """Any reward with spread will do: the timings are the point."""
    return [RewardOutput(score=len(t.response_text) / 64) for t in trajectories]


STEP_PHASES = ("step", "rollout", "old_logprobs", "update_actor", "weight_sync")


def step_times(root: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Median seconds per phase of `Trainer` steps 2.. for each placement of the engine, same global batch."""
    tokenizer = char_tokenizer()
    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i + 3}="}], "ground_truth": str(2 * i + 3)}
            for i in range(64)]  # fmt: skip
    variants = {
        "1 process": {"num_ranks": 1},
        f"{args.ranks} ranks, one driver engine": {"num_ranks": args.ranks, "rollout_on_ranks": False},
        f"{args.ranks} ranks, an engine each": {"num_ranks": args.ranks, "rollout_on_ranks": True},
    }
    out: dict[str, dict[str, float]] = {}
    rollout: dict[str, object] = {"n": 4, "max_tokens": 64, "engine": args.engine}
    if args.engine == "vllm":
        rollout["vllm"] = {"enforce_eager": True, "max_model_len": 256, "cpu_kvcache_space_gib": 1}
    for name, distributed in variants.items():
        folder = root / name.replace(" ", "_").replace(",", "")
        cfg = RLConfig.model_validate(
            {
                # the tokenizer in a folder of its own: vLLM would load the model folder's as a Qwen2Tokenizer
                "model": {"path": str(root), "tokenizer_path": str(root / "tokenizer")},
                "data": {"train_batch_size": 8},
                "rollout": rollout,
                "actor": {"lr": 1e-5, "ppo_epochs": 1, "mini_batch_size": 8, "max_tokens_per_micro_batch": 4096},
                "trainer": {"device": "cpu", "seed": 0, "total_steps": args.steps, "trackers": ["jsonl"],
                            "output_dir": str(folder)},
                "distributed": {**distributed, "cpus_per_rank": 1.0, "timeout_s": 1200},
            }
        )  # fmt: skip
        built = build_training_engine(cfg, tokenizer)  # hf: HFEngine on the actor's module or a copy of it
        trainer = Trainer(cfg, **built.trainer_kwargs(), reward_fn=length_reward, train_data=rows)
        trainer.fit()
        close_engine = getattr(trainer.engine, "close", None)
        if callable(close_engine):
            close_engine()  # the rank replicas (vLLM's processes), or the engine on the driver
        if isinstance(trainer.parts.actor, RayActorGroup):
            trainer.parts.actor.close()
        built.close()
        lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][1:]
        out[name] = {p: statistics.median(m.get(f"timing/{p}_s", 0.0) for m in lines) for p in STEP_PHASES}
        # the same work in every placement: a replica that stopped early would look fast
        out[name]["response_tokens"] = statistics.median(m.get("response_length/mean", 0.0) for m in lines)
    return out


def print_step_times(times: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    base = next(iter(times.values()))["step"]
    print(
        f"\nRL step (8 prompts x 4 samples, up to 64 tokens, {args.engine}), medians of steps 2-{args.steps}, "
        f"{args.ranks} cores:"
    )
    print(
        "| placement | step s | rollout s | old log-probs s | update s | weight sync s | mean response tokens "
        "| step vs 1 process |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, med in times.items():
        cells = " | ".join(f"{med[p]:.2f}" for p in STEP_PHASES)
        print(f"| {name} | {cells} | {med['response_tokens']:.1f} | {med['step'] / base:.2f}x |")


def actor_part(args: argparse.Namespace, cfg: RLConfig, root: Path, vocab: int, n_params: int) -> None:
    """compute_logprobs / update_policy: the in-process actor against the sharded group, and memory per process."""
    group = RayActorGroup(cfg, total_steps=100, weights_path=str(root), with_reference=False)
    single = PolicyActor(
        load_causal_lm(cfg.model, str(root), CPU),
        actor=cfg.actor,
        algorithm=cfg.algorithm,
        total_steps=100,
        mini_batch_rows=13,
        max_response_length=96,
        device=CPU,
    )
    batch = make_batch(vocab, rows=13, prompt_len=32, response_len=96)
    old, _ = single.compute_logprobs(batch, temperature=1.0)
    batch["old_logprobs"] = old
    single.update_policy(batch)  # warm-up (and creates the AdamW moments on both sides)
    group.update_policy(batch)

    times: dict[str, list[float]] = {k: [] for k in ("lp_single", "lp_group", "upd_single", "upd_group")}
    for _ in range(args.repeats):
        times["lp_single"].append(timed(lambda: single.compute_logprobs(batch, temperature=1.0)))
        times["lp_group"].append(timed(lambda: group.compute_logprobs(batch, temperature=1.0)))
        times["upd_single"].append(timed(lambda: single.update_policy(batch)))
        times["upd_group"].append(timed(lambda: group.update_policy(batch)))
    med = {k: statistics.median(v) for k, v in times.items()}

    mem_single = single.state_bytes()
    mem_ranks = group.call("actor", "state_bytes")
    weights = group.named_weights()
    diff = max(float((weights[k] - v).abs().max()) for k, v in single.model.state_dict().items())
    group.close()

    mb = 2**20
    total_single = sum(mem_single.values())
    print(f"model: {n_params / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers), batch 13 rows")
    print("| process | parameters MiB | AdamW moments MiB | total MiB | vs in-process |")
    print("|---|---|---|---|---|")
    print(f"| in-process actor | {mem_single['parameters'] / mb:.1f} | {mem_single['optimizer'] / mb:.1f} | "
          f"{total_single / mb:.1f} | 1.00x |")  # fmt: skip
    for rank, mem in enumerate(mem_ranks):
        total = sum(mem.values())
        print(f"| rank {rank} of {args.ranks} | {mem['parameters'] / mb:.1f} | {mem['optimizer'] / mb:.1f} | "
              f"{total / mb:.1f} | {total / total_single:.2f}x |")  # fmt: skip
    print(f"\nmedians of {args.repeats} (same {args.ranks} cores; in-process {args.ranks} threads, ranks 1 each):")
    for what, a, b in (("compute_logprobs", "lp_single", "lp_group"), ("update_policy", "upd_single", "upd_group")):
        print(f"  {what}: in-process {med[a]:.3f} s, {args.ranks} ranks {med[b]:.3f} s, "
              f"ranks/in-process {med[b] / med[a]:.2f}x")  # fmt: skip
    print(f"max |weight difference| after {args.repeats + 1} updates: {diff:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4, help="Trainer steps per placement (the first is warm-up)")
    parser.add_argument("--part", choices=("actor", "steps", "all"), default="all")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="rollout engine of the steps part")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="rlloom-bench-dist-"))
    tokenizer = char_tokenizer()
    heads = {"num_heads": args.hidden // 64, "num_kv_heads": 1} if args.engine == "vllm" else {}  # head size 64
    model = tiny_qwen2(
        tokenizer, hidden_size=args.hidden, num_layers=args.layers, intermediate_size=4 * args.hidden, **heads
    )
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    tokenizer.save_pretrained(root / "tokenizer")
    n_params = sum(p.numel() for p in model.parameters())
    cfg = RLConfig.model_validate(
        {
            "model": {"path": str(root)},
            "rollout": {"n": 1, "max_tokens": 96},
            "algorithm": {"advantage": {"estimator": "reinforce_plus_plus"}},  # one sample per prompt: no groups
            "actor": {"lr": 1e-5, "ppo_epochs": 1, "mini_batch_size": 13, "max_tokens_per_micro_batch": 1024},
            "trainer": {"device": "cpu", "seed": 0},
            "distributed": {"num_ranks": args.ranks, "cpus_per_rank": 1.0, "timeout_s": 600},
        }
    )
    torch.set_num_threads(args.ranks)
    ray.init(num_cpus=args.ranks, include_dashboard=False, log_to_driver=False)
    if args.part in ("actor", "all"):
        actor_part(args, cfg, root, model.config.vocab_size, n_params)
    if args.part in ("steps", "all"):
        print_step_times(step_times(root, args), args)
    ray.shutdown()


if __name__ == "__main__":
    main()
