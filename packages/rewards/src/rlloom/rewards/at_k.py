"""Metrics over k samples per problem: avg@k, pass@k and maj@k, as reasoning papers report them.

- avg@k: the mean score of k samples (Skywork-OR1's Avg@32, DeepSeek-R1's pass@1 over k samples).
- pass@k: the chance that at least one of k samples drawn from the n made is correct, by the unbiased
  estimator of Chen et al. 2021 (HumanEval paper, eq. 1): 1 - C(n-c, k) / C(n, k). Drawing the first k samples
  instead would be an estimate with far more variance.
- maj@k: the correctness of the most common answer among k samples (self-consistency, Wang et al. 2022), as
  its expectation over the k-subsets of the n samples: exact when there are few subsets, else a seeded average
  over random ones (veRL's validation metrics bootstrap the same way). Samples with no answer abstain; a tie
  between answers counts the average correctness of the tied answers (a uniform random tie-break, in
  expectation), so the result never depends on sample order.

Answers are grouped for voting by `group_answers` with any equivalence test (the math checker's for math, so
"1/2" and "0.5" vote together). Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

EXACT_SUBSETS = 4096
"""maj@k enumerates every k-subset when there are at most this many; otherwise it averages `draws` random ones."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021)."""
    if not 0 <= c <= n:
        raise ValueError(f"correct samples c={c} must lie in 0..n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in 1..n={n} (draw at least k samples per problem)")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k/i): the numerically stable product form of 1 - C(n-c, k) / C(n, k)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def avg_at_k(scores: Sequence[float]) -> float:
    """Mean score of the samples (avg@k with k = len(scores))."""
    if not scores:
        raise ValueError("avg@k needs at least one sample")
    return sum(scores) / len(scores)


def group_answers(answers: Sequence[str | None], same: Callable[[str, str], bool] | None = None) -> list[int | None]:
    """A vote label per answer: equal labels for answers `same` calls equivalent; None stays None (abstains).

    Identical strings always share a label; `same` (e.g. the math checker) is only asked about distinct strings,
    and each new string is compared with one representative per label (equivalence is taken as transitive).
    """
    labels: list[int | None] = []
    by_text: dict[str, int] = {}
    representatives: list[str] = []
    for answer in answers:
        if answer is None:
            labels.append(None)
            continue
        label = by_text.get(answer)
        if label is None and same is not None:
            label = next((i for i, rep in enumerate(representatives) if same(answer, rep)), None)
        if label is None:
            label = len(representatives)
            representatives.append(answer)
        by_text[answer] = label
        labels.append(label)
    return labels


def gold_votes_together(labels: Sequence[int | None], correct: Sequence[bool]) -> list[int | None]:
    """`labels` with every answer the scorer accepts in one group: answers the scorer accepts are the same answer.
    A gold given as aliases (Geometry3K's value and its choice letter, ['80', 'D']; a QA answer's alternative
    names) would otherwise split the right answer's votes, and a wrong answer could out-vote it. Only the accepted
    samples move: where the equivalence test grouped a rejected answer with an accepted one, the rejected samples
    keep a group of their own rather than voting for the gold."""
    if len(labels) != len(correct):
        raise ValueError(f"labels ({len(labels)}) and correct ({len(correct)}) must have one entry per sample")
    right = [label for label, ok in zip(labels, correct, strict=True) if ok and label is not None]
    if not right:
        return list(labels)
    fresh = max(label for label in labels if label is not None) + 1
    apart = {label: fresh + i for i, label in enumerate(sorted(set(right)))}  # the rejected of a gold group
    return [
        label if label is None else right[0] if ok else apart.get(label, label)
        for label, ok in zip(labels, correct, strict=True)
    ]


def majority_correct(labels: Sequence[int | None], correct: Sequence[bool]) -> float:
    """Correctness of the majority answer among these samples; ties average the tied answers' correctness."""
    counts: dict[int, int] = {}
    right: dict[int, int] = {}
    for label, ok in zip(labels, correct, strict=True):
        if label is None:
            continue
        counts[label] = counts.get(label, 0) + 1
        right[label] = right.get(label, 0) + int(ok)
    if not counts:
        return 0.0
    top = max(counts.values())
    winners = [label for label, count in counts.items() if count == top]
    # a label's correctness is its samples' share of correct ones (1 or 0 when the grouping agrees with the scorer)
    return sum(right[label] / counts[label] for label in winners) / len(winners)


def maj_at_k(
    labels: Sequence[int | None],
    correct: Sequence[bool],
    k: int,
    *,
    draws: int = 1000,
    seed: int = 0,
    exact_limit: int = EXACT_SUBSETS,
) -> float:
    """Expected majority-vote correctness of k samples drawn from these n (see the module docstring)."""
    n = len(labels)
    if len(correct) != n:
        raise ValueError(f"labels ({n}) and correct ({len(correct)}) must have one entry per sample")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in 1..n={n} (draw at least k samples per problem)")
    if math.comb(n, k) <= exact_limit:
        subsets: Iterable[Sequence[int]] = itertools.combinations(range(n), k)
        total = math.comb(n, k)
    else:
        rng = random.Random(seed)
        subsets = (rng.sample(range(n), k) for _ in range(draws))
        total = draws
    score = 0.0
    for subset in subsets:
        score += majority_correct([labels[i] for i in subset], [correct[i] for i in subset])
    return score / total


@dataclass(slots=True)
class ProblemSamples:
    """One problem's n samples: each one's score, whether it is correct, and its vote label (None: no answer)."""

    scores: list[float]
    correct: list[bool]
    labels: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = [None] * len(self.scores)
        if not len(self.scores) == len(self.correct) == len(self.labels):
            raise ValueError("scores, correct and labels need one entry per sample")
        if not self.scores:
            raise ValueError("a problem needs at least one sample")


def summarize(
    problems: Sequence[ProblemSamples], ks: Sequence[int], *, majority: bool = True, seed: int = 0
) -> dict[str, float]:
    """Dataset-level figures averaged over problems: `avg@n`, then `pass@k` and (with `majority`) `maj@k` per k.

    `majority=False` leaves maj@k out where answers cannot be voted on (programs, free-form text).
    Every problem must have the same n (a metric averaged over unequal draws means nothing); ks above n are
    refused by name rather than skipped.
    """
    if not problems:
        raise ValueError("no problems to summarize")
    sizes = {len(p.scores) for p in problems}
    if len(sizes) != 1:
        raise ValueError(f"every problem needs the same number of samples; got sizes {sorted(sizes)}")
    n = sizes.pop()
    too_big = [k for k in ks if k > n]
    if too_big:
        raise ValueError(f"k={too_big} exceed the {n} samples per problem; lower k or sample more (n >= max k)")
    out = {f"avg@{n}": _mean(avg_at_k(p.scores) for p in problems)}
    for k in ks:
        out[f"pass@{k}"] = _mean(pass_at_k(n, sum(p.correct), k) for p in problems)
    for k in ks if majority else ():
        out[f"maj@{k}"] = _mean(maj_at_k(p.labels, p.correct, k, seed=seed) for p in problems)
    return out


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items)
