"""Adaptive entropy control's defaults are Skywork-OR1's released scripts' (or1_scripts/train/*.sh: ENTROPY_COEFF=0,
TGT_ENTROPY=0.2, MAX_ENT_COEF=0.005, DELTA_ENT_COEF=0.0001), and so are the values the reasoning app's
skywork_or1.yaml writes out (it had the early 7B script's step 0.001 and ceiling 0.5; issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlloom.core_rl.config.loading import load_config


def test_section_defaults_are_the_released_scripts() -> None:
    entropy = load_config(None, ["model.path=/m", "algorithm.entropy.adaptive={}"]).algorithm.entropy
    assert entropy.coef == 0.0
    assert entropy.adaptive is not None
    assert (entropy.adaptive.target, entropy.adaptive.step, entropy.adaptive.max_coef) == (0.2, 1e-4, 0.005)


def test_reasoning_apps_skywork_config_follows_the_final_scripts() -> None:
    reasoning = pytest.importorskip("rlloom_apps.reasoning")
    path = Path(reasoning.__file__).parent / "configs" / "skywork_or1.yaml"
    entropy = load_config(path, ["model.path=/m"]).algorithm.entropy
    assert entropy.adaptive is not None
    assert (entropy.coef, entropy.adaptive.target, entropy.adaptive.step, entropy.adaptive.max_coef) == (
        0.0,
        0.2,
        1e-4,
        0.005,
    )
