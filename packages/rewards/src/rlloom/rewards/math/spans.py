"""Find unmarked final answers: the last math environment or the last bare number, never digits cut out of LaTeX.

A response with no box and no "the answer is" still usually ends with its answer, written either inside a math
environment (`$[0,1)$`, `\\(x \\geq 5\\)`, `$$\\begin{pmatrix}...\\end{pmatrix}$$`) or as a plain number. The
whichever comes last is the answer, read whole: `so $x = \\frac{10}{9}$` answers `x = \\frac{10}{9}`, not 9.
A `$` is also a currency sign, so an inline `$...$` must sit on one line and hold math, not prose; a bare
number glued to LaTeX or to a preceding letter (`\\frac{10}{9}`, `AZYUK2A`) is read with what it is glued to.
"""

from __future__ import annotations

import itertools
import re

# `1 000` and `1,000.5` are one number; `2,74` is kept whole and read as a decimal comma later, if at all.
_NUMBER_RE = re.compile(r"-?\d{1,3}(?: \d{3})+(?![\d,.])|-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_COMMAND_RE = re.compile(r"\\(?:begin|end)\s*\{[^{}]*\}|\\[a-zA-Z]+")
# Prose words: three or more letters, lower case or capitalised ("Thus", "apples"); `xy`, `ABC`, `\\sin` are math.
_PLAIN_WORD_RE = re.compile(r"(?<![\\a-zA-Z])[A-Za-z][a-z]{2,}(?![a-zA-Z])")
_CONNECTORS = frozenset({"and", "or"})
_LATEX_GLUE = re.compile(r"[\\{}^_]")


def _closing(text: str, start: int, delim: str) -> int:
    """Index of the unescaped `delim` closing a math environment opened before `start`, or -1."""
    i = start
    while True:
        j = text.find(delim, i)
        if j < 0:
            return -1
        if j > 0 and text[j - 1] == "\\" and delim.startswith("$"):
            i = j + 1  # `\$` is a literal dollar inside math
            continue
        return j


def math_environments(text: str) -> list[tuple[str, int, int]]:
    """(content, start, end) of each `$$..$$`, `\\[..\\]`, `\\(..\\)` and one-line `$..$` environment, in order."""
    found: list[tuple[str, int, int]] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "[(":
            close = _closing(text, i + 2, "\\]" if text[i + 1] == "[" else "\\)")
            if close < 0:
                i += 2
                continue
            content = text[i + 2 : close]
            if text[i + 1] == "[" or "\n" not in content:
                found.append((content, i, close + 2))
                i = close + 2
            else:
                i += 2
            continue
        if ch == "\\":
            i += 2  # an escaped character, `\$` included
            continue
        if ch == "$":
            delim = "$$" if text.startswith("$$", i) else "$"
            close = _closing(text, i + len(delim), delim)
            if close < 0:
                i += len(delim)
                continue
            content = text[i + len(delim) : close]
            if delim == "$" and "\n" in content:
                i += 1  # an inline formula never spans lines: this `$` is a currency sign
                continue
            found.append((content, i, close + len(delim)))
            i = close + len(delim)
            continue
        i += 1
    return found


def looks_like_math(content: str) -> bool:
    """Whether an environment's content is a formula or a short answer, not prose between two currency signs."""
    body = content.strip()
    if not body or len(body) > 400:
        return False
    if body[0].isdigit() and content[-1:].isspace():
        return False  # "$5 and $" is two prices
    return _word_count(body) <= 1


def _word_count(text: str) -> int:
    outside_text = _COMMAND_RE.sub(" ", _TEXT_CMD_RE.sub(" ", text))
    return len([w for w in _PLAIN_WORD_RE.findall(outside_text) if w.lower() not in _CONNECTORS])


def _bare_number(text: str, match: re.Match[str]) -> str:
    """The number, or the whole LaTeX/word token it is glued into (`\\frac{10}{9}`, `x^2`, `AZYUK2A`)."""
    start, end = match.start(), match.end()
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    while end < len(text) and not text[end].isspace():
        end += 1
    token = text[start:end].strip(".,;:!?")
    before = text[start : match.start()]
    if _LATEX_GLUE.search(token) or re.search(r"[a-zA-Z]$", before):
        return token
    return match.group(0).replace(" ", "") if "," not in match.group(0) else match.group(0)


def final_answer(text: str) -> str | None:
    """The last math environment holding math, or the last bare number after it (see the module docstring)."""
    envs = [e for e in math_environments(text) if looks_like_math(e[0])]
    after = envs[-1][2] if envs else 0
    outside = text[after:]
    numbers = list(_NUMBER_RE.finditer(outside))
    if numbers:
        return _bare_number(outside, numbers[-1])
    if envs:
        return envs[-1][0].strip().rstrip(".,;").strip()
    return None


def prose_words(text: str) -> int:
    """How many plain words `text` has outside math: a sentence, not an answer, when there are several."""
    outside = text
    for _, start, end in reversed(math_environments(text)):
        outside = outside[:start] + " " + outside[end:]
    return _word_count(outside)


_JOINER_RE = re.compile(r"^(?:[\s,;.]|\band\b|\bor\b|\\(?:q?quad|text\s*\{\s*(?:and|or)?\s*\}))*$")


def joined_environments(text: str) -> str | None:
    """`$1$ and $2$ and $3$` -> `1, 2, 3`: several formulas joined only by commas/"and"/"or" are one list."""
    envs = math_environments(text)
    if len(envs) < 2:
        return None
    gaps = [text[: envs[0][1]], text[envs[-1][2] :]]
    gaps += [text[a[2] : b[1]] for a, b in itertools.pairwise(envs)]
    if not all(_JOINER_RE.match(gap) for gap in gaps):
        return None
    return ", ".join(content.strip() for content, _, _ in envs)
