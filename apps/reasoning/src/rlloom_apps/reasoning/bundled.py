"""The bundled algorithm configs, named in a module that imports nothing heavy: `reasoning --help` lists them
without loading the trainer (and torch)."""

from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).parent / "configs"
ALGORITHMS = ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "ppo", "skywork_or1")
