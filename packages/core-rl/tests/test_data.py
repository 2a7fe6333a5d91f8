"""PromptLoader: every row once per epoch, a seeded order, exact state round trips across epoch boundaries."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.data.loader import PromptLoader, generation_request, ground_truth, limit_prompt_length
from rlloom.core_rl.data.rows import DataError, read_jsonl
from rlloom.core_rl.tiny import char_tokenizer

ROWS = [{"prompt": f"q{i}", "id": i} for i in range(10)]


def ids(batch: list) -> list[int]:  # type: ignore[type-arg]
    return [r["id"] for r in batch]


def test_epochs_cover_every_row_and_keep_the_remainder() -> None:
    loader = PromptLoader(ROWS, 4, seed=3)
    assert loader.batches_per_epoch == 3
    epoch0 = [ids(loader.next_batch()) for _ in range(3)]
    assert [len(b) for b in epoch0] == [4, 4, 2]
    assert sorted(i for b in epoch0 for i in b) == list(range(10))
    epoch1 = [ids(loader.next_batch()) for _ in range(3)]
    assert loader.epoch == 1
    assert sorted(i for b in epoch1 for i in b) == list(range(10))
    assert epoch0 != epoch1  # reshuffled


def test_drop_last() -> None:
    loader = PromptLoader(ROWS, 4, drop_last=True, shuffle=False)
    assert loader.batches_per_epoch == 2
    assert [ids(loader.next_batch()) for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    # a DataError (a ConfigError): the apps print it as one line naming the keys, not a traceback
    with pytest.raises(DataError, match=r"^data.train_batch_size=11 exceeds the 10 training rows and data.drop_last"):
        PromptLoader(ROWS, 11, drop_last=True)


def test_state_round_trip_at_and_inside_epoch_boundaries() -> None:
    for served in range(7):
        a = PromptLoader(ROWS, 4, seed=1)
        for _ in range(served):
            a.next_batch()
        b = PromptLoader(ROWS, 4, seed=1)
        b.load_state_dict(a.state_dict())
        assert [ids(a.next_batch()) for _ in range(4)] == [ids(b.next_batch()) for _ in range(4)]
    with pytest.raises(ValueError, match="same training data"):
        PromptLoader(ROWS[:5], 4).load_state_dict(a.state_dict())


def test_excluded_rows_leave_later_epochs_and_survive_a_resume() -> None:
    loader = PromptLoader(ROWS[:6], 2, shuffle=False)
    assert [loader.next_batch_ids() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert loader.epoch_finished
    loader.exclude({1, 4})
    assert loader.active_ids == [0, 2, 3, 5] and loader.batches_per_epoch == 2
    assert loader.next_batch_ids() == [0, 2]
    with pytest.raises(RuntimeError, match="in progress"):
        loader.exclude({0})  # mid-epoch: the epoch's order would change under it
    resumed = PromptLoader(ROWS[:6], 2, shuffle=False)
    resumed.load_state_dict(loader.state_dict())
    assert resumed.excluded == {1, 4}
    expected = [[3, 5], [0, 2]]  # the rest of epoch 1, then epoch 2 from the start
    assert [resumed.next_batch_ids() for _ in range(2)] == expected == [loader.next_batch_ids() for _ in range(2)]
    # shuffled: every epoch is a permutation of the active rows only
    shuffled = PromptLoader(ROWS, 3, seed=2)
    shuffled.exclude({0, 9})  # allowed before the first batch
    served = [i for _ in range(3) for i in shuffled.next_batch_ids()]
    assert sorted(served) == list(range(1, 9))
    with pytest.raises(IndexError, match="outside"):
        PromptLoader(ROWS, 3).exclude({10})


def test_rows_to_requests() -> None:
    sp = SamplingParams()
    assert generation_request({"prompt": "hi"}, sp).messages == [{"role": "user", "content": "hi"}]
    assert generation_request({"prompt_ids": [1, 2]}, sp).prompt_ids == [1, 2]
    with pytest.raises(ValueError, match="prompt"):
        generation_request({"question": "x"}, sp)
    assert ground_truth({"reward_model": {"ground_truth": "7"}}) == "7"
    assert ground_truth({"ground_truth": 3}) == 3


def test_prompt_length_limit_counts_the_prompt_as_the_engine_renders_it(caplog: pytest.LogCaptureFixture) -> None:
    tok = char_tokenizer()
    # ChatML around one user message, one token per character: <|im_start|> "user\n" CONTENT <|im_end|> "\n"
    # <|im_start|> "assistant\n" is 1 + 5 + len(CONTENT) + 1 + 1 + 1 + 10 = 19 + len(CONTENT) tokens
    rows = [
        {"prompt": "a" * 5},  # 24
        {"prompt": "b" * 12},  # 31
        {"prompt_ids": [7] * 30},  # 30: token ids count as they are
        {"prompt": [{"role": "user", "content": "c"}]},  # 20
    ]
    assert limit_prompt_length(rows, tok, 31, drop=False) == rows
    with pytest.raises(DataError, match=r"train row 2 of 4: the prompt is 31 tokens, over data.max_prompt_length=30"):
        limit_prompt_length(rows, tok, 30, drop=False)
    with caplog.at_level(logging.WARNING):
        kept = limit_prompt_length(rows, tok, 24, drop=True, split="validation")
    assert kept == [rows[0], rows[3]]
    assert "left out 2 of 4 validation rows" in caplog.text
    with pytest.raises(ValueError, match="every train row"):
        limit_prompt_length(rows, tok, 19, drop=True)
    with pytest.raises(ValueError, match="images"):  # their length is known only after image expansion
        limit_prompt_length([{"prompt": "x", "images": ["a.png"]}], tok, 100, drop=True)
    with pytest.raises(DataError, match=r"train row 1 of 1: .*AgentLoopConfig.max_total_tokens"):
        limit_prompt_length([{"question": "rendered by an agent environment"}], tok, 100, drop=True)


def test_prompt_length_errors_name_the_file_and_line(tmp_path: Path) -> None:
    """Rows read from a file are named by file:line, as `check_rows` names them, not by a 0-based index."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "%s"}\n' % ("b" * 40), encoding="utf-8")
    rows = read_jsonl(path)
    with pytest.raises(DataError, match=rf"^{path}:3: the prompt is 59 tokens, over data.max_prompt_length=30"):
        limit_prompt_length(rows, char_tokenizer(), 30, drop=False)
