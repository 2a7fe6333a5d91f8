"""`reasoning demo`'s task for bench/async_agent_vllm.py --task reasoning (issue 42): reversing 3-digit strings,
the demo's split and rubric, its warm-up (supervised until 20% of 64 training strings are answered exactly,
greedy) on a vLLM-shaped tiny Qwen2, cached under the cache folder by its settings. Not a benchmark itself:
`nox -s bench` skips files whose name starts with `_`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from _vllm_tiny import cache_folder, vllm_tiny_qwen2
from rlloom_apps.reasoning.demo import DEMO_CONFIG, DemoSettings, held_out_score, rubric_reward
from rlloom_apps.reasoning.toy_task import answer_of, reverse_splits
from rlloom_apps.reasoning.warmup import supervised_warmup

from rlloom.core_rl.tiny import char_tokenizer

__all__ = ["DEMO_CONFIG", "rubric_reward", "warmed_up_reasoning"]


def warmed_up_reasoning(
    cache_dir: str | Path, *, hidden_size: int, context: int, seed: int, head_size: int = 64
) -> tuple[Path, Path, list[dict[str, Any]], Any]:
    """(model folder, tokenizer folder, training rows, tokenizer) after the demo's warm-up, from the cache if
    there; the tokenizer has a folder of its own (AutoTokenizer would read a qwen2 folder as BPE)."""
    settings = DemoSettings(hidden_size=hidden_size)
    train_rows, _ = reverse_splits(settings.length, settings.held_out)
    tokenizer = char_tokenizer()
    head = "" if head_size == 64 else f"-h{head_size}"
    key = f"reasoning-{seed}-{hidden_size}-{context}-{settings}-v1{head}"
    folder = cache_folder(cache_dir, "rlloom_bench_async_reasoning", key)
    model_dir, tokenizer_dir = folder / "model", folder / "tokenizer"
    if (model_dir / "config.json").exists():
        print(f"warmed-up model from the cache: {folder}", flush=True)
        return model_dir, tokenizer_dir, train_rows, tokenizer
    started = time.perf_counter()
    model = vllm_tiny_qwen2(tokenizer, hidden_size=hidden_size, context=context, seed=seed, head_size=head_size)
    probe, probe_exact = train_rows[: settings.probe_rows], [0.0]
    max_tokens = 6  # configs/demo.yaml's rollout.max_tokens: 3 digits and EOS, with room for mistakes

    def warm_enough() -> bool:
        probe_exact.append(held_out_score(model, tokenizer, probe, max_tokens).exact)
        return probe_exact[-1] >= settings.warmup_target

    losses = supervised_warmup(
        model, tokenizer, [(row["prompt"], answer_of(row)) for row in train_rows], steps=settings.warmup_max_steps,
        lr=settings.warmup_lr, seed=seed, stop=warm_enough, check_every=settings.warmup_check_every, progress=False,
    )  # fmt: skip
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(tokenizer_dir)
    print(f"warm-up: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, exact on {len(probe)} training "
          f"strings {probe_exact[-1]:.2f}, {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return model_dir, tokenizer_dir, train_rows, tokenizer
