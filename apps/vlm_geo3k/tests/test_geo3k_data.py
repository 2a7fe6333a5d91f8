import json
import shutil
from pathlib import Path

import pytest
from rlloom_apps.vlm_geo3k.cli import main
from rlloom_apps.vlm_geo3k.data import DataError, to_row

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
    with pytest.raises(DataError, match="img_diagram.png"):
        to_row(broken, "train")


def test_cli_converts_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    main(["prepare-data", "--input", str(DATA), "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["extra_info"]["id"] for r in rows] == [11, 12, 14]


def _problem(root: Path, name: str = "11") -> Path:
    folder = root / name
    shutil.copytree(DATA / "11", folder)
    return folder


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()  # prepare-data's usage (wrapped) + one error line
    assert lines[0].startswith("usage: vlm-geo3k prepare-data ") and all(line.startswith(" ") for line in lines[1:-1])
    assert lines[-1].startswith("vlm-geo3k prepare-data: error: ")
    return lines[-1]


def test_prepare_data_mistakes_are_one_line_errors_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.jsonl"
    (tmp_path / "empty").mkdir()
    assert "holds no Geometry3K problem folders" in _refused(
        ["prepare-data", "--input", str(tmp_path / "empty"), "--out", str(out)], capsys
    )
    single = _problem(tmp_path / "single")
    assert "is one problem folder" in _refused(["prepare-data", "--input", str(single), "--out", str(out)], capsys)
    cases = {
        "data.json": ("{broken", "data.json:1: not valid JSON"),
        "answer": (None, "answer letter A-D, got"),
        "img_diagram.png": (b"not a picture", "img_diagram.png: not a readable image"),
        "missing": (None, "lacks img_diagram.png"),
    }
    for case, (content, message) in cases.items():
        root = tmp_path / case
        folder = _problem(root)
        if case == "data.json":
            (folder / "data.json").write_text(str(content))
        elif case == "answer":
            record = json.loads((folder / "data.json").read_text())
            (folder / "data.json").write_text(json.dumps({**record, "answer": "Z"}))
        elif case == "img_diagram.png":
            (folder / "img_diagram.png").write_bytes(content)  # type: ignore[arg-type]
        else:
            (folder / "img_diagram.png").unlink()
        line = _refused(["prepare-data", "--input", str(root), "--out", str(out)], capsys)
        assert message in line and str(folder) in line, line
    assert not out.exists()  # nothing half-written by any failure


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("choices", None, "expected 4 choices and an answer letter A-D, got None"),  # was a TypeError traceback
        ("choices", ["30", None, "60", "80"], "got ['30', None, '60', '80']"),  # was the choice "None"
        ("problem_text", None, "problem_text is empty or not text (None)"),  # was the prompt "<image>None"
    ],
)
def test_null_fields_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object, message: str
) -> None:
    folder = _problem(tmp_path / "set")
    record = json.loads((folder / "data.json").read_text())
    (folder / "data.json").write_text(json.dumps({**record, field: value}))
    out = tmp_path / "rows.jsonl"
    line = _refused(["prepare-data", "--input", str(tmp_path / "set"), "--out", str(out)], capsys)
    assert message in line and str(folder / "data.json") in line, line
    assert not out.exists()
