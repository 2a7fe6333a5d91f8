"""`search-agent --help` builds every subcommand's parser without torch or transformers (issue 29: it took 12 s)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "numpy", "ray", "vllm", "wandb", "matplotlib")

PROBE = """
import contextlib, io, json, sys
from rlloom_apps.search_agent.cli import main
for argv in (["--help"], *([c, "--help"] for c in sys.argv[1:])):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""


def test_help_of_every_subcommand_imports_nothing_heavy() -> None:
    from rlloom_apps.search_agent.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert commands, "the parser has no subcommands"
    done = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), *commands], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(done.stdout.splitlines()[-1]) == []
