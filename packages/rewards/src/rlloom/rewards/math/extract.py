"""Find the final answer in a model response.

A grader that reads the wrong span is wrong whatever its equivalence check does, so extraction is strict and
ordered: the last `\\boxed{}`/`\\fbox{}` (nested braces), then the last `<answer>...</answer>`, then
"the answer is ...", then GSM8K's `#### n`, then the last math environment or bare number (`spans.py`).
Boxes close together with no correction between them ("\\boxed{3} or \\boxed{4}", "\\boxed{(2,2)} \\quad
\\text{and} \\quad \\boxed{(6,2)}") are read as ONE answer listing them all, so a hedge cannot match a single
gold while a multi-part answer can match a set gold; a self-correction (boxes far apart, or "wait", "wrong",
"so" between them) keeps only the last box.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from rlloom.rewards.math.normalize import stated_choice
from rlloom.rewards.math.spans import final_answer, prose_words

ExtractionMode = Literal["boxed", "answer_tag", "answer_is", "gsm8k", "final_number"]
DEFAULT_MODES: tuple[ExtractionMode, ...] = ("boxed", "answer_tag", "answer_is", "gsm8k", "final_number")
ALL_MODES: frozenset[str] = frozenset(DEFAULT_MODES)

# Text longer than this is searched only in its tail: final answers sit at the end, and regexes over 1 MB of
# adversarial text must stay fast.
TAIL_CHARS = 20_000
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
MAX_JOIN_GAP = 48
# Between two boxes, any of these means the later box replaces the earlier one rather than adding to it.
_CORRECTION_RE = re.compile(
    r"\b(?:wait|actually|instead|wrong|incorrect|correct(?:ion|ed)?|mistake|error|sorry|recheck|re-?compute"
    r"|however|but|so|then|therefore|thus|hence|final|answer|not|no)\b|[.!?]\s+[A-Z]|\n\s*\n",
    re.IGNORECASE,
)
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_MARKER_RE = re.compile(r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|:)\s*:?\s*", re.IGNORECASE)
_SENTENCE_RE = re.compile(r"(.+?)(?:\.(?=\s|$)|\n|$)")
_GSM8K_RE = re.compile(r"####\s*([^\n]+)")


def _matching_braces(text: str) -> dict[int, int]:
    """Index of each `{` -> index of its `}`, in one pass (escaped `\\{` `\\}` skipped; unclosed ones absent)."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _boxes(text: str) -> list[tuple[str, int, int]]:
    """All `\\boxed{...}` / `\\fbox{...}` contents with their spans; `\\boxed 5` (no braces) too."""
    found: list[tuple[str, int, int]] = []
    pairs: dict[int, int] | None = None
    for m in _BOX_RE.finditer(text):
        j = m.end()
        if j < len(text) and text[j] == "{":
            pairs = _matching_braces(text) if pairs is None else pairs
            close = pairs.get(j)
            if close is not None:
                found.append((text[j + 1 : close], m.start(), close + 1))
        elif j < len(text) and m.group(0).endswith(" "):
            word = re.match(r"[^\s$]+", text[j:])
            if word:
                found.append((word.group(0), m.start(), j + word.end()))
    return found


def _last_boxed(text: str) -> tuple[str, int] | None:
    """The last boxed answer (close boxes joined, see `extract_boxed`) and where the last box ends."""
    boxes = _boxes(text)
    if not boxes:
        return None
    answers = [boxes[-1][0]]
    for k in range(len(boxes) - 1, 0, -1):
        gap = text[boxes[k - 1][2] : boxes[k][1]]
        if len(gap) > MAX_JOIN_GAP or _CORRECTION_RE.search(gap):
            break
        answers.insert(0, boxes[k - 1][0])
    return ", ".join(a.strip() for a in answers), boxes[-1][2]


def extract_boxed(text: str) -> str | None:
    """The last boxed answer; boxes close before it with no correction between are joined into one list answer."""
    found = _last_boxed(text)
    return found[0] if found else None


_FINAL_MARKER_RE = re.compile(r"final\s+answer\s*(?:is|:)", re.IGNORECASE)


def _final_statement_after(text: str) -> str | None:
    """ "... \\boxed{255} ... Final Answer: The final answer is $10,455$.": a final-answer statement with a number
    or formula written after the last box supersedes it (that box held an intermediate result)."""
    if not _FINAL_MARKER_RE.search(text):
        return None
    span = _extract_answer_is(text)
    return span if span and re.search(r"[\d\\]", span) else None


def _strip_math_delimiters(span: str) -> str:
    span = span.strip()
    for quote in ('\\"', '"', "“"):  # a quoted answer: "\\"$12$ and $13$\\""
        closing = "”" if quote == "“" else quote
        if span.startswith(quote) and span.endswith(closing) and len(span) >= len(quote) + len(closing):
            span = span[len(quote) : len(span) - len(closing)].strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if span.startswith(left) and span.endswith(right) and len(span) >= len(left) + len(right):
            span = span[len(left) : len(span) - len(right)].strip()
    return span.strip().rstrip(".").strip()


def _extract_answer_is(text: str) -> str | None:
    # The LAST marker wins: "Final Answer: The final answer is 3.5" reads 3.5, not "The final answer is 3.5".
    for marker in reversed(list(_ANSWER_MARKER_RE.finditer(text))):
        sentence = _SENTENCE_RE.match(text, marker.end())
        span = _strip_math_delimiters(sentence.group(1)) if sentence else ""
        if span and prose_words(span) >= 2:  # "The largest $n$ is 34": the answer inside the sentence
            span = final_answer(span) or span
        if span:
            return span
    return None


_CHOICE_MARKER_RE = re.compile(
    r"\b(?:(?:correct|right|best|final)\s+(?:option|choice|answer)|option|choice)\s*(?:is|:)\s*:?\s*", re.IGNORECASE
)


def extract_choice(text: str) -> str | None:
    """The option letter the LAST "the correct option is (C)" / "choice: C" / "the answer is C" statement names,
    as `stated_choice` reads it, or None (also when that last statement names no single letter: "the correct
    option is not (B)"). For letter golds whose response has no box; a letter in prose is never read."""
    if not isinstance(text, str) or not text:
        return None
    tail = text[-TAIL_CHARS:]
    markers = list(_CHOICE_MARKER_RE.finditer(tail)) + list(_ANSWER_MARKER_RE.finditer(tail))
    if not markers:
        return None
    last = max(markers, key=lambda m: m.end())
    sentence = _SENTENCE_RE.match(tail, last.end())
    span = _strip_math_delimiters(sentence.group(1)) if sentence else ""
    return span if span and stated_choice(span) else None


def extract_answer(text: str, *, modes: Sequence[ExtractionMode] = DEFAULT_MODES) -> str | None:
    """The final answer in `text`, trying `modes` in order; None when no mode finds one.

    Modes: "boxed" (last `\\boxed{}`/`\\fbox{}`), "answer_tag" (last `<answer>...</answer>`, whose own box wins),
    "answer_is" ("The answer is X", "Final answer: X"), "gsm8k" (`#### n`), "final_number" (the last math
    environment or bare number, read whole). Drop "final_number" to refuse unmarked answers, which stops
    rewarding text that merely ends in a number.
    """
    unknown = set(modes) - ALL_MODES
    if unknown:
        raise ValueError(f"extract_answer: unknown modes {sorted(unknown)}; choose from {sorted(ALL_MODES)}")
    if not isinstance(text, str) or not text:
        return None
    tail = text[-TAIL_CHARS:]
    for mode in modes:
        found: str | None = None
        if mode == "boxed":
            boxed = _last_boxed(tail)
            if boxed is not None:
                found = _final_statement_after(tail[boxed[1] :]) or boxed[0]
        elif mode == "answer_tag":
            tags = _ANSWER_TAG_RE.findall(tail)
            if tags:
                inner = tags[-1]
                found = extract_boxed(inner) or _strip_math_delimiters(inner)
        elif mode == "answer_is":
            found = _extract_answer_is(tail)
        elif mode == "gsm8k":
            hits = _GSM8K_RE.findall(tail)
            found = hits[-1].strip() if hits else None
        elif mode == "final_number":
            found = final_answer(tail[-4000:])
        if found is not None and found.strip():
            return found.strip()
    return None
