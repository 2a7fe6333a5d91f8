"""What an in-flight weight push costs HFEngine's decode loop: the resume step with `inflight_kv="keep"` (feed the
sampled tokens on, the old keys/values kept) against `"reprefill"` (run every row's prompt + tokens so far through
the new weights first, then feed), at the same token boundary of the same batch.

The batch decodes `--rows` greedy rows (prompts of 20-38 random ids) for `--tokens` tokens and stops at the point
where the decode parks for a push (tokens sampled, not fed). Each repeat times, on a copy of that batch, keep's
resume step (one `advance`) and reprefill's (`reprefill` + `advance`), plus the plain step after keep's as a
yardstick; medians over repeats, and the ratio reprefill / keep from the same run.

Run: .venv/bin/python bench/hf_inflight_kv.py [--rows 32] [--tokens 200] [--repeats 5] [--threads 1]
     [--model models/smollm2-135m-instruct]   (default: the tiny test model)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.hf.decoding import DecodeSettings, DecodeStats, RunningBatch, SampleRow


def parked_batch(model: torch.nn.Module, settings: DecodeSettings, vocab: int, rows: int, tokens: int) -> RunningBatch:
    """A batch of `rows` greedy rows that has sampled `tokens` tokens each, the last not yet fed."""
    gen = torch.Generator().manual_seed(0)
    sampling = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True, logprobs=True)
    samples = [
        SampleRow(i, 0, torch.randint(10, vocab, (20 + (i % 7) * 3,), generator=gen).tolist(), sampling, frozenset())
        for i in range(rows)
    ]
    batch = RunningBatch.prefill(model, samples, settings)
    for _ in range(tokens - 1):
        batch.sample(settings, None)
        batch.advance(model, settings)
    batch.sample(settings, None)
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="a model folder (default: the tiny test model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        pad = int(model.config.pad_token_id or model.config.eos_token_id or 0)
    else:
        tok = char_tokenizer()
        model, pad = tiny_qwen2(tok, seed=0).eval(), int(tok.pad_token_id)
    settings = DecodeSettings(pad_token_id=pad, max_positions=1 << 30)
    keep, reprefill, plain = [], [], []
    stats = DecodeStats()
    with torch.inference_mode():
        batch = parked_batch(model, settings, int(model.config.vocab_size), args.rows, args.tokens)
        for _ in range(args.repeats):
            kept = copy.deepcopy(batch)
            start = time.perf_counter()
            kept.advance(model, settings)
            keep.append(time.perf_counter() - start)
            kept.sample(settings, None)
            start = time.perf_counter()
            kept.advance(model, settings)
            plain.append(time.perf_counter() - start)
            redone, stats = copy.deepcopy(batch), DecodeStats()
            start = time.perf_counter()
            redone.reprefill(model, settings, stats)
            redone.advance(model, settings)
            reprefill.append(time.perf_counter() - start)
    med = statistics.median
    name = args.model or "tiny test model"
    print(f"{name}: {args.rows} rows x {args.tokens} tokens, {args.threads} thread(s), medians of {args.repeats}")
    print(f"  keep resume step       {med(keep) * 1e3:9.2f} ms   (the plain step after it: {med(plain) * 1e3:.2f} ms)")
    print(f"  reprefill resume step  {med(reprefill) * 1e3:9.2f} ms   ({stats.reprefilled_tokens} tokens re-prefilled)")
    print(f"  reprefill / keep       {med(reprefill) / med(keep):9.1f}x")


if __name__ == "__main__":
    main()
