"""Math answer checking: extract the final answer, decide equivalence (fast rules, then bounded SymPy), score.

from rlloom.rewards.math import score
score("... so the answer is $\\boxed{\\frac{1}{2}}$.", "0.5")  # 1.0
"""

from rlloom.rewards.math.equivalence import DEFAULT_TIMEOUT, Verdict, compare, is_equivalent
from rlloom.rewards.math.extract import DEFAULT_MODES, ExtractionMode, extract_answer
from rlloom.rewards.math.normalize import normalize
from rlloom.rewards.math.scorer import boxed_math_scorer, math_scorer, score, score_detailed

__all__ = [
    "DEFAULT_MODES",
    "DEFAULT_TIMEOUT",
    "ExtractionMode",
    "Verdict",
    "boxed_math_scorer",
    "compare",
    "extract_answer",
    "is_equivalent",
    "math_scorer",
    "normalize",
    "score",
    "score_detailed",
]
