"""`<app> plot RUN_DIR`: a run's curves from metrics.jsonl (issue 29)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rlloom.core_rl.observe.curves import add_plot_command, read_run_series, run_plot_command, save_run_plot

RECORDS = [
    {"step": 1, "reward/mean": 0.1, "response_length/mean": 40.0, "actor/kl_mean": 0.0, "actor/entropy": 2.0},
    {"step": 2, "reward/mean": 0.3, "response_length/mean": 44.0, "actor/kl_mean": 0.01, "actor/entropy": 1.9},
    {"step": 2, "val/reward/mean": 0.25},
    {"step": 3, "reward/mean": 0.5, "rollout/searches/mean": 1.5, "actor/entropy": 1.7},
]


def _run(tmp_path: Path, *, cut: bool = False) -> Path:
    lines = [json.dumps(r) for r in RECORDS]
    text = "\n".join(lines) + ("\n{" if cut else "\n")  # an interrupted run can leave half a line
    (tmp_path / "metrics.jsonl").write_text(text, encoding="utf-8")
    return tmp_path


def test_series_are_read_per_panel(tmp_path: Path) -> None:
    panels = read_run_series(_run(tmp_path, cut=True) / "metrics.jsonl")
    assert panels == {
        "reward": {"reward/mean": [(1, 0.1), (2, 0.3), (3, 0.5)], "val/reward/mean": [(2, 0.25)]},
        "response length (tokens)": {"response_length/mean": [(1, 40.0), (2, 44.0)]},
        "KL to the reference": {"actor/kl_mean": [(1, 0.0), (2, 0.01)]},
        "entropy": {"actor/entropy": [(1, 2.0), (2, 1.9), (3, 1.7)]},
        "searches per sample": {"rollout/searches/mean": [(3, 1.5)]},
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="app")
    add_plot_command(parser.add_subparsers(dest="command"), "app")
    return parser


def test_a_folder_without_metrics_is_refused_naming_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    with pytest.raises(SystemExit):
        run_plot_command(parser, parser.parse_args(["plot", str(tmp_path)]))
    assert f"RUN_DIR {tmp_path} has no metrics.jsonl" in capsys.readouterr().err


def test_plot_writes_a_png_with_a_panel_per_logged_series(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = pytest.importorskip("matplotlib.image")
    run = _run(tmp_path)
    parser = _parser()
    run_plot_command(parser, parser.parse_args(["plot", str(run)]))
    png = run / "curves.png"
    assert capsys.readouterr().out.startswith(f"wrote {png} (reward, response length (tokens), KL to the reference")
    height, width, _ = image.imread(png).shape
    assert (width, height) == (7 * 110, int(2.4 * 5 * 110))  # figsize x dpi: five panels stacked
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "metrics.jsonl").write_text(json.dumps(RECORDS[0]), encoding="utf-8")
    assert save_run_plot(tmp_path / "two" / "metrics.jsonl", tmp_path / "two.png", title="t") == [
        "reward",
        "response length (tokens)",
        "KL to the reference",
        "entropy",
    ]
