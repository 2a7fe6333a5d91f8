"""Refresh .ci/test_durations.json (seconds per test file, read by conftest.py to hand out long files first) from
the JUnit reports of a CI run: `python3 .ci/test_durations.py [.nox/junit]`. A file missing from it (a new one) is
guessed from its number of tests."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".ci" / "test_durations.json"


def file_seconds(reports: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for report in sorted(reports.glob("*.xml")):
        for case in ET.parse(report).getroot().iter("testcase"):
            # classname is the file's path from the repository root, dotted ("packages.core-rl.tests.test_x")
            parts = case.get("classname", "").split(".")
            path = ROOT.joinpath(*parts[:-1], parts[-1] + ".py")
            while not path.is_file() and len(parts) > 1:  # a test class: drop its name
                parts = parts[:-1]
                path = ROOT.joinpath(*parts[:-1], parts[-1] + ".py")
            if path.is_file():
                seconds[path.relative_to(ROOT).as_posix()] += float(case.get("time", 0))
    return {k: round(v, 1) for k, v in sorted(seconds.items())}


if __name__ == "__main__":
    reports = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".nox" / "junit"
    table = file_seconds(reports)
    if not table:
        sys.exit(f"no timed test files in {reports}/*.xml: run CI (bash .ci/run) first")
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(table)} files, {sum(table.values()):.0f} s, written to {OUT}")
