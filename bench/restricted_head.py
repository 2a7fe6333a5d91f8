"""Policy-update time with the LM head run only on the loss-mask-1 positions (`actor.restrict_lm_head`, the
default) against the head on every response position (`restrict_lm_head=false`, what veRL's and TRL's actors do:
log-probs of the whole response, then the mask).

An agent conversation's response is mostly observations: in the HotpotQA search recipe (SmolLM2-135M, 3 turns of
at most 64 tokens, top-3 passages of at most 256 tokens) about 230 of 304 response tokens are retrieved text that
the loss masks out. Their logits (`[tokens, 49,152]` for SmolLM2, 151,936 for Qwen2.5), the log-softmax and
entropy over them, and the same again in backward were computed only to be multiplied by 0. The expected saving is
the head's share of the update times the share of head positions skipped; single-turn rows (every response token
trained) skip nothing and are the control.

Both rows are `PolicyActor`s from the same weights making the same single on-policy optimizer step on the same
batch, alternating; CPU-time medians (one torch thread). The two paths' loss, entropy and gradient norm are
compared before timing.

Run: .venv/bin/python bench/restricted_head.py [--repeats 3] [--threads 2] [--packed] [--shape NAME]
     [--model models/smollm2-135m-instruct]   (SmolLM2: about 5 minutes a table row at 2 threads)
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from core_rl import median_seconds
from transformers import PreTrainedModel

from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, ModelConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm

CPU = torch.device("cpu")

SHAPES = {  # name: (prompts, samples per prompt, prompt length, [(model tokens, observation tokens) per turn])
    "search agent (recipe)": (1, 4, 180, [(24, 77), (24, 77), (24, 76), (2, 0)]),
    "code agent, long tool output": (1, 4, 120, [(48, 200), (48, 200), (32, 0)]),
    "single turn (control)": (1, 4, 120, [(192, 0)]),
}


def agent_batch(vocab: int, prompts: int, group: int, p_len: int, turns: list[tuple[int, int]]) -> TrajectoryBatch:
    """`prompts` prompts with `group` conversations each: per turn, model tokens (loss mask 1) then an observation
    (loss mask 0); lengths ragged by a few tokens per sample, as sampled conversations are."""
    gen = torch.Generator().manual_seed(0)
    trajectories = []
    for i in range(prompts):
        prompt = torch.randint(10, vocab, (p_len - 3 * i,), generator=gen).tolist()
        for j in range(group):
            mask: list[int] = []
            for model_tokens, observation in turns:
                mask += [1] * max(1, model_tokens - j) + [0] * observation
            response = torch.randint(10, vocab, (len(mask),), generator=gen).tolist()
            trajectories.append(Trajectory(prompt_ids=prompt, response_ids=response, loss_mask=mask))
    batch = TrajectoryBatch.from_trajectories(trajectories, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def actor(model: PreTrainedModel, rows: int, response_len: int, *, restrict: bool, packed: bool) -> PolicyActor:
    return PolicyActor(
        model,
        actor=ActorConfig(
            lr=1e-5,
            ppo_epochs=1,
            mini_batch_size=rows,
            shuffle=False,
            restrict_lm_head=restrict,
            padding_free=packed,
        ),
        algorithm=AlgorithmConfig(policy_loss={"agg_mode": "token-mean"}, entropy={"coef": 0.001}),
        total_steps=10**6,
        mini_batch_rows=rows,
        max_response_length=response_len,
        device=CPU,
    )


def bench_shape(model: PreTrainedModel, vocab: int, name: str, packed: bool, repeats: int) -> str:
    prompts, group, p_len, turns = SHAPES[name]
    batch = agent_batch(vocab, prompts, group, p_len, turns)
    rows, width = batch.batch_size, batch.response_width
    full = actor(model, rows, width, restrict=False, packed=packed)
    restricted = actor(copy.deepcopy(model), rows, width, restrict=True, packed=packed)
    first_full = full.update_policy(batch.select(list(range(rows))))
    first_restricted = restricted.update_policy(batch.select(list(range(rows))))
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):  # the same step before anything is timed
        a, b = first_full[key], first_restricted[key]
        assert abs(a - b) <= 1e-4 * max(abs(a), 1e-3), f"{key}: full head {a}, restricted {b}"
    t_full, t_restricted = median_seconds(
        [lambda: full.update_policy(batch), lambda: restricted.update_policy(batch)], repeats
    )
    real = batch.response_attention_mask.bool()
    trained = int((batch.loss_mask != 0).sum())
    path = "packed" if packed else "padded, shared prompt"
    return (
        f"| {name} | {path} | {prompts} × {group} | {p_len} + {int(real.sum()) // rows} | "
        f"{trained / int(real.sum()):.2f} | {t_full:.2f} | {t_restricted:.2f} | **{t_full / t_restricted:.2f}x** |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--model", type=Path, default=Path("models/smollm2-135m-instruct"), help="a transformers folder"
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny random Qwen2 instead of --model (a smoke run)")
    parser.add_argument("--shape", choices=list(SHAPES), action="append", help="only these batches (default: all)")
    parser.add_argument("--packed", action="store_true", help="also the packed (padding_free) forward of each batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.tiny:
        tok = char_tokenizer()
        model: PreTrainedModel = tiny_qwen2(tok, hidden_size=128, num_layers=2, intermediate_size=256, seed=0)
        label, vocab = "tiny Qwen2 128 x 2", len(tok)
    else:
        if not (args.model / "config.json").exists():
            raise SystemExit(f"--model {args.model}: no config.json; `python3 -m nox -s smollm2` writes SmolLM2 there")
        # the actor's own loader: attention "auto" gives the packed rows a varlen path (no dense block mask)
        model = load_causal_lm(ModelConfig(path=str(args.model)), str(args.model), CPU)
        label, vocab = args.model.name, int(model.config.vocab_size)
    print(f"{label}, fp32, {args.threads} torch thread(s), CPU-time medians of {args.repeats}, one update each")
    print(
        "| batch | forward | prompts × samples | prompt + response tokens | trained share of response | "
        "full head (s) | restricted head (s) | speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.shape or SHAPES:
        for packed in (False, True) if args.packed and not args.tiny else (False,):  # tiny: sdpa, dense packed mask
            print(bench_shape(model, vocab, name, packed, args.repeats), flush=True)


if __name__ == "__main__":
    main()
