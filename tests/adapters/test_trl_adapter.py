"""rlloom scorers as TRL reward functions, called by TRL's own `GRPOTrainer._calculate_rewards` (the code that
builds the keyword arguments: prompts, completions, completion_ids, every dataset column, trainer_state,
log_extra, log_metric) and by a real one-step `GRPOTrainer.train()`."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer

from rlloom.rewards import Rubric
from rlloom.rewards.integrations.trl import completion_text, trl_reward


def tiny_model(tok: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def trainer(rows: list[dict[str, Any]], reward_funcs: list[Any], tmp_path: Any, tok: Any) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=4,
        max_steps=1,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    return GRPOTrainer(
        model=tiny_model(tok),
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )


def rewards_through_trl(trl: GRPOTrainer, inputs: list[dict[str, Any]], completions: list[Any]) -> torch.Tensor:
    """TRL's own reward step (`_calculate_rewards`) on hand-written completions."""
    prompts = [x["prompt"] for x in inputs]
    ids = [[1] * 3 for _ in completions]
    return trl._calculate_rewards(inputs, prompts, completions, ids)


PLAIN_ROWS = [
    {"prompt": "2+2=?", "ground_truth": "4", "data_source": "gsm8k"},
    {"prompt": "capital of france?", "ground_truth": "Paris", "data_source": "nq"},
]


def test_plain_completions_scored_by_each_rows_data_source(tmp_path: Any, char_tokenizer: Any) -> None:
    reward = trl_reward()  # the registry picks gsm8k's math scorer and nq's exact match per row
    trl = trainer(PLAIN_ROWS, [reward], tmp_path, char_tokenizer)
    inputs = [PLAIN_ROWS[0], PLAIN_ROWS[0], PLAIN_ROWS[1], PLAIN_ROWS[1]]
    completions = ["so \\boxed{4}", "so \\boxed{5}", "<answer>Paris</answer>", "<answer>Lyon</answer>"]
    rewards = rewards_through_trl(trl, inputs, completions)
    assert rewards[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    # the QA scorer's components reach TRL's metrics through log_metric: means over the two nq rows
    assert trl._pending_metrics["rlloom_by_data_source/em"] == [0.5]
    assert trl._pending_metrics["rlloom_by_data_source/scoring_errors"] == [0.0]


def test_conversational_completions_and_a_fixed_rubric(tmp_path: Any, char_tokenizer: Any) -> None:
    rubric = Rubric([("accuracy", "qa_em", 0.9), ("format", "r1_format", 0.1)])
    rows = [
        {"prompt": [{"role": "user", "content": "capital of france?"}], "answer": ["Paris", "paris, france"]},
    ]
    reward = trl_reward(rubric, name="rubric", ground_truth_column="answer")
    trl = trainer(rows, [reward], tmp_path, char_tokenizer)
    good = "<think>it is paris</think><answer>Paris</answer>"
    completions = [
        [{"role": "assistant", "content": good}],
        [{"role": "assistant", "content": "<answer>Paris</answer>"}],  # right, but no <think>: 0.9
        # a tool-using turn: the last assistant message is scored, not the tool output
        [
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "s", "arguments": {}}}]},
            {"role": "tool", "content": "<answer>Paris</answer>"},
            {"role": "assistant", "content": [{"type": "text", "text": "<answer>Lyon</answer>"}]},
        ],
        [{"role": "assistant", "content": "<think>x</think><answer>Rome</answer>"}],  # format only: 0.1
    ]
    rewards = rewards_through_trl(trl, rows * 4, completions)[:, 0].tolist()
    assert rewards == pytest.approx([1.0, 0.9, 0.0, 0.1])
    assert trl.reward_func_names == ["rubric"]
    assert trl._pending_metrics["rubric/accuracy"] == [pytest.approx(0.5)]
    assert trl._pending_metrics["rubric/format"] == [pytest.approx(0.5)]


def test_verl_shaped_rows_and_failures(tmp_path: Any, char_tokenizer: Any) -> None:
    def explodes(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
        if "boom" in response:
            raise RuntimeError("scorer bug")
        return float(extra_info["bonus"]) if extra_info else math.nan

    rows = [{"prompt": "q", "reward_model": {"ground_truth": "x"}, "extra_info": {"bonus": 0.25}}]
    reward = trl_reward(explodes)
    trl = trainer(rows, [reward], tmp_path, char_tokenizer)
    rewards = rewards_through_trl(trl, rows * 4, ["ok", "boom", "ok", "ok"])[:, 0].tolist()
    assert rewards == [0.25, 0.0, 0.25, 0.25]  # the raising row costs its own reward only
    assert trl._pending_metrics["rlloom_explodes/scoring_errors"] == [0.25]
    # no extra_info: the scorer returns NaN, which scores 0 (one NaN would turn TRL's group advantages into NaN)
    assert trl_reward(explodes)(["q"], ["ok"], ground_truth=["x"], extra_info=[None]) == [0.0]


def test_a_missing_column_names_the_columns_and_the_fix() -> None:
    reward = trl_reward("gsm8k")
    with pytest.raises(
        ValueError, match=r"no 'ground_truth' column .*\['data_source', 'solution'\].*ground_truth_column"
    ):
        reward(["q"], ["a"], solution=["4"], data_source=["gsm8k"], trainer_state=None, log_metric=None)
    with pytest.raises(LookupError, match="data_source 'nope' has no rlloom scorer"):
        trl_reward()(["q"], ["a"], ground_truth=["4"], data_source=["nope"])
    with pytest.raises(LookupError, match="neither a known data_source"):
        trl_reward("not_a_scorer")


def test_completion_text_forms() -> None:
    assert completion_text("plain") == "plain"
    turns = [
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    assert completion_text(turns) == "c"
    assert completion_text(turns, turns="all") == "a\nb\nc"
    assert completion_text([{"role": "tool", "content": "b"}]) == ""
    with pytest.raises(TypeError, match="a string or a list of chat messages"):
        completion_text(3)


def test_one_real_grpo_step_with_the_adapter(tmp_path: Any, char_tokenizer: Any) -> None:
    """The whole trainer: generation, TRL's reward call, advantages, one optimizer step; the reward is logged
    under the adapter's name (random weights sample nonsense, so the reward itself is 0)."""
    rows = [{"prompt": "2+2=?", "ground_truth": "4"}] * 4
    trl = trainer(rows, [trl_reward("gsm8k")], tmp_path, char_tokenizer)
    trl.train()
    logged = [entry for entry in trl.state.log_history if "rewards/rlloom_gsm8k/mean" in entry]
    assert logged and logged[0]["rewards/rlloom_gsm8k/mean"] == 0.0
    assert "rlloom_gsm8k/scoring_errors" in logged[0]
