"""The demo end to end, shortened: warm-up, GRPO through the trainer with validation, the run folder it leaves."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.demo import DemoSettings, rubric_reward, run_demo
from rlloom_apps.reasoning.toy_task import digits_in_place, reverse_row, reverse_splits
from rlloom_apps.reasoning.warmup import supervised_warmup
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from rlloom.core_rl import Trajectory, char_tokenizer, tiny_qwen2

SHORT = DemoSettings(hidden_size=32, warmup_max_steps=10, warmup_check_every=5, probe_rows=4, held_out=6)
SHORT_OVERRIDES = [
    "data.train_batch_size=2",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "trainer.val_every=1",
    "trainer.save_every=0",
    "trainer.trackers=[jsonl]",
]


def test_short_demo_writes_a_complete_run_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_demo(output_dir=out, steps=2, seed=0, overrides=SHORT_OVERRIDES, settings=SHORT)

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "reward/mean" in r]
    val = [r for r in records if "val/reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for record in train:
        for key in ("reward/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "timing/rollout_s"):
            assert key in record, key
    assert [r["step"] for r in val] == [0, 1, 2]  # before training, then every step
    # the demo's own greedy held-out scoring agrees with the trainer's validation before and after GRPO
    assert result.before.reward == pytest.approx(val[0]["val/reward/mean"])
    assert result.after.reward == pytest.approx(val[-1]["val/reward/mean"])
    assert result.before.reward == pytest.approx((result.before.exact + result.before.digits) / 2)
    assert 0 < result.warmup_steps <= 10
    summary = json.loads((out / "summary.json").read_text())
    assert summary["after_grpo"]["reward"] == result.after.reward
    table = (out / "before_after.md").read_text()
    assert f"after warm-up ({result.warmup_steps} steps)" in table and "after GRPO (2 steps)" in table
    assert (out / "config.yaml").read_text().count("total_steps: 2") == 1

    checkpoint = out / "checkpoints" / "step_2"
    trained = AutoModelForCausalLM.from_pretrained(checkpoint)
    warm = AutoModelForCausalLM.from_pretrained(out / "warmup_model")
    assert trained.config.hidden_size == 32
    changed = [name for name, p in trained.state_dict().items() if not torch.equal(p, warm.state_dict()[name])]
    assert changed, "two GRPO steps left the weights exactly as the warm-up did"


def test_rubric_reward_gives_exact_half_plus_digits_in_place_half() -> None:
    row = reverse_row("482")
    assert row["reward_model"]["ground_truth"] == "284"
    texts = ("284", " 284\n", "482", "281", "28", "2845", "")
    trajs = [
        Trajectory(prompt_ids=[1], response_ids=[2], loss_mask=[1], response_text=text, ground_truth="284")
        for text in texts
    ]
    # by hand: exact counts 0.5; each of the 3 digits in place counts 0.5/3 (over the longer string's length)
    expected = [1.0, 1.0, 0.5 / 3, 1.0 / 3, 1.0 / 3, 0.5 * 3 / 4, 0.0]
    outputs = rubric_reward(trajs)
    assert [o.score for o in outputs] == pytest.approx(expected)
    assert [o.components["exact"] for o in outputs] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_digits_in_place_rejects_an_empty_answer_key() -> None:
    result = digits_in_place("123", "")
    assert result.score == 0.0 and result.error is not None and "ground_truth" in result.error


def test_warmup_stops_when_asked_and_only_at_check_points() -> None:
    tokenizer = char_tokenizer()
    model = tiny_qwen2(tokenizer, hidden_size=16, num_layers=1)
    rows = reverse_splits(3, 8)[0][:8]
    calls: list[int] = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) == 2

    losses = supervised_warmup(
        model, tokenizer, [(r["prompt"], r["reward_model"]["ground_truth"]) for r in rows],
        steps=50, batch_size=4, stop=stop, check_every=3,
    )  # fmt: skip
    assert len(losses) == 6 and len(calls) == 2  # checked after steps 3 and 6, stopped at the second
    with pytest.raises(ValueError, match="check_every"):
        supervised_warmup(model, tokenizer, [], steps=0, check_every=0)


def test_splits_are_disjoint_and_fixed() -> None:
    train, held = reverse_splits(3, 64)
    assert len(train) + len(held) == 9**3
    prompts = {r["prompt"][0]["content"] for r in train}
    assert not prompts & {r["prompt"][0]["content"] for r in held}
    assert reverse_splits(3, 64)[1] == held


def test_demo_rejects_a_mistyped_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "x"), "actor.learning_rate=1e-3"])
    assert "actor.learning_rate" in capsys.readouterr().err


LEARNING_STEPS = 30
LEARNING_MARGIN = 4 / 64  # held-out exact answers (greedy, 64 strings): at least 4 more strings right after GRPO


def test_short_fixed_seed_run_raises_held_out_exact_answers(tmp_path: Path) -> None:
    """The demo's own defaults and seed 0, cut to 30 GRPO steps (about 30 s on an idle 2-core machine; the
    150-step default stays in `nox -s demo`): GRPO must raise the held-out exact answers by 4 strings of 64 or more.

    Recorded for seed 0 (torch 2.13; one torch thread and two give the same run on one host): the warm-up stops
    after 280 steps at 16/64 held-out strings exact; validation reads 0.50, 0.51, 0.59, 0.64 reward at steps
    0/10/20/30, and 29/64 exact at step 30 (+0.20). The same seed is not the same run on every CPU: on an AMD EPYC
    with AVX2 only (29th session) the warm-up stopped at 20/64 and step 30 read 25/64 (+0.08), because the float
    kernels differ. So the margin is what chance cannot give, not one host's figure: greedy decoding of a fixed
    model is deterministic, a random guess of 3 digits is right 1 time in 729, and the same 30 steps with each
    batch's rewards shuffled (the same update sizes, no information) took held-out exact from 0.25 down to 0.06:
    updates without the reward's information lose strings, they do not gain 4. The scores are checked
    independently: both saved models are reloaded from disk and decoded with transformers' own `generate`, and an
    answer is exact when it equals the prompt's digits reversed.
    """
    out = tmp_path / "run"
    result = run_demo(
        output_dir=out,
        steps=LEARNING_STEPS,
        seed=0,
        overrides=["trainer.val_every=10", f"trainer.save_every={LEARNING_STEPS}", "trainer.trackers=[jsonl]"],
    )
    held_out = reverse_splits(3, DemoSettings().held_out)[1]
    before = greedy_exact_share(out / "warmup_model", out / "warmup_model", held_out)
    after = greedy_exact_share(out / "checkpoints" / f"step_{LEARNING_STEPS}", out / "warmup_model", held_out)
    assert (before, after) == (result.before.exact, result.after.exact)  # HFEngine + rubric agree with generate
    assert 0.05 <= before <= 0.5, "the warm-up should stop with the task partly learned (seed 0: 16/64)"
    assert after >= before + LEARNING_MARGIN, f"held-out exact {before:.3f} -> {after:.3f} after GRPO"
    assert result.after.reward > result.before.reward
    assert [step for step, _ in result.val_curve] == [0, 10, 20, LEARNING_STEPS]


def greedy_exact_share(model_dir: Path, tokenizer_dir: Path, rows: list[dict[str, Any]]) -> float:
    """Held-out exact answers by an independent route: transformers' greedy `generate` on the chat-templated
    prompts (all of one length, so no padding), answers compared with the prompt's digits reversed."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    texts = [tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True) for row in rows]
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=6,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    answers = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    digits = [row["prompt"][0]["content"].removeprefix("reverse ") for row in rows]
    return sum(answer.strip() == d[::-1] for answer, d in zip(answers, digits, strict=True)) / len(rows)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RLLOOM_FULL_DEMOS"), reason="the full demo: RLLOOM_FULL_DEMOS=1 to run it")
def test_default_demo_improves_held_out_answers(tmp_path: Path) -> None:
    """The README's main job with its embedded defaults (seed 0, about a minute on 2 idle cores; `nox -s demo`
    runs the same): GRPO must clearly raise the held-out exact answers from a partial warm-up start. Opt-in, so a
    busy CI machine never times out on it; the short run above is what CI checks."""
    result = run_demo(output_dir=tmp_path / "run", seed=0, overrides=["trainer.trackers=[jsonl]"])
    assert 0.05 <= result.before.exact <= 0.5, "the warm-up should stop with the task partly learned"
    assert result.after.exact >= result.before.exact + 0.3
    assert result.after.reward > result.before.reward
    assert (tmp_path / "run" / "checkpoints" / "step_150" / "model.safetensors").exists()
