"""`search-agent demo`: the synthetic world, its demonstrations, and the README's claim that GRPO teaches search."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from rlloom_apps.search_agent.cli import main
from rlloom_apps.search_agent.demo import LOOP, DemoSettings, run_demo
from rlloom_apps.search_agent.synthetic import ENV_CONFIG, Demonstrator, World, make_world
from transformers import AutoModelForCausalLM

from rlloom.agent import AgentLoop, SearchEnv
from rlloom.core_rl import word_tokenizer
from rlloom.core_rl.contracts import SamplingParams
from rlloom.core_rl.workers import load_pretrained_tokenizer
from rlloom.retrieval import build_index, load_index
from rlloom.rollout import HFEngine


def test_world_is_reproducible_and_held_out_names_are_new_pairs_of_known_syllables() -> None:
    world = make_world(3, syllables=12, names=60, held_out=10)
    assert world == make_world(3, syllables=12, names=60, held_out=10)
    assert len(world.train_names) == 50 and len(world.held_out_names) == 10
    assert not set(world.train_names) & set(world.held_out_names)
    trained_syllables = {s for n in world.train_names for s in n.split()}
    assert all(len(n.split()) == 2 and set(n.split()) <= set(world.syllables) for n in world.held_out_names)
    assert len(trained_syllables) > 0.8 * len(world.syllables)
    first = world.held_out_names[0]
    assert world.rows([first]) == [{"question": first, "answer": [world.codes[first]], "data_source": "synthetic"}]
    with pytest.raises(ValueError, match="held_out"):
        make_world(0, syllables=4, names=7, held_out=2)  # 6 unordered pairs of distinct syllables


@pytest.fixture(scope="module")
def small_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, Any]:
    world = make_world(0, syllables=12, names=60, held_out=10)
    root = tmp_path_factory.mktemp("world")
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in world.corpus()))
    return world, load_index(build_index(root / "corpus.jsonl", root / "index", "bm25", stopwords="none"))


def test_searching_a_name_finds_its_own_passage_first(small_world: tuple[World, Any]) -> None:
    world, index = small_world
    names = [*world.train_names, *world.held_out_names]
    hits = index.search(names, 1)
    assert [h[0].title for h in hits] == names


@pytest.mark.parametrize(("share", "searches", "em"), [(1.0, 1.0, 1.0), (0.0, 0.0, None)])
def test_demonstrations_search_and_copy_or_guess(
    small_world: tuple[World, Any], share: float, searches: float, em: float | None
) -> None:
    world, index = small_world
    tok = word_tokenizer(world.vocabulary())
    rows = world.rows(world.train_names)
    loop = AgentLoop(
        Demonstrator(tok, share, seed=0),
        tok,
        lambda: SearchEnv(index, None, ENV_CONFIG),
        LOOP.model_copy(update={"sampling": SamplingParams(seed=0)}),
    )
    trajectories = loop.run(rows)
    assert [t.metrics.get("searches", 0.0) for t in trajectories] == [searches] * len(rows)
    assert all(t.metrics["turns"] == 1 + searches and t.finish_reason == "stop" for t in trajectories)
    if em is not None:  # searched: the answer is the passage's code, so exact match everywhere
        assert [t.reward for t in trajectories] == [em] * len(rows)
    unk = tok.unk_token_id
    assert all(unk not in t.prompt_ids + t.response_ids for t in trajectories), "a word is missing from vocabulary()"


def test_demo_refuses_a_mistyped_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "x"), "actor.learning_rate=1e-3"])
    assert "actor.learning_rate" in capsys.readouterr().err


SEARCH_STEPS = 5
HELD_OUT_EM_MARGIN = 0.2  # at least 16 more of the 80 held-out names answered right after GRPO
ANSWER = re.compile(r"<answer>\s*(\S+)\s*</answer>")


def test_short_fixed_seed_run_learns_to_search(tmp_path: Path) -> None:
    """The demo's defaults and seed 0 (the same world, model and 2,500-step warm-up), cut to its first 5 GRPO steps
    (about 75 s on an idle 2-core machine; the 40-step run stays in `nox -s demo-search`). Before GRPO the
    warmed-up model answers held-out names greedily without searching; after, it searches and copies the code.

    Recorded for seed 0 (one torch thread): held-out EM 0.0125 before GRPO and 0.95 at step 5, searches per
    question 0.0125 -> 1.00 (the README's 40-step run reads 0.97 at step 5). The same seed is not the same run on
    every CPU: on an AMD EPYC with AVX2 only (29th session) step 5 read EM 0.26 with searches 1.00 (the float
    kernels differ), so the margin is what chance cannot give, not one host's figure. Why a rise of 0.2 cannot
    come by chance: codes are drawn uniformly from 90 two-digit values and held-out names are never trained on, so
    a conversation that does not search is right 1 time in 90; 16 or more such hits out of 80 has a probability
    below 1e-15 (and a right code without a search fails the test anyway). The after-GRPO figures are checked
    independently of the trainer and the env's
    reward: the step-5 checkpoint is reloaded from disk, and each greedy conversation's last `<answer>` is read
    and compared with the world's code by hand.
    """
    out = tmp_path / "run"
    result = run_demo(
        output_dir=out, steps=SEARCH_STEPS, seed=0, overrides=["trainer.val_every=5", "trainer.trackers=[jsonl]"]
    )
    assert result.before.searches <= 0.2 and result.before.em <= 0.1
    checkpoint = out / "checkpoints" / f"step_{SEARCH_STEPS}"
    assert (checkpoint / "model.safetensors").exists()
    settings = DemoSettings()
    world = make_world(0, names=settings.names, held_out=settings.held_out)
    right, searched = answers_of_held_out_names(checkpoint, out, world)
    assert sum(right) / len(right) == pytest.approx(result.after.em)
    assert sum(searched) / len(searched) >= 0.9 and result.after.searches >= 0.9
    assert result.after.em >= result.before.em + HELD_OUT_EM_MARGIN
    assert not any(r and not s for r, s in zip(right, searched, strict=True)), "a right code without a search"
    # the wiring: validation before GRPO and at step 5, the searches curve, the summary
    assert [step for step, _ in result.val_curve] == [0, SEARCH_STEPS]
    assert result.search_curve[-1][1] == pytest.approx(result.after.searches)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["after_grpo"]["em"] == pytest.approx(result.after.em)
    assert summary["grpo_steps"] == SEARCH_STEPS


def answers_of_held_out_names(model_dir: Path, run: Path, world: World) -> tuple[list[bool], list[bool]]:
    """Greedy conversations of the model saved in `model_dir` on the held-out names, against the run's own index:
    per name, whether the last `<answer>` is the world's code and whether the conversation searched."""
    tokenizer = load_pretrained_tokenizer(run / "tokenizer")
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tokenizer)
    index = load_index(run / "index")
    greedy = LOOP.model_copy(update={"sampling": SamplingParams(temperature=0.0), "compute_reward": False})
    try:
        trajectories = AgentLoop(engine, tokenizer, lambda: SearchEnv(index, None, ENV_CONFIG), greedy).run(
            world.rows(world.held_out_names)
        )
    finally:
        engine.close()
    right, searched = [], []
    for name, traj in zip(world.held_out_names, trajectories, strict=True):
        answers = ANSWER.findall(traj.response_text)
        right.append(bool(answers) and answers[-1] == world.codes[name])
        searched.append("<search>" in traj.response_text)
    return right, searched


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RLLOOM_FULL_DEMOS"), reason="the full demo: RLLOOM_FULL_DEMOS=1 to run it")
def test_default_demo_teaches_the_model_to_search(tmp_path: Path) -> None:
    """The demo with its embedded defaults (seed 0, about 2.5 minutes on 2 cores; `nox -s demo-search` runs the
    same): before GRPO the warmed-up model answers held-out names greedily without searching (so almost never
    right); after, it searches and copies. Opt-in, so a busy CI machine never times out on it; the short run above
    is what CI checks."""
    result = run_demo(output_dir=tmp_path / "run", seed=0, overrides=["trainer.trackers=[jsonl]"])
    assert result.before.searches <= 0.2 and result.before.em <= 0.1
    assert result.after.searches >= 0.9
    assert result.after.em >= result.before.em + 0.5
    assert result.val_curve[0][0] == 0 and result.val_curve[-1][0] == 40
    assert result.search_curve[-1][1] == pytest.approx(result.after.searches)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["after_grpo"]["em"] == pytest.approx(result.after.em)
    assert (tmp_path / "run" / "checkpoints" / "step_40" / "model.safetensors").exists()


def test_demo_runs_on_a_pretrained_checkpoint_folder(tmp_path: Path) -> None:
    """`--model DIR`: the checkpoint and its own tokenizer replace the tiny model; the pretrained config is used,
    the warm-up trains the loaded weights, and GRPO starts from the warmed-up copy (a saved tiny char model stands
    in for SmolLM2 here; the figures of a real run are in the README)."""
    from dataclasses import replace

    import torch
    from rlloom_apps.search_agent.demo import PRETRAINED_LOOP, pretrained_settings

    from rlloom.core_rl.tiny import save_tiny_model

    saved = save_tiny_model(tmp_path / "pretrained", max_position_embeddings=512)
    settings = replace(
        pretrained_settings(saved.model, saved.tokenizer), names=24, held_out=4, warmup_steps=3, warmup_batch_size=2
    )
    small = ["data.train_batch_size=2", "rollout.n=2", "trainer.val_every=1", "trainer.trackers=[jsonl]"]
    result = run_demo(output_dir=tmp_path / "run", steps=1, seed=0, overrides=small, settings=settings)
    run = tmp_path / "run"
    config = (run / "config.yaml").read_text()
    assert "lr: 2.0e-05" in config and f"max_tokens: {PRETRAINED_LOOP.max_tokens_per_turn}" in config
    assert result.warmup_steps == 3 and result.grpo_steps == 1 and [s for s, _ in result.val_curve] == [0, 1]
    original = AutoModelForCausalLM.from_pretrained(saved.model).state_dict()
    warmed = AutoModelForCausalLM.from_pretrained(run / "warmup_model").state_dict()
    assert any(not torch.equal(original[k], warmed[k]) for k in original), "the warm-up left the weights unchanged"
    # the run's tokenizer folder is the checkpoint's own (a char vocabulary), not a word vocabulary of the world
    assert json.loads((run / "tokenizer" / "tokenizer.json").read_text()) == json.loads(
        (saved.tokenizer / "tokenizer.json").read_text()
    )


def test_demo_refuses_a_missing_model_folder_and_a_lone_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "x"), "--model", str(tmp_path / "nope")])
    assert f"--model {tmp_path / 'nope'}: not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--out", str(tmp_path / "y"), "--tokenizer", str(tmp_path)])
    assert "--tokenizer goes with --model" in capsys.readouterr().err
