"""RewardModel: a sequence-classification checkpoint scores trajectories like a plain unbatched forward does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_run import SamplingEngine, sum_rows
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from rlloom.core_rl.contracts.generation import SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.phases.collection import single_turn_collector
from rlloom.core_rl.tiny import char_tokenizer
from rlloom.core_rl.workers.reward_model import RewardModel


def save_reward_model(
    path: Path, num_labels: int = 1, pad_token_id: int | None = None
) -> Qwen2ForSequenceClassification:
    tok = char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        num_labels=num_labels,
        pad_token_id=tok.pad_token_id if pad_token_id is None else pad_token_id,
    )
    torch.manual_seed(3)
    model = Qwen2ForSequenceClassification(config).eval()
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # the random head is tiny: make the scores differ visibly
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model


def chat_trajectory(question: str, answer: str) -> Trajectory:
    return Trajectory(
        prompt_ids=[5],
        response_ids=[6],
        loss_mask=[1],
        prompt_messages=[{"role": "user", "content": question}],
        response_text=answer,
    )


def test_scores_match_an_unbatched_forward_of_the_rendered_conversation(tmp_path: Path) -> None:
    model = save_reward_model(tmp_path)
    tok = char_tokenizer()
    pairs = [("2+2=", "4"), ("What is 12*12?", "144, since 12*12=144"), ("hi", "")]
    trajectories = [chat_trajectory(question, answer) for question, answer in pairs]
    rm = RewardModel(tmp_path, batch_size=2, scale=2.0, shift=-1.0)  # 3 rows: a padded chunk of 2, then 1
    outputs = rm(trajectories)
    for traj, out in zip(trajectories, outputs, strict=True):
        assert traj.prompt_messages is not None
        conversation = [*traj.prompt_messages, {"role": "assistant", "content": traj.response_text}]
        text = tok.apply_chat_template(conversation, tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            expected = 2.0 * float(model(input_ids=ids).logits[0, 0]) - 1.0
        assert out.score == pytest.approx(expected, abs=1e-5)
        assert out.components == {"reward_model": pytest.approx(expected, abs=1e-5)}
    assert len({round(o.score, 4) for o in outputs}) == 3


def test_a_model_whose_pad_id_differs_from_its_tokenizers_scores_padded_rows_at_their_last_token(
    tmp_path: Path,
) -> None:
    """The classifier reads each row's score at its last token that is not the *config's* pad id; rows padded with
    the tokenizer's (different) pad id would be read at their last padding position instead."""
    tok = char_tokenizer()
    config_pad = tok.convert_tokens_to_ids("~")  # not the tokenizer's <pad>, and in none of the texts
    assert config_pad != tok.pad_token_id
    model = save_reward_model(tmp_path, pad_token_id=config_pad)
    texts = ["a short one", "a much longer text than the first", "mid length"]
    batched = RewardModel(tmp_path, batch_size=3).scores(texts)
    for text, score in zip(texts, batched, strict=True):
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            assert score == pytest.approx(float(model(input_ids=ids).logits[0, 0]), abs=1e-5), text


def test_prompts_kept_as_ids_are_decoded_with_the_policy_tokenizer(tmp_path: Path) -> None:
    save_reward_model(tmp_path)
    tok = char_tokenizer()
    prompt_ids = tok("Q: 2+2=", add_special_tokens=False)["input_ids"]
    traj = Trajectory(prompt_ids=prompt_ids, response_ids=[6], loss_mask=[1], response_text="4")
    with pytest.raises(ValueError, match="pass policy_tokenizer="):
        RewardModel(tmp_path)([traj])
    rm = RewardModel(tmp_path, policy_tokenizer=tok)
    assert rm.text(traj) == "Q: 2+2=4"
    [out] = rm([traj])
    assert out.score == pytest.approx(rm.scores(["Q: 2+2=4"])[0])


def test_a_classifier_with_several_labels_is_refused(tmp_path: Path) -> None:
    save_reward_model(tmp_path, num_labels=2)
    with pytest.raises(ValueError, match="one output \\(num_labels=1\\), this one has 2"):
        RewardModel(tmp_path)


def test_single_turn_trajectories_keep_their_chat_messages(tiny_model_dir: Path) -> None:
    rows = sum_rows(2)
    trajectories = single_turn_collector(SamplingEngine(tiny_model_dir))(rows, SamplingParams(n=2, max_tokens=4), "s")
    assert [t.prompt_messages for t in trajectories] == [row["prompt"] for row in rows for _ in range(2)]
