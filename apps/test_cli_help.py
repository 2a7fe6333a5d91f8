"""Every app's `--help` builds every subcommand's parser without torch or transformers (issue 29: `reasoning
--help` took 30 s, `search-agent --help` 12 s, because building the parser imported the trainer)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "numpy", "ray", "vllm", "wandb", "matplotlib")

PROBE = """
import contextlib, importlib, io, json, sys
main = importlib.import_module(sys.argv[1]).main
for argv in (["--help"], *([c, "--help"] for c in sys.argv[2:])):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""


@pytest.mark.parametrize("app", ["reasoning", "search_agent", "vlm_geo3k"])
def test_help_of_every_subcommand_imports_nothing_heavy(app: str) -> None:
    cli = f"rlloom_apps.{app}.cli"
    parser = importlib.import_module(cli).build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands, "the parser has no subcommands"
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), cli, *commands],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(done.stdout.splitlines()[-1]) == []
