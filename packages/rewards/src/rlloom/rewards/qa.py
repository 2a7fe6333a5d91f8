"""Open-domain QA rewards: SQuAD-normalised exact match, token F1 and substring match, max over gold aliases.

These are the metrics Search-R1 and its successors train and report on (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki,
MuSiQue, Bamboogle). Normalisation follows SQuAD v1.1's `evaluate-v1.1.py`: lowercase, delete punctuation,
drop the articles a/an/the, collapse whitespace. The scorers read the LAST `<answer>...</answer>` of the
response (Search-R1's convention, without its ">= 2 matches" prompt hack). A response with no `<answer>` tag
scores 0 with the reason recorded: falling back to the whole text would reward answers hidden in reasoning or
a list of candidates (a known hack with substring rewards), so the fallback is opt-in via `extra_info`.
Also opt-in: veRL's penalty for answer-tag spam (`search_r1_like_qa_em.py`: a correct answer with more than 10
`<answer>` or `</answer>` tags scores a quarter), set with `extra_info={"max_answer_tags": 10}`.

Two departures from the official scripts close reward hacks (issue 39):
- A gold that normalises to nothing ("A+", ")", the band "The The") would make every answer that also normalises
  to nothing, the empty answer included, an exact match. Against such a gold the answer is compared as stripped
  raw text instead (`raw_form`: whitespace collapsed, case folded, punctuation and articles kept) by EM, F1 and
  cover-EM: "A+" matches "a+", not "A" and not "".
- Cover-EM refuses an answer that lists several candidates (`listed_candidates`): "Paris or London" contains
  "Paris", but it is a hedge, not an answer.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rlloom.rewards.scorer_inputs import not_text_error, plain, response_text
from rlloom.rewards.types import ScoreResult

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# veRL's values: more than 10 opening or closing tags divides the reward by 4.
VERL_MAX_ANSWER_TAGS = 10
VERL_TAG_SPAM_FACTOR = 0.25


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lowercase, drop punctuation, drop a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def raw_form(text: str) -> str:
    """Stripped raw text, whitespace collapsed and case folded: what an answer is compared as against a gold that
    SQuAD normalisation empties ("A+" -> "a+", "The The" -> "the the")."""
    return " ".join(text.split()).casefold()


def _forms(pred: str, gold: str) -> tuple[str, str]:
    """(pred, gold) in the form they are compared in: SQuAD-normalised, or raw (`raw_form`) when the gold
    normalises to nothing."""
    g = normalize_answer(gold)
    if g:
        return normalize_answer(pred), g
    return raw_form(pred), raw_form(gold)


def _gold_list(golds: str | Sequence[str]) -> list[str]:
    golds = plain(golds)  # a numpy array of aliases (parquet rows) becomes a list
    if isinstance(golds, str):
        return [golds]
    if isinstance(golds, Sequence) and all(isinstance(g, str) for g in golds):
        if not golds:
            raise ValueError("golds is an empty list; give at least one accepted answer")
        return list(golds)
    raise TypeError(f"golds must be a str or a list (or array) of str, got {type(golds).__name__}")


def exact_match(pred: str, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold alias, else 0.0 (raw text against a gold that
    normalises to nothing: "" is not "A+")."""
    return float(any(p == g for p, g in (_forms(pred, gold) for gold in _gold_list(golds))))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # SQuAD v2 convention: both empty (no-answer) agree; one empty scores 0.
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(pred: str, golds: str | Sequence[str]) -> float:
    """SQuAD token-level F1 (bag-of-tokens overlap after normalisation), max over gold aliases."""
    return max(_token_f1(p.split(), g.split()) for p, g in (_forms(pred, gold) for gold in _gold_list(golds)))


def _covers(pred: str, gold: str, word_boundary: bool) -> bool:
    """Whether gold occurs in pred (both in the form `_forms` picks); as whole tokens with `word_boundary`."""
    p, g = _forms(pred, gold)
    if not g:
        return False
    if not word_boundary:
        return g in p
    if normalize_answer(gold):
        return f" {g} " in f" {p} "
    return re.search(r"(?<![^\W_])" + re.escape(g) + r"(?![^\W_])", p) is not None


# Words that only say the answer is one of several: "either Paris or Lyon".
_ALTERNATIVE_RE = re.compile(r"[;|]|\band/or\b|\bor\b|(?<!\d)/|/(?!\d)", re.IGNORECASE)
# A comma, except a thousands separator ("1,000").
_COMMA_RE = re.compile(r",(?!(?<=\d,)\d{3}(?!\d))")
_NUMBER_ITEM_RE = re.compile(r"[-+]?\$?\d[\d.]*%?")
_FILLER = frozenset({"either", "maybe", "perhaps", "possibly", "probably"})


def _cut(pairs: list[tuple[str, str]], pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """Each (text, masked) pair split where `pattern` matches in masked (the text with the golds blanked out)."""
    out = []
    for text, masked in pairs:
        start = 0
        for m in pattern.finditer(masked):
            out.append((text[start : m.start()], masked[start : m.start()]))
            start = m.end()
        out.append((text[start:], masked[start:]))
    return out


def listed_candidates(pred: str, golds: str | Sequence[str]) -> list[str] | None:
    """The items of `pred` when it lists several candidate answers, else None.

    The rule: with every gold alias's own text set aside (so "Washington, D.C." or "To be or not to be" are not
    split), the answer lists candidates when it has two or more non-empty items separated by
      - an alternative marker: ";", "|", the word "or" (also "and/or", "either ... or ..."), or a slash between
        words ("Paris/London"; not between digits, "1/2" and "1990/91" stay whole), in which case commas
        separate items too ("Paris, London or Rome"); or
      - commas alone, with three or more items ("Paris, London, Rome"), or two items that are both plain numbers
        ("1990, 1991"; a thousands separator "1,000" is no comma here).
    Items that are only a hedge word ("either", "maybe") do not count. Two items joined by one comma read as a
    phrase ("Paris, France", "June 5, 1990", "Springfield, Illinois"), and "and" never separates ("Simon and
    Garfunkel"), so an honest answer that contains the gold in a natural phrase ("the city of Paris", "in 1990",
    "Paris, France") is not a list. The known gap: two names joined by one comma ("Paris, Lyon") are read as a
    phrase.
    """
    masked = pred
    for gold in _gold_list(golds):
        needle = gold.strip()
        if needle:
            masked = re.sub(re.escape(needle), lambda m: "\x00" * len(m.group(0)), masked, flags=re.IGNORECASE)
    whole = [(pred, masked)]
    marked = _ALTERNATIVE_RE.search(masked) is not None
    pieces = _cut(_cut(whole, _ALTERNATIVE_RE), _COMMA_RE) if marked else _cut(whole, _COMMA_RE)
    # An item counts when it holds a gold or words of its own, and is not just a hedge word ("either").
    items = [
        text.strip()
        for text, blanked in pieces
        if "\x00" in blanked or (normalize_answer(text) and normalize_answer(text) not in _FILLER)
    ]
    if marked:
        return items if len(items) >= 2 else None
    if len(items) >= 3 or (len(items) == 2 and all(_NUMBER_ITEM_RE.fullmatch(i) for i in items)):
        return items
    return None


def hedged(pred: str, golds: str | Sequence[str], *, word_boundary: bool = True) -> list[str] | None:
    """The items of `pred` when it lists several candidates and one of them is not a gold alias (cover-EM then
    refuses it); None otherwise. A list whose every item names a gold alias ("USA or United States") is one
    answer written twice and is not refused."""
    items = listed_candidates(pred, golds)
    if items is None:
        return None
    golds = _gold_list(golds)
    if all(any(_covers(item, g, word_boundary) for g in golds) for item in items):
        return None
    return items


def substring_match(
    pred: str, golds: str | Sequence[str], *, word_boundary: bool = True, refuse_lists: bool = True
) -> float:
    """1.0 if any normalised gold alias occurs inside the normalised prediction ("cover EM" / subEM).

    With `word_boundary` (default) the alias must match whole tokens, so gold "1" does not match "1990";
    `word_boundary=False` reproduces Search-R1's raw `in` test. With `refuse_lists` (default) an answer that
    lists several candidates, one of which is not a gold alias, scores 0 ("Paris or London"; see
    `listed_candidates` for the rule); `word_boundary=False, refuse_lists=False` is Search-R1's subEM exactly,
    except against a gold that normalises to nothing, which is compared as raw text (`raw_form`).
    """
    gold_list = _gold_list(golds)
    if not any(_covers(pred, g, word_boundary) for g in gold_list):
        return 0.0
    if refuse_lists and hedged(pred, gold_list, word_boundary=word_boundary) is not None:
        return 0.0
    return 1.0


def extract_tagged_answer(response: str) -> str | None:
    """The text of the last `<answer>...</answer>` in `response`, stripped; None if there is none."""
    matches = _ANSWER_TAG.findall(response)
    return matches[-1].strip() if matches else None


def qa_golds(ground_truth: Any) -> list[str]:
    """Accept the shapes datasets use: a string, a list (tuple, numpy array) of aliases, or Search-R1's
    `{"target": [...]}`; numbers become their text."""
    ground_truth = plain(ground_truth)
    if isinstance(ground_truth, Mapping):
        if "target" not in ground_truth:
            raise ValueError(f"ground_truth dict needs a 'target' key (Search-R1 shape), got keys {list(ground_truth)}")
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, int | float) and not isinstance(ground_truth, bool):
        ground_truth = str(ground_truth)
    if isinstance(ground_truth, list):
        ground_truth = [str(g) for g in ground_truth]
    if not isinstance(ground_truth, str | list):
        raise TypeError(
            f"ground_truth must be a str, a list of str or {{'target': [...]}}, got {type(ground_truth).__name__}"
        )
    return _gold_list(ground_truth)


def _tag_spam_rule(extra_info: Mapping[str, Any]) -> tuple[int, float] | None:
    """(max tags, factor) when `extra_info` asks for the answer-tag spam penalty, else None; bad values raise."""
    limit = extra_info.get("max_answer_tags")
    if limit is None:
        if "tag_spam_factor" in extra_info:
            raise ValueError("extra_info['tag_spam_factor'] needs extra_info['max_answer_tags'] (veRL uses 10)")
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"extra_info['max_answer_tags'] must be a positive int (veRL uses 10), got {limit!r}")
    factor = extra_info.get("tag_spam_factor", VERL_TAG_SPAM_FACTOR)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0.0 <= factor <= 1.0:
        raise ValueError(f"extra_info['tag_spam_factor'] must be a number in [0, 1] (veRL uses 0.25), got {factor!r}")
    return limit, float(factor)


def answer_tag_counts(response: str) -> tuple[int, int]:
    """How many `<answer>` and `</answer>` tags `response` holds (veRL counts both, as plain substrings)."""
    return response.count("<answer>"), response.count("</answer>")


def _qa_score(metric: str, response: Any, ground_truth: Any, extra_info: Mapping[str, Any] | None) -> ScoreResult:
    try:
        spam_rule = _tag_spam_rule(extra_info or {})
    except ValueError as exc:
        return ScoreResult(score=0.0, error=str(exc))
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    try:
        golds = qa_golds(ground_truth)
    except (TypeError, ValueError) as exc:
        return ScoreResult(score=0.0, error=f"bad ground_truth: {exc}")
    answer = extract_tagged_answer(text)
    if answer is None:
        if not (extra_info or {}).get("fallback_to_text", False):
            return ScoreResult(score=0.0, details={"reason": "no <answer>...</answer> in the response"})
        answer = text.strip()
    components = {"em": exact_match(answer, golds), "f1": f1(answer, golds), "sub_em": substring_match(answer, golds)}
    value, details = components[metric], {}
    hedge = hedged(answer, golds) if components["sub_em"] == 0.0 else None
    if hedge is not None:
        details = {"reason": f"cover-EM refused: the answer lists {len(hedge)} candidates {hedge}"}
    if spam_rule is not None:
        limit, factor = spam_rule
        opening, closing = answer_tag_counts(text)
        if max(opening, closing) > limit and value > 0:
            value *= factor
            details = {"reason": f"answer-tag spam: {opening} <answer> / {closing} </answer> tags (limit {limit})"}
    return ScoreResult(score=value, components=components, extracted=answer, details=details)


def qa_em_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """Exact match of the last `<answer>` against the gold aliases; F1 and subEM reported as components.

    `extra_info={"fallback_to_text": True}` scores the whole response when it has no `<answer>` tag.
    `extra_info={"max_answer_tags": 10}` multiplies the score by `tag_spam_factor` (default 0.25) when the response
    has more `<answer>` or `</answer>` tags than that (veRL's Search-R1 reward); the components stay unpenalised.
    The same keys work for `qa_f1_scorer` and `qa_substring_scorer`.
    """
    return _qa_score("em", response, ground_truth, extra_info)


def qa_f1_scorer(response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None) -> ScoreResult:
    """Token F1 of the last `<answer>` against the gold aliases (max over aliases); EM and subEM as components."""
    return _qa_score("f1", response, ground_truth, extra_info)


def qa_substring_scorer(
    response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None
) -> ScoreResult:
    """Word-bounded substring match (cover EM) of the last `<answer>`; EM and F1 as components."""
    return _qa_score("sub_em", response, ground_truth, extra_info)
