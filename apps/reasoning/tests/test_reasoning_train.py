"""`reasoning train`: every bundled algorithm config runs on a tiny model with the real engine and scorers.

The configs are the published GPU setups; here their geometry is shrunk by overrides (what a user would do on a
small machine) and each must train one step with the estimator it names, score samples through the rewards
registry, and write a loadable checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rlloom_apps.reasoning.cli import main
from rlloom_apps.reasoning.train import ALGORITHMS, config_file, load_train_config

from rlloom.core_rl.config.schema import AlgorithmConfig, ConfigError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from rlloom.core_rl.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    saved = save_tiny_model(root, max_position_embeddings=512)
    rows = root / "rows.jsonl"
    with rows.open("w") as out:
        for i, (a, b) in enumerate([(1, 2), (3, 4), (2, 2), (5, 1)]):
            row = {
                "data_source": "gsm8k",
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i},
            }
            out.write(json.dumps(row) + "\n")
    return {"model": saved.model, "tokenizer": saved.tokenizer, "rows": rows}


def small(tiny: dict[str, Path], out: Path, algorithm: str) -> list[str]:
    """Overrides that shrink a GPU config to a CPU step (the algorithm's own settings stay as the config has them)."""
    n = 1 if algorithm == "ppo" else 2
    published = yaml.safe_load(config_file(algorithm).read_text())["algorithm"]
    buffer = ["algorithm.overlong.buffer=3"] if published.get("overlong") else []  # within 6 tokens
    return [
        *buffer,
        "actor.warmup_steps=0",  # a published warm-up (DAPO's 10 steps) is longer than this one-step run
        f"model.path={tiny['model']}",
        f"model.tokenizer_path={tiny['tokenizer']}",
        "model.dtype=float32",
        "model.gradient_checkpointing=false",
        "data.train_batch_size=2",
        f"rollout.n={n}",
        "rollout.max_tokens=6",
        "rollout.val_n=1",
        "actor.mini_batch_size=2",
        "critic.mini_batch_size=2",
        "trainer.total_steps=1",
        "trainer.total_epochs=1",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.device=cpu",
        "trainer.trackers=[jsonl]",
        f"trainer.output_dir={out}",
    ]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_config_trains_a_step(algorithm: str, tiny: dict[str, Path], tmp_path: Path) -> None:
    published = yaml.safe_load(config_file(algorithm).read_text())
    out = tmp_path / "run"
    argv = ["train", "--config", algorithm, "--train-data", str(tiny["rows"]), "--score-workers", "1"]
    main([*argv, *small(tiny, out, algorithm)])
    saved = yaml.safe_load((out / "config.yaml").read_text())
    shrunk = {"overlong": {**published["algorithm"]["overlong"], "buffer": 3}} if algorithm == "dapo" else {}
    # the config's algorithm, as validated (a section given in part holds its defaults for the rest)
    expected = AlgorithmConfig.model_validate({**published["algorithm"], **shrunk}).model_dump(mode="json")
    assert {key: saved["algorithm"][key] for key in published["algorithm"]} == {
        key: expected[key] for key in published["algorithm"]
    }
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    # every sample was scored by the gsm8k scorer: a random tiny model answers nothing, so rewards are 0, not errors
    # (DAPO's soft overlong punishment subtracts from that)
    penalty = last.get("overlong/penalty_mean", 0.0)
    assert last["reward/mean"] == pytest.approx(penalty)
    assert ("overlong/penalty_mean" in last) == (algorithm == "dapo")
    assert last.get("reward/error_frac", 0.0) == 0.0
    if algorithm == "ppo":
        assert any(key.startswith("critic/") for key in last)
    if published["algorithm"].get("use_kl_in_reward"):
        assert any("kl" in key for key in last)
    assert (out / "checkpoints" / "step_1" / "config.json").is_file()


def test_config_errors_are_named(tiny: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a bundled config"):
        config_file("grpoo")
    with pytest.raises(ConfigError):
        load_train_config("grpo", ["actor.lrr=1e-6"])
    with pytest.raises(SystemExit):  # model.path left at SET_ME
        main(["train", "--config", "grpo", "--train-data", str(tiny["rows"])])


def test_data_and_flag_errors_are_one_line(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad data and flags end in one `reasoning train: error:` line naming the file:line or the key, not a traceback."""
    argv = ["train", "--config", "grpo", "--train-data", str(tiny["rows"]), *small(tiny, tmp_path / "run", "grpo")]
    with pytest.raises(SystemExit):  # the tiny chat template alone is longer than 5 tokens
        main([*argv, "--score-workers", "1", "data.max_prompt_length=5"])
    assert f"error: {tiny['rows']}:1: the prompt is" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # 4 rows cannot fill one batch of 20 with drop_last
        main([*argv, "--score-workers", "1", "data.drop_last=true", "data.train_batch_size=20"])
    assert "error: data.train_batch_size=20 exceeds the 4 training rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # training scores in worker processes only
        main([*argv, "--score-workers", "0"])
    assert "--score-workers must be 1 or more" in capsys.readouterr().err
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(b"PAR1\x15\x04\xff\xfe")
    bad_data = ["train", "--config", "grpo", "--train-data", str(parquet), "--score-workers", "1"]
    with pytest.raises(SystemExit):
        main([*bad_data, *small(tiny, tmp_path / "run", "grpo")])
    assert f"error: {parquet}: a parquet file" in capsys.readouterr().err
    empty = tmp_path / "val.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit):  # it validated nothing, silently
        main([*argv, "--score-workers", "1", "--val-data", str(empty)])
    assert f"error: --val-data {empty} holds no rows" in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoints").exists()
