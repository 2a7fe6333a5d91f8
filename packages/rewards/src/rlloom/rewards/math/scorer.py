"""The math reward: extract the final answer, compare it with the gold answer(s), return 1.0 or 0.0.

`math_scorer` follows the package's `Scorer` protocol and reports what it read and why it decided, with an
extraction failure, an unusable gold answer and a timeout told apart in `error`/`details` rather than all
silently becoming 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rlloom.rewards.math.equivalence import DEFAULT_TIMEOUT, compare
from rlloom.rewards.math.extract import DEFAULT_MODES, ExtractionMode, extract_answer, extract_choice
from rlloom.rewards.math.normalize import choice_letter, stated_choice
from rlloom.rewards.math.numeric import MIN_SIGNIFICANT, check_precision
from rlloom.rewards.math.spans import joined_environments, prose_words
from rlloom.rewards.scorer_inputs import not_text_error, plain, response_text
from rlloom.rewards.types import ScoreResult


def _golds(gold: str | Sequence[str]) -> list[str]:
    gold = plain(gold)  # a numpy array of accepted forms (parquet rows) becomes a list
    if isinstance(gold, str):
        return [gold]
    if isinstance(gold, Sequence) and all(isinstance(g, str) for g in gold):
        return list(gold)
    raise TypeError(f"gold must be a str or a list of str, got {type(gold).__name__}; pass the answer text")


def _extract_gold(gold: str) -> str:
    """A gold written as a full solution ("... \\boxed{5}", "#### 5", "... The final answer is $28\\%$. ...")
    is reduced to its answer; `$1$ and $2$` becomes the list `1, 2`."""
    if "\\boxed" in gold or "\\fbox" in gold or "####" in gold:
        return extract_answer(gold, modes=("boxed", "gsm8k")) or gold
    if prose_words(gold) >= 3:
        return extract_answer(gold) or gold
    return joined_environments(gold) or gold


def _needs_choice_statement(extracted: str | None, golds: list[str], text: str, modes: Sequence[str]) -> bool:
    """A letter gold, an extracted answer that states no letter, no box or answer tag, and unmarked answers
    allowed: "The correct option is (C), since x = 12." answers C, not 12 (see `extract_choice`)."""
    if "answer_is" not in modes or not any(choice_letter(g) for g in golds):
        return False
    if extracted is not None and stated_choice(extracted) is not None:
        return False
    return extract_answer(text, modes=("boxed", "answer_tag")) is None


def score_detailed(
    response: str,
    gold: str | Sequence[str],
    *,
    modes: Sequence[ExtractionMode] = DEFAULT_MODES,
    timeout: float = DEFAULT_TIMEOUT,
    precision: int = MIN_SIGNIFICANT,
) -> ScoreResult:
    """1.0 if the answer extracted from `response` equals any gold form, else 0.0, with the reason.

    `precision`: the significant digits a rounded decimal must show to match an exact gold (default 3, so `0.33`
    is not 1/3 but `0.333` is; one more against pi, a radical or e). Keep the default for rewards; a lower value
    is for comparing with graders that state their own tolerance (Math-Verify's tests pass `precision=2`).
    """
    check_precision(precision)
    golds = [_extract_gold(g) for g in _golds(gold)]
    if not any(g.strip() for g in golds):
        return ScoreResult(score=0.0, error="gold answer is empty; fix the dataset's ground_truth")
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    extracted = extract_answer(text, modes=modes)
    if _needs_choice_statement(extracted, golds, text, modes):
        extracted = extract_choice(text) or extracted
    if extracted is None:
        return ScoreResult(score=0.0, details={"reason": "no answer found in the response"})
    reasons = []
    for g in golds:
        verdict = compare(extracted, g, timeout=timeout, precision=precision)
        reasons.append(verdict.reason)
        if verdict.equal:
            return ScoreResult(score=1.0, extracted=extracted, details={"reason": verdict.reason, "gold": g})
    timed_out = any(r.startswith("timeout") for r in reasons)
    return ScoreResult(
        score=0.0,
        extracted=extracted,
        error="symbolic check timed out" if timed_out else None,
        details={"reason": "; ".join(reasons)},
    )


def score(
    response: str,
    gold: str | Sequence[str],
    *,
    modes: Sequence[ExtractionMode] = DEFAULT_MODES,
    timeout: float = DEFAULT_TIMEOUT,
    precision: int = MIN_SIGNIFICANT,
) -> float:
    """1.0 if the final answer in `response` equals `gold` (a string or a list of accepted forms), else 0.0.
    `precision`: see `score_detailed`."""
    return score_detailed(response, gold, modes=modes, timeout=timeout, precision=precision).score


def _with_choice_text(ground_truth: Any, choices: Any) -> Any:
    """A letter gold with `extra_info["choices"]` (geometry3k) also accepts the chosen option's text ("D" or "80")."""
    if not (isinstance(ground_truth, str) and isinstance(choices, list | tuple)):
        return ground_truth
    letter = ground_truth.strip().strip("()")
    index = ord(letter) - ord("A") if len(letter) == 1 and "A" <= letter <= "J" else -1
    if 0 <= index < len(choices) and isinstance(choices[index], (str, int, float)):
        return [ground_truth, str(choices[index])]
    return ground_truth


def math_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """`Scorer`-protocol entry point (registry: gsm8k, math, math500, aime, amc, minerva, olympiadbench, ...).

    `extra_info` may set "timeout" (seconds), "modes" (extraction modes), "precision" (significant digits a
    rounded decimal must show, default 3: see `score_detailed`) and "choices" (option texts, so a letter gold
    such as geometry3k's "D" also accepts the text of option D); other keys are ignored.
    """
    info = dict(extra_info or {})
    ground_truth = plain(ground_truth)  # numpy arrays and scalars (parquet rows) become lists and Python numbers
    if isinstance(ground_truth, int | float) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    if not isinstance(ground_truth, str | list):
        kind = type(ground_truth).__name__
        return ScoreResult(
            score=0.0, error=f"ground_truth must be a str or a list of str (the accepted answers), got {kind}"
        )
    ground_truth = _with_choice_text(ground_truth, plain(info.get("choices")))
    modes = tuple(info.get("modes", DEFAULT_MODES))
    timeout = float(info.get("timeout", DEFAULT_TIMEOUT))
    try:
        return score_detailed(
            response,
            [str(g) for g in ground_truth] if not isinstance(ground_truth, str) else ground_truth,
            modes=modes,
            timeout=timeout,
            precision=info.get("precision", MIN_SIGNIFICANT),
        )
    except (TypeError, ValueError) as exc:
        return ScoreResult(score=0.0, error=str(exc))


def boxed_math_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """`math_scorer` reading only the last `\\boxed{}` (registry: geometry3k, as veRL's geo3k and EasyR1's math).

    A bare number elsewhere in the text is not an answer: "i WdrS9X" must not count as answering 9. A row's
    `extra_info["modes"]` cannot widen this.
    """
    return math_scorer(response, ground_truth, extra_info={**(extra_info or {}), "modes": ("boxed",)})
