"""`vlm-geo3k eval`: image requests built as in training, scored by answer accuracy, figures computed by hand;
and the CLI end to end on a saved tiny Qwen2.5-VL through the real HF engine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rlloom_apps.vlm_geo3k.cli import main
from rlloom_apps.vlm_geo3k.data import to_row
from rlloom_apps.vlm_geo3k.evaluate import vision_request
from transformers import AutoTokenizer

from rlloom.core_rl.contracts import Completion, GenerationRequest
from rlloom.multimodal.qwen_vl import QwenVLProcessing, VisionTokenIds
from rlloom.multimodal.tiny import save_tiny_vl_model
from rlloom.rewards.eval_runner import EvalSettings, run_eval
from rlloom.rewards.items import ScoreItem, score_item

DATA = Path(__file__).parent / "data"
BUDGET = QwenVLProcessing(min_pixels=56 * 56, max_pixels=112 * 112)
# image tokens of each fixture's diagram under BUDGET, worked out in test_vlm_geo3k_train.py: 8x8 and 6x10
# patches, 4 patches per token
IMAGE_TOKENS = {11: 16, 12: 15, 14: 15}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return save_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl"))


class ScriptedVLM:
    """Answers from a script, after checking each request carries its row's image the way training sends it."""

    def __init__(self, script: dict[int, list[str]], pad_id: int) -> None:
        self.script = script
        self.pad_id = pad_id
        self.seeds: list[int | None] = []

    async def agenerate(self, request: GenerationRequest) -> Sequence[Completion]:
        assert request.multimodal is not None and request.prompt_ids is not None
        assert {"pixel_values", "image_grid_thw", "position_ids"} <= set(request.multimodal)
        pads = request.prompt_ids.count(self.pad_id)
        row = next(r for r, tokens in IMAGE_TOKENS.items() if tokens == pads and r in self.script)
        self.seeds.append(request.sampling.seed)
        answers = self.script.pop(row)
        return [
            Completion(
                request_id=request.request_id,
                prompt_ids=request.prompt_ids,
                token_ids=[1] * 3,
                text=text,
                finish_reason="stop",
                sample_index=i,
            )
            for i, text in enumerate(answers)
        ]


def test_metrics_by_hand_on_real_rows(tiny: Any) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny.tokenizer)
    rows = [to_row(DATA / str(i), "test") for i in (11, 12, 14)]
    truths = [row["reward_model"]["ground_truth"][0] for row in rows]  # the choice values
    wrong = "\\boxed{1234}"
    script = {
        11: [f"\\boxed{{{truths[0]}}}"] * 4,  # 4 of 4 right
        12: [f"<think>x</think>\\boxed{{{truths[1]}}}", wrong, wrong, wrong],  # 1 of 4: the wrong answer wins the vote
        14: [wrong, "no answer", wrong, wrong],  # 0 of 4
    }
    engine = ScriptedVLM({k: list(v) for k, v in script.items()}, VisionTokenIds.from_tokenizer(tokenizer).image_pad)
    settings = EvalSettings(n=4, score_workers=1, seed=5)
    result = run_eval(engine, rows, settings, vision_request(settings, tokenizer, BUDGET), progress=False)
    assert sorted(engine.seeds) == [5, 6, 7]  # problem i samples with seed + i
    (source,) = result.report.sources
    assert source.data_source == "geometry3k" and source.problems == 3
    metrics = source.metrics
    assert metrics["avg@4"] == pytest.approx(5 / 12)
    assert metrics["pass@1"] == pytest.approx(5 / 12)
    # pass@2 = mean over problems of 1 - C(n-c, 2)/C(n, 2): 1, 1 - C(3,2)/C(4,2) = 1/2, 0
    assert metrics["pass@2"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert metrics["maj@4"] == pytest.approx(1 / 3)
    assert source.no_answer == 1


def test_cli_on_a_saved_tiny_vlm(tiny: Any, tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.jsonl"
    rows = [to_row(DATA / str(i), "test") for i in (11, 12)]
    rows_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv = ["eval", "--model", str(tiny.model), "--tokenizer", str(tiny.tokenizer), "--data", str(rows_file),
            "--n", "2", "--max-tokens", "4", "--temperature", "1.0", "--min-pixels", "3136", "--max-pixels", "12544",
            "--score-workers", "1", "--device", "cpu"]  # fmt: skip
    main([*argv, "--out", str(tmp_path / "a")])
    main([*argv, "--out", str(tmp_path / "b")])
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    assert results["sources"][0]["problems"] == 2 and results["sources"][0]["samples_per_problem"] == 2
    samples_a = (tmp_path / "a" / "samples_geometry3k.jsonl").read_text()
    assert samples_a == (tmp_path / "b" / "samples_geometry3k.jsonl").read_text()  # seeded: the run repeats
    records = [json.loads(line) for line in samples_a.splitlines()]
    assert len(records) == 4
    for record in records:  # each recorded score is the scorer's verdict on the recorded response
        row = rows[record["problem"]]
        item = ScoreItem(response=record["response"], ground_truth=row["reward_model"]["ground_truth"],
                         data_source="geometry3k")  # fmt: skip
        assert record["score"] == score_item(item).score


def test_cli_refuses_engines_that_cannot_take_images(tiny: Any, tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text(json.dumps(to_row(DATA / "11", "test")) + "\n")
    with pytest.raises(SystemExit):
        main(["eval", "--engine-url", "http://127.0.0.1:9", "--tokenizer", str(tiny.tokenizer), "--data",
              str(rows_file)])  # fmt: skip


@pytest.mark.parametrize(
    ("response", "accuracy"),
    [
        ("i WdrS9X", 0.0),  # a random reply holding the right number: not an answer
        ("<think>the angle is 80</think> so 80", 0.0),  # the right value, unboxed
        ("<think>the angle is 80</think> \\boxed{80}", 1.0),
        ("<think>option D</think> \\boxed{D}", 1.0),
    ],
)
def test_geometry3k_counts_only_a_boxed_answer_in_eval_and_training(response: str, accuracy: float) -> None:
    from rlloom_apps.vlm_geo3k.train import SCORERS

    from rlloom.rewards.evaluation import evaluate_samples
    from rlloom.rewards.trainer_reward import RegistryReward

    row = to_row(DATA / "11", "test")  # choices 30/40/60/80, answer D
    report = evaluate_samples([row], [[response]], [1], workers=0)
    assert report.records[0].score == accuracy and report.records[0].error is None

    class Traj:
        response_text, data_source = response, "geometry3k"
        ground_truth, extra_info = row["reward_model"]["ground_truth"], row["extra_info"]

    with RegistryReward(workers=1, scorers=SCORERS) as reward:
        (result,) = reward([Traj()])
    assert result.components["accuracy"] == accuracy


def test_cli_names_bad_rows_and_flags_before_sampling(
    tiny: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = {**to_row(DATA / "11", "test"), "images": [str(tmp_path / "gone" / "img_diagram.png")]}
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text(json.dumps(to_row(DATA / "12", "test")) + "\n" + json.dumps(moved) + "\n")
    base = ["eval", "--model", str(tiny.model), "--tokenizer", str(tiny.tokenizer), "--data", str(rows_file),
            "--n", "1", "--max-tokens", "2", "--score-workers", "1", "--device", "cpu"]  # fmt: skip
    with pytest.raises(SystemExit):  # was a FileNotFoundError traceback after the model had loaded
        main(base)
    err = capsys.readouterr().err
    assert "--data row 1: image " in err and "gone/img_diagram.png does not exist" in err and "Traceback" not in err
    with pytest.raises(SystemExit):  # was named by the training config's keys, vision.min_pixels
        main([*base, "--min-pixels", "20000", "--max-pixels", "12544"])
    assert "--min-pixels 20000 exceeds --max-pixels 12544" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # was a pydantic traceback after the model had loaded
        main([*base, "--chat-template-kwargs", '{"add_generation_prompt": false}'])
    assert "--chat-template-kwargs: add_generation_prompt cannot be set there" in capsys.readouterr().err


def test_train_names_a_row_whose_markers_and_images_disagree(tiny: Any, tmp_path: Path) -> None:
    from rlloom_apps.vlm_geo3k.train import load_config, run_train

    from rlloom.core_rl.config import ConfigError

    row = to_row(DATA / "11", "train")
    row["prompt"][0]["content"] = "<image>" + row["prompt"][0]["content"]  # two markers, one image
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text(json.dumps(row) + "\n")
    config, vision = load_config("grpo", [f"model.path={tiny.model}", f"model.tokenizer_path={tiny.tokenizer}"])
    with pytest.raises(
        ConfigError, match=r"--train-data .*rows.jsonl: image row \(extra_info.id=11.*2 <image> markers"
    ):
        run_train(config, vision, train_data=rows_file)
