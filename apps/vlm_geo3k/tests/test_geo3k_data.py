import json
import shutil
from pathlib import Path

import pytest
from rlloom_apps.vlm_geo3k.cli import main
from rlloom_apps.vlm_geo3k.data import to_row

from rlloom.multimodal import load_image

DATA = Path(__file__).parent / "data"


def test_problem_11_row() -> None:
    row = to_row(DATA / "11", "train")
    # data.json: choices 30/40/60/80, answer "D"
    assert row["reward_model"]["ground_truth"] == ["80", "D"]
    content = row["prompt"][0]["content"]
    assert content.startswith("<image>In \\odot X, A B = 30")
    assert "Choices: A. 30 B. 40 C. 60 D. 80" in content
    assert load_image(row["images"][0]).mode == "RGB"


def test_missing_image_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "99"
    broken.mkdir()
    shutil.copy(DATA / "11" / "data.json", broken / "data.json")
    with pytest.raises(FileNotFoundError, match="img_diagram.png"):
        to_row(broken, "train")


def test_cli_converts_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    main(["prepare-data", "--input", str(DATA), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["id"] for r in rows] == [11, 12, 14]
