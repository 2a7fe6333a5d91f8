"""Search-R1's four published launch scripts, their overrides verbatim after `python3 -m verl.trainer.main_ppo`
(tests/data/search_r1_scripts, from github.com/PeterGriffinJin/Search-R1 at a14dc3a, Apache-2.0), pass
`search-agent train --dry-run`: every key maps to its meaning here or is listed as infrastructure, and the run
resolves to the scripts' values (issue 40 items 1 and 3)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlloom_apps.search_agent.cli import main

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")

SCRIPTS = Path(__file__).parent / "data" / "search_r1_scripts"

# the scripts' own values, read off the .sh files by hand: (rollout.n = n_agent, actor lr, estimator, format scores)
PUBLISHED: dict[str, tuple[int, float, str, tuple[float, float, float] | None]] = {
    "v0.2_train_grpo": (5, 1e-6, "grpo", None),
    "v0.2_train_ppo": (1, 1e-6, "gae", None),
    "v0.3_train_grpo_format": (5, 5e-7, "grpo", (0.2, 0.1, 0.0)),
    "v0.3_train_ppo_format": (1, 1e-6, "gae", (0.2, 0.1, 0.0)),
}
# keys whose name and meaning are the same here: they need no line in the summary
SAME_NAME = {"data.train_batch_size", "trainer.total_epochs", "trainer.critic_warmup"}


def _rows(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    row = {
        "data_source": "nq",
        "prompt": [{"role": "user", "content": "who wrote hamlet?"}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["Shakespeare"]}},
        "ability": "fact-reasoning",
        "extra_info": {"split": "train", "index": 0},
    }
    for name in ("train.parquet", "test.parquet"):
        pq.write_table(pa.Table.from_pylist([row]), folder / name)
    return folder


def _overrides(name: str, data_dir: Path) -> list[str]:
    """The script's overrides as the shell hands them to Python (quotes removed), $DATA_DIR filled in."""
    text = (SCRIPTS / f"{name}.txt").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [shlex.split(line.replace("{data_dir}", str(data_dir)))[0] for line in lines]


def _dry_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[dict[str, Any], str]:
    main(["train", "--dry-run", *argv])
    out = capsys.readouterr().out
    body = "\n".join(line for line in out.splitlines() if not line.startswith("#"))
    return yaml.safe_load(body), out


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_published_launch_script_passes_dry_run_verbatim(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _rows(tmp_path / "data" / "nq_hotpotqa_train")
    items = _overrides(name, data)
    counts = {"v0.2_train_grpo": 52, "v0.2_train_ppo": 61, "v0.3_train_grpo_format": 55, "v0.3_train_ppo_format": 64}
    assert len(items) == counts[name]  # the counts
    resolved, out = _dry_run(capsys, items)
    n, lr, estimator, scores = PUBLISHED[name]
    search = resolved["search"]
    assert search["max_turns"] == 5  # Search-R1's max_turns=4 search turns + its answer turn
    assert "search turns: 4 + the answer turn" in out
    assert (search["top_k"], search["max_obs_tokens"], search["max_total_tokens"]) == (3, 500, 4096)
    assert search["retrieval_api"] == "search-r1"
    assert resolved["rollout"]["n"] == n
    assert resolved["actor"]["lr"] == pytest.approx(lr)
    assert resolved["algorithm"]["advantage"]["estimator"] == estimator
    assert resolved["rollout"]["max_tokens"] == 500 and resolved["rollout"]["engine"] == "vllm"
    assert resolved["data"]["train_batch_size"] == 512 and resolved["data"]["max_prompt_length"] == 2048
    assert resolved["actor"]["mini_batch_size"] == (52 if n == 5 else 256)  # 256 trajectories / n_agent, rounded up
    assert resolved["distributed"]["num_ranks"] == 8  # n_gpus_per_node=8 x nnodes=1
    assert resolved["distributed"]["param_offload"] and resolved["distributed"]["optimizer_offload"]
    assert resolved["trainer"]["val_before_train"] is True and resolved["trainer"]["total_steps"] == 1005
    if estimator == "gae":
        assert "#   config: ppo" in out
        assert resolved["critic"]["lr"] == pytest.approx(1e-5) and resolved["critic"]["warmup_ratio"] == 0.015
    fmt = search["format_reward"]
    got = None if fmt is None else (fmt["structure_format_score"], fmt["final_format_score"], fmt["retrieval_score"])
    assert got == scores
    assert f"#   train data: {data / 'train.parquet'}" in out
    assert "#   retrieval: server http://127.0.0.1:8000 " in out
    summary = [line for line in out.splitlines() if line.startswith(("#   mapped:", "#   ignored:"))]
    silent = {item for item in items if not any(f" {item} " in f"{line} " for line in summary)}
    assert {item.partition("=")[0] for item in silent} == SAME_NAME - ({"trainer.critic_warmup"} if n == 5 else set())
    assert len(summary) == len(set(summary))  # each once (default_hdfs_dir is typed twice)


def test_dry_run_never_imports_torch(tmp_path: Path) -> None:
    items = _overrides("v0.2_train_grpo", _rows(tmp_path / "data"))
    code = (
        "import sys\nfrom rlloom_apps.search_agent.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as exit:\n    print('exit', exit.code)\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "train", "--dry-run", *items],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False False"
    assert "exit" not in done.stdout  # returned normally: exit 0


@pytest.mark.parametrize(
    ("item", "fix"),
    [
        ("actor_rollout_ref.actor.state_masking=false", "always keeps retrieved <information> tokens out of the loss"),
        ("algorithm.no_think_rl=true", "not offered here"),
        ("data.train_data_num=1000", "prepare-data --limit N"),
        ("trainer.default_hdfs_dir=hdfs://x/ckpt", "trainer.output_dir"),
        ("do_search=false", "eval --method direct"),
        ("max_turns=-1", "whole number >= 0"),
    ],
)
def test_a_key_that_would_change_the_run_is_refused_with_the_fix(
    item: str, fix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = item.partition("=")[0]
    items = [i for i in _overrides("v0.2_train_grpo", _rows(tmp_path / "d")) if i.partition("=")[0] != key]
    with pytest.raises(SystemExit) as exit:
        main(["train", "--dry-run", *items, item])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert repr(item) in err and fix in err


def test_search_r1_keys_are_no_longer_pointed_at_the_wrong_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """data.max_obs_length suggested data.max_prompt_length and retriever.url suggested trainer (issue 40)."""
    data = _rows(tmp_path / "d")
    argv = [f"data.train_files={data / 'train.parquet'}", "model.path=/m", "data.max_obs_length=300"]
    resolved, out = _dry_run(capsys, [*argv, "retriever.url=http://10.0.0.2:9000/retrieve", "max_turns=2"])
    assert resolved["search"]["max_obs_tokens"] == 300 and resolved["search"]["max_turns"] == 3
    assert "--retrieval-url http://10.0.0.2:9000 with search.retrieval_api=search-r1" in out
    assert resolved["data"]["max_prompt_length"] is None  # no max_start_length typed: ours unchanged


def test_a_flag_and_its_search_r1_key_must_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _rows(tmp_path / "d")
    with pytest.raises(SystemExit):
        main([
            "train", "--dry-run", "--train-data", str(data / "test.parquet"),
            f"data.train_files={data / 'train.parquet'}", "retriever.url=http://h:1/retrieve", "model.path=/m",
        ])  # fmt: skip
    assert "disagree" in capsys.readouterr().err


def test_dry_run_reads_the_data_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rows.jsonl"
    bad.write_text(json.dumps({"question": "q"}) + "\n")  # no data_source, no gold answer
    with pytest.raises(SystemExit):
        main(["train", "--dry-run", "--train-data", str(bad), "--retrieval-url", "http://h:1", "model.path=/m"])
    assert "is not a prepare-data row" in capsys.readouterr().err


def test_verl_data_keys_alone_stand_in_for_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _rows(tmp_path / "d")
    index = tmp_path / "not_an_index"
    index.mkdir()
    argv = [f"data.train_files={data / 'train.parquet'}", "--index", str(index), "model.path=/m"]
    with pytest.raises(SystemExit):
        main(["train", "--dry-run", *argv])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # the error line (the usage above it names the flags)
    assert f"--index {index}" in err and "--train-data" not in err  # the data key was read; the index is checked


def test_verl_lists_of_data_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """data.train_files as veRL's list (several parquet files, one split in order); each file is read and checked,
    and a missing one is named by its place in the list."""
    nq, hotpot = _rows(tmp_path / "nq"), _rows(tmp_path / "hotpotqa")
    files = f"['{nq / 'train.parquet'}', '{hotpot / 'train.parquet'}']"
    argv = [f"data.train_files={files}", f"data.val_files={nq / 'test.parquet'}", "retriever.url=http://h:1/retrieve"]
    _, out = _dry_run(capsys, [*argv, "model.path=/m"])
    assert f"#   train data: {nq / 'train.parquet'}, {hotpot / 'train.parquet'}" in out
    assert f"#   val data: {nq / 'test.parquet'}" in out
    assert f"mapped:  data.train_files={files} -> --train-data {nq / 'train.parquet'}, " in out
    gone = tmp_path / "gone.parquet"
    with pytest.raises(SystemExit):
        main(
            ["train", "--dry-run", f"data.train_files=['{nq / 'train.parquet'}', '{gone}']", *argv[1:], "model.path=/m"]
        )
    assert f"data.train_files[1] {gone} does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--dry-run", "data.train_files=[]", *argv[1:], "model.path=/m"])
    assert "expected a file path or a list of them" in capsys.readouterr().err
