"""`word_tokenizer` (ids, chat template, decoding, unknown words), the reward-curve helpers and `fresh_run_dir`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlloom.core_rl.observe.curves import ascii_curve, plot_or_draw, read_curves
from rlloom.core_rl.run.checkpoint import fresh_run_dir
from rlloom.core_rl.tiny import SPECIAL_TOKENS, word_tokenizer


def test_word_tokenizer_gives_one_id_per_word_tag_and_mark() -> None:
    tok = word_tokenizer(["<search>", "</search>", "zor", "bak", "has", "code", "42", ".", "user", "assistant"])
    first = len(SPECIAL_TOKENS) + 1  # the special tokens, then <unk>, then the words in order
    ids = tok("<search> zor bak </search>", add_special_tokens=False)["input_ids"]
    assert ids == [first, first + 2, first + 3, first + 1]
    assert tok.decode(ids) == "<search> zor bak </search>"
    # tags and punctuation split off words without spaces; unknown words are <unk>
    assert tok.convert_ids_to_tokens(tok("zor has code 42.</search>xyz")["input_ids"]) == [
        "zor", "has", "code", "42", ".", "</search>", "<unk>",
    ]  # fmt: skip
    chat = tok.apply_chat_template([{"role": "user", "content": "zor bak"}], tokenize=False, add_generation_prompt=True)
    ids = tok(str(chat), add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == [
        "<|im_start|>", "user", "zor", "bak", "<|im_end|>", "<|im_start|>", "assistant",
    ]  # fmt: skip
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<pad>"


def test_read_curves_and_ascii_curve(tmp_path: Path) -> None:
    records = [
        {"step": 0, "val/reward/mean": 0.0},
        {"step": 1, "reward/mean": 0.25, "loss": 1.0},
        {"step": 2, "reward/mean": 0.5, "val/reward/mean": 1.0},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    val, train = read_curves(path)
    assert val == [(0, 0.0), (2, 1.0)] and train == [(1, 0.25), (2, 0.5)]
    drawn = ascii_curve([(0, 0.0), (5, 0.5), (10, 1.0)], height=2).splitlines()
    assert drawn == [
        "1.00 |       # ",
        "0.50 |    #  # ",
        "     +---------",
        "step   0  5 10 ",
    ]


def test_plot_or_draw_falls_back_to_ascii_without_matplotlib(tmp_path: Path) -> None:
    text = plot_or_draw([(0, 0.0), (5, 1.0)], [], tmp_path / "c.png", title="t", ylabel="exact match")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert text.splitlines()[0] == "held-out exact match per validation (install matplotlib for a PNG):"
        assert text.endswith(ascii_curve([(0, 0.0), (5, 1.0)]))
        assert not (tmp_path / "c.png").exists()
    else:
        assert text == f"exact match curve: {tmp_path / 'c.png'}" and (tmp_path / "c.png").exists()


def test_fresh_run_dir_refuses_a_folder_holding_checkpoints(tmp_path: Path) -> None:
    assert fresh_run_dir(tmp_path / "run", "demo") == tmp_path / "run"
    assert fresh_run_dir(None, "demo").parts[0] == "runs" and fresh_run_dir(None, "demo").name.startswith("demo-")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="pass a new --out"):
        fresh_run_dir(tmp_path / "run", "demo")
