"""Answer forms written in words or in repeating-decimal notation, read into the LaTeX the rest of the rules know.

- Repeating decimals are exact rationals: `0.\\overline{3}`, `0.\\bar{3}`, `0.(3)`, `0.1\\dot{6}` and
  `0.\\dot{1}4285\\dot{7}` (dots over the first and last digit of the block) become `\\frac{n}{d}`. A decimal
  written as going on (`0.333...`, `0.1666\\ldots`, `0.8333 repeating`, `3.1415...`) keeps its digits with a
  `\\ldots` mark; `numeric` reads it as the repeating decimal its digits show when they end in a block shown at
  least twice (`0.1666...` is 1/6, `0.0833...` is 1/12, `0.142857142857...` is 1/7), or else as the value
  rounded or truncated to those digits (`3.1415...` for pi).
- Number words: a whole answer that is a number in English words, optionally followed by a unit or a counted
  noun, becomes digits: "twelve", "one hundred and five", "twenty-one", "a thousand", "negative seven",
  "three quarters", "two thirds", "one and a half". Only a whole answer is read (never a number word inside a
  sentence), and only well-formed numbers ("five five", "one or two" and "twelve and thirteen" stay text).
- Written-out infinity: "infinity", `\\text{infinity}` and `\\infinity` are `\\infty`; "negative infinity" and
  "minus infinity" are `-\\infty`, "positive infinity" is `\\infty`. "infinitely many" is not touched.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

# ---------------------------------------------------------------- repeating decimals

_OVERLINE_RE = re.compile(r"(-?)(\d*)\.(\d*)\\(?:overline|bar)\s*(?:\{\s*(\d+)\s*\}|(\d))")
_PAREN_RE = re.compile(r"(?<![\d.])(-?)(\d*)\.(\d*)\((\d+)\)")
_DOT_RE = re.compile(r"(-?)(\d*)\.((?:\d|\\dot\s*(?:\{\s*\d\s*\}|\d))+)")
_DOTTED_DIGIT_RE = re.compile(r"\\dot\s*(?:\{\s*(\d)\s*\}|(\d))|(\d)")
# "0.333...", "0.333\\ldots", "0.1666 repeating": digits written as going on.
_CONTINUED_RE = re.compile(
    r"(?<![\d.])(-?)(\d*)\.(\d+)\s*(?:\\ldots|\\dots|\\cdots|\.\.\.|…|\s(?:repeating|recurring)\b)", re.IGNORECASE
)
# Integers "12\\ldots" and anything else followed by dots: the mark is dropped, as before.
_MARK = "\x00"  # a continued decimal's mark while the other dots are dropped
_OTHER_CONTINUED_RE = re.compile(r"(?<=\d)\s*(?:\\ldots|\\dots|\.\.\.|…|\s(?:repeating|recurring))", re.IGNORECASE)


def repeating_value(whole: str, fixed: str, block: str) -> Fraction:
    """`whole.fixed(block)(block)...`: e.g. ("0", "1", "6") is 0.1666... = 1/6."""
    base = Fraction(int(whole or "0")) + (Fraction(int(fixed), 10 ** len(fixed)) if fixed else 0)
    return base + Fraction(int(block), (10 ** len(block) - 1) * 10 ** len(fixed))


def _frac_text(sign: str, value: Fraction) -> str:
    if value.denominator == 1:
        return f"{sign}{value.numerator}"
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _trailing_block(digits: str) -> tuple[str, str] | None:
    """(fixed part, block) when `digits` ends in a block shown at least twice ("1666" -> ("1", "6")), else None."""
    for period in range(1, len(digits) // 2 + 1):
        block = digits[-period:]
        if digits[-2 * period : -period] == block:
            fixed = digits[: len(digits) - 2 * period]
            while fixed and fixed[-1] == block[-1]:  # 0.1666: the block starts where the 6s start
                fixed, block = fixed[:-1], fixed[-1] + block[:-1]
            return fixed, block
    return None


def _dotted(m: re.Match[str]) -> str:
    """`0.1\\dot{6}` -> `\\frac{1}{6}`; `0.\\dot{1}4285\\dot{7}` -> `\\frac{1}{7}`; text without a dot is unchanged."""
    sign, whole, body = m.group(1), m.group(2), m.group(3)
    if "\\dot" not in body:
        return m.group(0)
    digits: list[tuple[str, bool]] = []
    for d in _DOTTED_DIGIT_RE.finditer(body):
        digits.append((d.group(1) or d.group(2), True) if d.group(3) is None else (d.group(3), False))
    marked = [i for i, (_, dot) in enumerate(digits) if dot]
    if not marked or len(marked) > 2 or marked[-1] != len(digits) - 1:
        return m.group(0)  # digits after the last dot: not a repeating decimal we can read
    first = marked[0]
    fixed = "".join(d for d, _ in digits[:first])
    block = "".join(d for d, _ in digits[first:])
    return _frac_text(sign, repeating_value(whole, fixed, block))


def continued_value(whole: str, digits: str) -> Fraction | None:
    """The repeating decimal `whole.digits...` means when `digits` end in a block shown at least twice
    ("0", "1666" -> 1/6; "0", "0833" -> 1/12), else None ("3", "1415")."""
    found = _trailing_block(digits)
    return repeating_value(whole, *found) if found else None


def _continued(m: re.Match[str]) -> str:
    # Kept as digits with a `\\ldots` mark: `numeric` reads it as the repeating decimal its digits show, or as
    # the value rounded or truncated (3.1415... for pi), whichever the other answer needs.
    sign, whole, digits = m.group(1), m.group(2), m.group(3)
    return f"{sign}{whole or '0'}.{digits}{_MARK}"


def read_repeating_decimals(s: str) -> str:
    """Every repeating-decimal notation in `s` as an exact `\\frac{n}{d}` (see the module doc)."""
    if "." not in s and "…" not in s:
        return s
    s = s.replace(_MARK, "")
    s = _OVERLINE_RE.sub(lambda m: _frac_text(m[1], repeating_value(m[2], m[3], m[4] or m[5])), s)
    s = _PAREN_RE.sub(lambda m: _frac_text(m[1], repeating_value(m[2], m[3], m[4])), s)
    if "\\dot" in s:
        s = _DOT_RE.sub(_dotted, s)
    s = _CONTINUED_RE.sub(_continued, s)
    return _OTHER_CONTINUED_RE.sub("", s).replace(_MARK, "\\ldots")


# ---------------------------------------------------------------- number words

_SMALL_WORDS = """zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen"""
_TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety"
_SMALL = {w: n for n, w in enumerate(_SMALL_WORDS.split())}
_TENS = {w: 10 * n for n, w in enumerate(_TENS_WORDS.split(), start=2)}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_DENOMINATORS = {
    "half": 2, "halves": 2, "third": 3, "thirds": 3, "quarter": 4, "quarters": 4, "fourth": 4, "fourths": 4,
    "fifth": 5, "fifths": 5, "sixth": 6, "sixths": 6, "seventh": 7, "sevenths": 7, "eighth": 8, "eighths": 8,
    "ninth": 9, "ninths": 9, "tenth": 10, "tenths": 10, "eleventh": 11, "elevenths": 11, "twelfth": 12,
    "twelfths": 12, "hundredth": 100, "hundredths": 100, "thousandth": 1000, "thousandths": 1000,
}  # fmt: skip
_NEGATIVE = frozenset({"negative", "minus"})


def _integer(words: list[str], i: int) -> tuple[int, int] | None:
    """The well-formed integer that starts at `words[i]`: (value, index after it), or None.

    "one hundred and five", "twenty-one" (split earlier), "twelve hundred", "a thousand", "two million three
    hundred thousand". A small number may not follow a small number ("five five"), nor a ten a ten or a small.
    """
    total, current, last, start = 0, 0, "", i
    while i < len(words):
        w = words[i]
        following = words[i + 1] if i + 1 < len(words) else ""
        if w in ("a", "an") and i == start and (following == "hundred" or following in _SCALES):
            current, last = 1, "small"
        elif w in _SMALL:
            n = _SMALL[w]
            if last in ("small", "teen") or (last == "tens" and not 1 <= n <= 9) or (n == 0 and i != start):
                break  # "five five", "twenty twelve", "one zero"
            current += n
            last = "teen" if n >= 10 else "small"
        elif w in _TENS:
            if last in ("small", "teen", "tens"):
                break
            current += _TENS[w]
            last = "tens"
        elif w == "hundred":
            if last not in ("small", "teen", "tens") or current % 100 == 0 or current >= 100:
                break
            current *= 100
            last = "hundred"
        elif w in _SCALES:
            if last not in ("small", "teen", "tens", "hundred") or current == 0:
                break
            if total and total < _SCALES[w] * 1000 and total % (_SCALES[w] * 1000) != 0:
                break  # "one thousand two thousand"
            total += current * _SCALES[w]
            current, last = 0, "scale"
        elif w == "and" and last in ("hundred", "scale") and (following in _SMALL or following in _TENS):
            last = "and"
        else:
            break
        i += 1
    if last in ("", "and"):
        return None
    return total + current, i


def _number(words: list[str]) -> tuple[Fraction, int] | None:
    """The number that starts `words`: an integer, a fraction ("three quarters", "a half") or a mixed number
    ("two and a half"), with an optional "negative"/"minus"; (value, words used) or None."""
    i, sign = 0, 1
    if words and words[0] in _NEGATIVE:
        i, sign = 1, -1
    if i < len(words) and words[i] in ("a", "an", "one") and i + 1 < len(words) and words[i + 1] in _DENOMINATORS:
        return sign * Fraction(1, _DENOMINATORS[words[i + 1]]), i + 2
    if i < len(words) and words[i] == "half":
        return sign * Fraction(1, 2), i + 1
    found = _integer(words, i)
    if found is None:
        return None
    value, j = found
    if j < len(words) and words[j] in _DENOMINATORS and value >= 1 and words[j] not in ("half",):
        return sign * Fraction(value, _DENOMINATORS[words[j]]), j + 1
    if j + 2 < len(words) and words[j] == "and":
        rest = _number(words[j + 1 :])
        if rest is not None and 0 < rest[0] < 1 and words[j + 1] in ("a", "an", "one", "half") | _SMALL.keys():
            return sign * (value + rest[0]), j + 1 + rest[1]
    return sign * Fraction(value), j


_WORD_SPLIT_RE = re.compile(r"[a-z]+")
_WORDS_ONLY_RE = re.compile(r"[A-Za-z][A-Za-z \-]*")


def read_number_words(s: str, is_unit: Callable[[str], bool]) -> str:
    """`s` with a leading number in words written in digits, when `s` is that number followed by nothing but
    unit words (`is_unit`): "twelve" -> "12", "three quarters" -> "\\frac{3}{4}", "five apples" -> "5 apples"."""
    if not _WORDS_ONLY_RE.fullmatch(s.strip()):
        return s
    words = _WORD_SPLIT_RE.findall(s.lower())
    found = _number(words)
    if found is None:
        return s
    value, used = found
    rest = words[used:]
    if not all(is_unit(w) for w in rest):
        return s
    number = _frac_text("-" if value < 0 else "", abs(value))
    return " ".join([number, *rest])


# ---------------------------------------------------------------- infinity

_INFINITY_RE = re.compile(
    r"(?:\b(negative|minus|positive|plus)\s+|([-+])\s*)?(?:\\infinity\b|\binfinity\b)", re.IGNORECASE
)


def read_infinity(s: str) -> str:
    """Written-out infinity as `\\infty`: "infinity", `\\infinity` -> `\\infty`, "negative infinity" -> `-\\infty`."""
    if "nfinity" not in s.lower():
        return s

    def repl(m: re.Match[str]) -> str:
        word, sign = (m.group(1) or "").lower(), m.group(2) or ""
        negative = word in ("negative", "minus") or sign == "-"
        return "-\\infty" if negative else "\\infty"

    return _INFINITY_RE.sub(repl, s)
