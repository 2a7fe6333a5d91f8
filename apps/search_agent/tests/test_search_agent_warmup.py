"""`search-agent warmup` (issue 41): demonstrations built from real rows and the retriever, and a warm-up that
turns a model writing no valid Search-R1 conversation into one that searches and answers in format, measured
greedily on held-out rows never demonstrated."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.data import prepare, read_records
from rlloom_apps.search_agent.warmup import ANSWER_TURN, SEARCH_TURN, demonstrations, warm_up
from rlloom_apps.search_agent.warmup_settings import WarmupSettings

from rlloom.agent.envs.search import SEARCH_R1_INVALID_ACTION, SEARCH_R1_TEMPLATE
from rlloom.core_rl.tiny import WORD_PIECES, save_tiny_model, tiny_qwen2, word_tokenizer
from rlloom.retrieval import build_index, load_index
from rlloom.rewards.format import search_r1_sequence

README = Path(__file__).parents[1] / "README.md"
FACTS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima"),
    ("Chile", "Santiago"), ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Cuba", "Havana"),
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Prepare-data rows (Search-R1's prompt) over a BM25 index of one passage per fact."""
    tmp = tmp_path_factory.mktemp("warmup")
    corpus = "".join(
        json.dumps({"_id": str(i), "title": c, "text": f"{a} is the capital of {c}."}) + "\n"
        for i, (c, a) in enumerate(FACTS)
    )
    (tmp / "corpus.jsonl").write_text(corpus)
    index = build_index(tmp / "corpus.jsonl", tmp / "index", "bm25")
    (tmp / "qa.jsonl").write_text(
        "".join(json.dumps({"question": f"capital of {c}", "answer": [a]}) + "\n" for c, a in FACTS)
    )
    prepare("nq", tmp / "qa.jsonl", tmp / "rows.jsonl", split="train")
    rows = list(read_records(tmp / "rows.jsonl"))
    return {"tmp": tmp, "index": index, "rows": rows, "corpus": corpus}


def word_model(world: dict[str, Any]) -> tuple[Any, Any]:
    """A tiny word-level Qwen2 that knows every word of the prompt, the passages and the demonstrations."""
    text = " ".join(
        [
            SEARCH_R1_TEMPLATE,
            SEARCH_R1_INVALID_ACTION,
            SEARCH_TURN,
            ANSWER_TURN,
            'Doc 1 2 3 (Title: " )',
            world["corpus"],
        ]
    )
    tokenizer = word_tokenizer(sorted(set(re.findall(WORD_PIECES, text))))
    return tiny_qwen2(tokenizer, max_position_embeddings=1024), tokenizer


SETTINGS = WarmupSettings(
    steps=40, lr=3e-3, batch_size=4, max_turns=2, max_tokens_per_turn=24, max_total_tokens=1024, progress=False
)


def test_a_demonstration_searches_reads_the_gold_passage_and_answers(world: dict[str, Any]) -> None:
    _, tokenizer = word_model(world)
    [demo] = demonstrations(world["rows"][:1], tokenizer, load_index(world["index"]), SETTINGS)
    response = tokenizer.decode(demo.response_ids, skip_special_tokens=True)
    model_text = tokenizer.decode([t for t, m in zip(demo.response_ids, demo.loss_mask, strict=True) if m])
    assert response.startswith("<think> I need to search for this . </think> <search> capital of France </search>")
    information = response[response.index("<information>") : response.index("</information>")]
    assert "Paris is the capital of France" in information  # BM25 put the gold passage among the top 3
    assert "<information>" not in model_text and model_text.endswith("<answer> Paris </answer> <|im_end|>")
    assert search_r1_sequence(response).score == 1.0  # rlloom-rewards' check of Search-R1's tag sequence


def test_warmup_makes_held_out_conversations_valid(world: dict[str, Any]) -> None:
    """8 rows demonstrated, 2 held out: a random model writes no valid conversation there; after 40 steps it
    searches and answers in Search-R1's format (greedy)."""
    model, tokenizer = word_model(world)
    train, held_out = world["rows"][:8], world["rows"][8:]
    result = warm_up(model, tokenizer, train, load_index(world["index"]), SETTINGS, val_rows=held_out)
    assert result.demonstrations == 8 and len(result.losses) == 40
    assert result.before is not None and result.after is not None
    assert result.before.format_valid == 0.0 and result.before.searches == 0.0
    assert result.after.format_valid == 1.0 and result.after.searches == 1.0


def test_command_saves_a_model_train_can_start_from(world: dict[str, Any], tmp_path: Path) -> None:
    saved = save_tiny_model(tmp_path, max_position_embeddings=2048)
    out = tmp_path / "warm"
    main(
        [
            "warmup", "--model", str(saved.model), "--tokenizer", str(saved.tokenizer),
            "--train-data", str(world["tmp"] / "rows.jsonl"), "--index", str(world["index"]), "--out", str(out),
            "--steps", "2", "--batch-size", "2", "--max-rows", "3", "--lr", "1e-3",
        ]
    )  # fmt: skip
    summary = json.loads((out / "warmup.json").read_text())
    assert summary["demonstrations"] == 3 and len(summary["losses"]) == 2
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


def test_command_refuses_a_missing_train_file_before_loading(world: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["warmup", "--model", str(tmp_path), "--train-data", str(tmp_path / "none.jsonl"),
              "--index", str(world["index"]), "--out", str(tmp_path / "o")])  # fmt: skip


def test_the_warmup_flags_and_defaults_are_the_documented_ones() -> None:
    """--help's defaults as the README and Search-R1 give them (100 steps at 1e-5, batches of 8, 1,024 tokens per
    micro-batch, top-3 passages, 5 turns of 500 tokens), the shared ones from core-rl's base, progress not a
    flag, and the README's warm-up section names every settings flag."""
    from rlloom_apps.search_agent.cli import build_parser

    from rlloom.core_rl.workers import WarmupSettingsBase

    given = ["warmup", "--model", "m", "--train-data", "t", "--out", "o", "--index", "i"]
    args = vars(build_parser().parse_args(given))
    flags = [name for name in WarmupSettings.model_fields if name != "progress"]
    assert "progress" not in args
    assert {k: args[k] for k in flags} == {
        "lr": 1e-5, "batch_size": 8, "max_tokens_per_micro_batch": 1024, "gradient_checkpointing": False,
        "max_rows": None, "seed": 0, "steps": 100, "top_k": 3, "max_turns": 5, "max_tokens_per_turn": 500,
        "max_obs_tokens": 500, "max_total_tokens": 4096,
    }  # fmt: skip
    assert issubclass(WarmupSettings, WarmupSettingsBase)
    section = README.read_text().split("## `search-agent warmup`")[1].split("\n## ")[0]
    assert [name for name in flags if f"`--{name.replace('_', '-')}`" not in section] == []
