"""Registry routing, lazy loading and custom scorer specs (veRL custom_reward_function style)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlloom.rewards.registry import (
    DEFAULT_SCORERS,
    ScorerLoadError,
    canonical_source,
    get_scorer,
    load_function,
    register,
    scorer_spec,
    to_result,
)
from rlloom.rewards.types import ScoreResult

REQUIRED = ["gsm8k", "math", "math500", "aime", "amc", "minerva", "olympiadbench", "nq", "triviaqa", "popqa",
            "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "humaneval", "mbpp", "geometry3k", "io", "apps",
            "codecontests"]  # fmt: skip


def test_every_issue_data_source_is_routed() -> None:
    for name in REQUIRED:
        assert name in DEFAULT_SCORERS, name
    assert DEFAULT_SCORERS["gsm8k"] == "rlloom.rewards.math:math_scorer"
    assert DEFAULT_SCORERS["humaneval"] == "rlloom.rewards.code:humaneval_scorer"
    assert DEFAULT_SCORERS["apps"] == "rlloom.rewards.code:io_scorer"
    assert DEFAULT_SCORERS["nq"] == "rlloom.rewards.qa:qa_em_scorer"


def test_default_specs_resolve_to_the_named_callables() -> None:
    for spec in sorted(set(DEFAULT_SCORERS.values())):
        _module, _, attr = spec.partition(":")
        assert callable(load_function(spec)), spec
        assert load_function(spec).__name__ == attr


@pytest.mark.parametrize(
    ("name", "key"),
    [("GSM8K", "gsm8k"), ("openai/gsm8k", "gsm8k"), ("lighteval/MATH", "math"), ("searchR1_nq", "nq"),
     ("HuggingFaceH4/MATH500", "math500"), ("unknown_set", None),
     # the data_source strings veRL's default_compute_score routes (verl/utils/reward_score/__init__.py)
     ("HuggingFaceH4/MATH-500", "math500"), ("DigitalLearningGmbH/MATH-lighteval", "math"),
     ("numina_cn_k12", "math"), ("numina_olympiads", "math"), ("codeforces", "io"),
     ("openai/openai_humaneval", "humaneval")],
)  # fmt: skip
def test_canonical_source(name: str, key: str | None) -> None:
    assert canonical_source(name) == key


def test_registry_import_is_lazy() -> None:
    code = (
        "import sys, rlloom.rewards as rr, rlloom.rewards.registry as r; r.get_scorer('nq'); "
        "rr.f1, rr.Rubric, rr.score_batch, rr.LLMJudge, rr.r1_format; "
        "print(any(m in sys.modules for m in ('sympy', 'math_verify', 'rlloom.rewards.math', 'rlloom.rewards.code')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_custom_scorer_by_file_and_module(tmp_path: Path) -> None:
    path = tmp_path / "reward.py"
    path.write_text("CONSTANT = 3\n\ndef my_reward(response, ground_truth, *, extra_info=None):\n    return 0.75\n")
    assert load_function(f"{path}:my_reward")("r", "g") == 0.75
    assert load_function("rlloom.rewards.qa:f1")("x b", "b") == pytest.approx(2 / 3)
    with pytest.raises(ScorerLoadError, match="does not exist"):
        load_function(f"{tmp_path}/missing.py:my_reward")
    with pytest.raises(ScorerLoadError, match="has no function 'nope'.*my_reward"):
        load_function(f"{path}:nope")
    with pytest.raises(ScorerLoadError, match="is a int, not a callable"):
        load_function(f"{path}:CONSTANT")
    with pytest.raises(ScorerLoadError, match="cannot import module 'no_such_pkg_xyz'"):
        load_function("no_such_pkg_xyz:fn")
    with pytest.raises(ScorerLoadError, match="neither a known data_source"):
        get_scorer("no_such_dataset")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ScorerLoadError, match="boom at import"):
        load_function(f"{broken}:f")


def test_register_validates_and_routes(tmp_path: Path) -> None:
    path = tmp_path / "mine.py"
    path.write_text("def r(response, ground_truth, *, extra_info=None):\n    return 1.0\n")
    with pytest.raises(ScorerLoadError):
        register("my_set", f"{path}:missing")
    register("my_set", f"{path}:r")
    try:
        assert scorer_spec("my_set") == f"{path}:r" and get_scorer("my_set")("x", None) == 1.0
    finally:
        DEFAULT_SCORERS.pop("my_set")


def test_to_result_shapes() -> None:
    assert to_result(True).score == 1.0 and to_result(0).score == 0.0
    verl = to_result({"score": -1, "acc": False, "pred": "42"})
    assert verl == ScoreResult(score=-1.0, components={"acc": 0.0}, details={"pred": "42"})
    with pytest.raises(TypeError, match="must return a float"):
        to_result("1.0")


@pytest.mark.parametrize(
    "name", ["aime", "aime24", "aime25", "aime2024", "AIME2025", "HuggingFaceH4/aime_2024", "opencompass/AIME2025"]
)
def test_aime_names_resolve_to_the_math_checker(name: str) -> None:
    # veRL's default_compute_score sends every data_source starting with "aime" to its math scorer
    assert canonical_source(name) == "aime"
    assert scorer_spec(name) == "rlloom.rewards.math:math_scorer"
    assert to_result(get_scorer(name)("so the answer is \\boxed{70}.", "70")).score == 1.0


def test_aime_rows_score_in_a_batch_without_errors() -> None:
    from rlloom.rewards.batch import score_batch

    items = [
        {"response": "\\boxed{70}", "ground_truth": "70", "data_source": source}
        for source in ("aime24", "aime25", "aime2024", "aime2025", "math_dapo")
    ]
    results = score_batch(items, workers=0)
    assert [(r.score, r.error) for r in results] == [(1.0, None)] * len(items)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("i WdrS9X", 0.0),  # a random reply that happens to hold the digit 9
        ("The angle is 9 degrees, so the answer is 9.", 0.0),  # right number, not boxed
        ("<think>...</think> \\boxed{9}", 1.0),
        ("\\boxed{A}", 1.0),  # the letter of the right choice
        ("\\boxed{8}", 0.0),
    ],
)
def test_geometry3k_reads_only_the_boxed_answer(response: str, expected: float) -> None:
    scorer = get_scorer("geometry3k")
    result = to_result(scorer(response, ["9", "A"], extra_info={"modes": ["final_number"]}))  # a row cannot widen it
    assert result.score == expected


def test_a_scorer_file_gets_the_same_module_name_in_every_process(tmp_path: Path) -> None:
    """The module name of a scorer file came from Python's hash(), salted per process, so a scoring worker named
    the same file differently from its parent; it is now a digest of the path, as rlloom-core-rl's user code."""
    import subprocess
    import sys

    scorer = tmp_path / "my_scorer.py"
    scorer.write_text("def score(response, ground_truth, extra_info=None):\n    return 1.0\n")
    probe = (
        "import sys; from rlloom.rewards.registry import load_function; "
        f"print(load_function({str(scorer) + ':score'!r}).__module__)"
    )
    names = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
             for _ in range(2)}  # fmt: skip
    assert len(names) == 1 and names.pop().startswith("rlloom_user_my_scorer_")
