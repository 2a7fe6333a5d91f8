"""veRL's own GRPO and PPO launch scripts (tests/data/verl_scripts, from github.com/volcengine/verl at b178a3c,
Apache-2.0), their overrides verbatim after `python3 -m verl.trainer.main_ppo`, pass `reasoning train --dry-run`:
every key maps to its meaning here, has the same name, or is listed as infrastructure, and the run resolves to the
scripts' values (issue 40 item 1). data.train_files/val_files (one parquet file, or a list of them) are read as the
--train-data/--val-data rows, each file checked before torch."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlloom_apps.reasoning.cli import main

from rlloom.core_rl.data import write_jsonl

SCRIPTS = Path(__file__).parent / "data" / "verl_scripts"
# keys whose name and meaning are the same here: no line in the summary
SAME_NAME = {
    "data.train_batch_size",
    "data.max_prompt_length",
    "data.filter_overlong_prompts",
    "trainer.critic_warmup",
    "trainer.total_epochs",
    "trainer.val_before_train",
}
# the scripts' own values, read off the .sh files by hand
PUBLISHED: dict[str, dict[str, Any]] = {
    "grpo": {
        "keys": 37,
        "estimator": "grpo",
        "n": 5,
        "lr": 1e-6,
        "batch": 1024,
        "mini": 256,
        "prompt": 512,
        "response": 1024,
        "critic_lr": None,
        "kl_loss": True,
        "mapped": 27,  # 25 config keys and the two data files
        "ignored": 4,
    },
    "ppo": {
        "keys": 43,
        "estimator": "gae",
        "n": 1,
        "lr": 1e-6,
        "batch": 4096,
        "mini": 512,
        "prompt": 4096,
        "response": 4096,
        "critic_lr": 1e-5,
        "kl_loss": False,
        "mapped": 30,
        "ignored": 7,
    },
}


def _overrides(name: str, data_dir: Path) -> list[str]:
    """The script's overrides as the shell hands them to Python (quotes removed), $HOME/data filled in."""
    lines = [line for line in (SCRIPTS / f"{name}.txt").read_text().splitlines() if line and not line.startswith("#")]
    return [shlex.split(line.replace("{data_dir}", str(data_dir)))[0] for line in lines]


ROW = {
    "prompt": [{"role": "user", "content": "1+1?"}],
    "reward_model": {"ground_truth": "2"},
    "data_source": "openai/gsm8k",
}


def _rows(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    return rows


def _parquet_files(items: list[str]) -> list[Path]:
    """The script's data files, written as veRL's parquet rows (1 row per file, its place in the list as answer)."""
    paths = []
    for item in items:
        key, _, value = item.partition("=")
        if key in ("data.train_files", "data.val_files"):
            loaded = yaml.safe_load(value)
            paths += [Path(p) for p in (loaded if isinstance(loaded, list) else [loaded])]
    for i, path in enumerate(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, [{**ROW, "reward_model": {"ground_truth": str(i)}}])
    return paths


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_verl_example_script_passes_dry_run_verbatim(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    want = PUBLISHED[name]
    items = _overrides(name, tmp_path)
    assert len(items) == want["keys"]
    script = items  # verbatim, data files included
    files = _parquet_files(items)
    main(["train", "--dry-run", *script])
    out = capsys.readouterr().out
    half = len(files) // 2  # train files first, then val files, in each script
    assert f"# train data: {', '.join(map(str, files[:half]))} (rows checked)" in out
    assert f"# val data: {', '.join(map(str, files[half:]))}" in out
    resolved = yaml.safe_load("\n".join(line for line in out.splitlines() if not line.startswith("#")))
    assert resolved["algorithm"]["advantage"]["estimator"] == want["estimator"]
    assert resolved["rollout"]["n"] == want["n"]
    assert resolved["actor"]["lr"] == pytest.approx(want["lr"])
    assert (resolved["data"]["train_batch_size"], resolved["actor"]["mini_batch_size"]) == (want["batch"], want["mini"])
    assert (resolved["data"]["max_prompt_length"], resolved["rollout"]["max_tokens"]) == (
        want["prompt"],
        want["response"],
    )
    assert resolved["algorithm"]["kl"]["use_loss"] is want["kl_loss"]
    assert resolved["distributed"]["num_ranks"] == 8  # n_gpus_per_node=8 x nnodes=1
    if want["critic_lr"] is not None:  # PPO: GAE with a critic of the script's model and lr
        assert resolved["critic"]["lr"] == pytest.approx(want["critic_lr"])
        assert resolved["critic"]["path"] == "Qwen/Qwen2-7B-Instruct"
        assert resolved["critic"]["mini_batch_size"] == want["mini"]  # veRL's critic takes the actor's
        assert resolved["critic"]["max_tokens_per_micro_batch"] == 98304
        assert "(from ppo)" in out.splitlines()[0]  # gae: the bundled ppo config, one sample per prompt
    summary = [line.removeprefix("#   ") for line in out.splitlines() if line.startswith("#   ")]
    mapped = [line for line in summary if line.startswith("mapped:")]
    ignored = [line for line in summary if line.startswith("ignored:")]
    assert (len(mapped), len(ignored)) == (want["mapped"], want["ignored"])
    for item in script:  # every key typed: in the summary once, or a key with the same name and meaning here
        key = item.partition("=")[0]
        if key in ("trainer.n_gpus_per_node", "trainer.nnodes"):
            item = "trainer.n_gpus_per_node=8 x trainer.nnodes=1"
        hits = [line for line in summary if line.partition(":")[2].lstrip().startswith(f"{item} ")]
        assert len(hits) == 1 or (key in SAME_NAME and not hits), (item, hits)


def test_a_truncation_rlloom_does_not_do_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--dry-run", "--train-data", str(_rows(tmp_path)), "data.truncation=left"])
    assert "'data.truncation=left' (veRL's name): rlloom never truncates a prompt" in capsys.readouterr().err
