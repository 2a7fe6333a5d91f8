"""Canonical text for an answer: the string rules that decide most comparisons without SymPy.

Normalising removes what never changes a value (`\\left`, spacing commands, `\\dfrac` vs `\\frac`, `\\text{}`
wrappers, units (unit symbols such as `m` only when written as `\\text{m}`), currency, degree marks, a trailing
period, a leading `x =`), writes `\\mathbb{R}` as `(-\\infty,\\infty)`, fixes malformed-but-common
LaTeX (`\\frac12`, `\\sqrt3`), reads repeating decimals, number words and written-out infinity (`forms.py`),
and records the percent sign instead of dropping it, so that 50% can equal 0.5 without 0.5 equalling 50. The
unit it drops is recorded too (`Normalized.unit`, canonical: "cm", "m^2", "km/h"), so that `5 cm` never equals
`5 m`; counted nouns ("apples", "people") and the generic "units" record nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlloom.rewards.math.forms import read_infinity, read_number_words, read_repeating_decimals
from rlloom.rewards.math.structure import split_top_level

# Unit words dropped after a number ("10 cm", "5 \\text{ dollars}"). Longer words first so "meters" beats "m".
_UNIT_WORDS_TEXT = """
    units unit degrees degree dollars dollar cents cent euros euro pounds pound yuan usd
    mph kph km/h m/s kilometers kilometer kilometres kilometre km meters meter metres metre centimeters
    centimeter cm millimeters millimeter mm inches inch in feet foot ft yards yard yd
    miles mile mi square sq cubic seconds second sec minutes minute min hours hour
    hr hrs days day weeks week months month years year grams gram kilograms kilogram
    kg milligrams mg liters liter litres litre ml gallons gallon gal ounces ounce oz
    lbs lb tons ton people persons person students student apples apples marbles cookies points
    point ways times cups cup pages page boxes box books book
"""
_UNITS = sorted(_UNIT_WORDS_TEXT.split(), key=len, reverse=True)
_UNIT_WORDS = set(_UNITS)
_UNIT_TAIL_RE = re.compile(
    r"([\d}.)])\s*(?:(?:" + "|".join(re.escape(u) for u in _UNITS) + r")\b\.?(?:\s*\^\{?[23]\}?)?\s*)+$",
    re.IGNORECASE,
)
# Unit symbols dropped after a number only when written as text (`4\\,\\text{m}^2`): bare, "m" or "s" is a variable.
_TEXT_UNIT_SYMBOLS = "km cm mm nm m kg mg g ms s min h hr mL ml L l"
_TEXT_UNIT_TAIL_RE = re.compile(
    r"([\d}.)])\s*\\(?:text|textrm|mathrm|mbox)\s*\{\s*(?:"
    + "|".join(_TEXT_UNIT_SYMBOLS.split())
    + r")\s*\}(?:\s*\^\s*(?:[23]|\{\s*[23]\s*\}))?\s*\.?\s*$"
)
_REALS_RE = re.compile(r"\\(?:mathbb|Bbb)\s*\{?\s*R\s*\}?")  # the whole answer "all reals" is (-inf, inf)
_TEXT_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mbox|operatorname|mathit|mathsf|mathtt)\s*\{([^{}]*)\}"
)
# Any words in a text box right after a number are a unit or a counted noun: `5\text{ eggs}`, `125\textnormal{ miles}`.
_TEXT_WORDS_TAIL_RE = re.compile(
    r"([\d}.)])\s*\\(?:text|textnormal|textrm|textbf|textit|mbox)\s*\{\s*[A-Za-z][A-Za-z ]{0,30}\}\s*\.?\s*$"
)
# ASCII and alternative spellings of relations, so `x >= 5`, `x \geqslant 5` and `x \geq 5` read alike.
_RELATIONS = (
    (">=", "\\geq "),
    ("<=", "\\leq "),
    ("!=", "\\ne "),
    ("\\geqslant", "\\geq "),
    ("\\leqslant", "\\leq "),
)
_LT_GT_RE = re.compile(r"\\(lt|gt)(?![a-zA-Z])")
_CONNECTOR_RE = re.compile(r"\s*(?:,\s*)?\b(?:and|or)\b\s*(?:,\s*)?")
_SPACING_RE = re.compile(r"(?<!\\)\\[,:;! ]|\\quad|\\qquad|~|\\displaystyle|\\limits")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?=[()\[\]|.]|\\[{}|])")
_FRAC_SHORT_RE = re.compile(r"\\frac\s*(\d)\s*(\d)")
_FRAC_HALF_RE = re.compile(r"\\frac\s*(\d)\s*(?=\{)")
_FRAC_HALF2_RE = re.compile(r"\\frac\s*(\{[^{}]*\})\s*(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt\s*(\d+|[a-zA-Z])")
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree")
_CURRENCY_RE = re.compile(r"\\\$|\$|€|£|¥|\\euro|\\pounds|\bUSD\b|\bRs\.?")
_ASSIGN_RE = re.compile(r"^\s*[a-zA-Z](?:_\{?\w+\}?)?(?:\([a-zA-Z]\))?\s*=\s*(?=[^=])")
_THOUSANDS_RE = re.compile(r"(?<![\d.])([1-9]\d{0,2}(?:(?:,|\{,\}|\\,| )\d{3})+)(?![\d])")
_MC_RE = re.compile(r"^\(?\s*([A-J])\s*\)?[.:]?$")
_MC_PREFIX_RE = re.compile(r"^\(([A-J])\)(?:\s|$)")


# Measurement units by canonical name, so `cm`, `centimeters` and `\\text{ cm}` are one unit and `m` another.
# Counted nouns and the generic "unit(s)" are not here: they never decide a comparison.
_UNIT_NAMES = {
    "km": "km kilometer kilometers kilometre kilometres", "m": "m meter meters metre metres",
    "cm": "cm centimeter centimeters centimetre centimetres", "mm": "mm millimeter millimeters millimetre millimetres",
    "nm": "nm", "in": "in inch inches", "ft": "ft foot feet", "yd": "yd yard yards", "mi": "mi mile miles",
    "g": "g gram grams", "kg": "kg kilogram kilograms", "mg": "mg milligram milligrams",
    "lb": "lb lbs pound pounds", "oz": "oz ounce ounces", "ton": "ton tons",
    "s": "s sec second seconds", "ms": "ms", "min": "min minute minutes", "h": "h hr hrs hour hours",
    "day": "day days", "week": "week weeks", "month": "month months", "year": "year years",
    "L": "l liter liters litre litres", "mL": "ml", "gal": "gal gallon gallons", "cup": "cup cups",
    "mi/h": "mph", "km/h": "kph km/h", "m/s": "m/s",
    "dollar": "dollar dollars usd", "cent": "cent cents", "euro": "euro euros", "yuan": "yuan",
    "degree": "degree degrees",
}  # fmt: skip
# Currency signs name a unit too (`\\$5` is not 5 cents); a bare `$` is left out (what is left of a math
# delimiter: "$125$ miles"), and so are £ and ¥ (pounds of weight; yen or yuan).
_CURRENCY_NAMES = {"\\$": "dollar", "USD": "dollar", "€": "euro", "\\euro": "euro"}
_UNIT_CANON = {word: name for name, words in _UNIT_NAMES.items() for word in words.split()}
_UNIT_POWER_WORDS = {"square": 2, "sq": 2, "cubic": 3}
_UNIT_TOKEN_RE = re.compile(r"[a-z]+/[a-z]+|[a-z]+|\^\s*\{?\s*([23])")


def unit_key(tail: str) -> str | None:
    """The canonical unit named by a dropped unit tail (`\\text{ cm}^2` -> "cm^2", "square meters" -> "m^2",
    "km/h" -> "km/h"), or None when it names no measurement unit ("apples", "units", "square units")."""
    tail = re.sub(r"\\[a-zA-Z]+", " ", tail).lower()
    names: list[str] = []
    power = 1
    for m in _UNIT_TOKEN_RE.finditer(tail):
        word = m.group(0)
        if m.group(1):  # `^2` after a unit
            if names:
                names[-1] = f"{names[-1].split('^')[0]}^{m.group(1)}"
            continue
        if word in _UNIT_POWER_WORDS:
            power = _UNIT_POWER_WORDS[word]
            continue
        name = _UNIT_CANON.get(word)
        if name is not None:
            names.append(name if power == 1 else f"{name}^{power}")
        power = 1
    return " ".join(names) or None


@dataclass(frozen=True)
class Normalized:
    """An answer after string normalisation; `percent` is True when the answer carried a percent sign, `unit` is
    the measurement unit dropped after its number (canonical, see `unit_key`), if any."""

    text: str
    percent: bool
    unit: str | None = None


def _cut(regex: re.Pattern[str], s: str, units: list[str]) -> str:
    """`regex.sub(r"\\1", s)`, noting in `units` what it removed (group 1 is the number kept before the unit)."""

    def repl(m: re.Match[str]) -> str:
        units.append(m.group(0)[len(m.group(1)) :])
        return m.group(1)

    return regex.sub(repl, s)


def _unwrap_text(s: str) -> str:
    prev = None
    while prev != s:
        prev = s
        s = _TEXT_RE.sub(lambda m: " " + m.group(1) + " ", s)
    return s


def _strip_units(s: str, units: list[str] | None = None) -> str:
    # Only strip a unit tail after something numeric-looking, so "x \\text{ or } y" keeps its words.
    found: list[str] = []
    stripped = _cut(_UNIT_TAIL_RE, s, found).strip()
    if not stripped:
        return s
    if units is not None:
        units.extend(found)
    return stripped


def _join_thousands(s: str) -> str:
    def repl(m: re.Match[str]) -> str:
        before = s[: m.start()]
        if before.count("(") + before.count("[") > before.count(")") + before.count("]"):
            return m.group(0)  # inside a bracket: "x=(12,102)" is an interval or a pair, not 12102
        return re.sub(r"\{,\}|\\,|,| ", "", m.group(1))

    # "1,000" is a thousands separator, but "1, 000" or tuples "(1,234)" are not changed by a lone match below
    # the bracket level, so only join when no bracket surrounds the whole answer.
    if s.startswith(("(", "[", "\\{")):
        return s
    if re.search(r"\d, \d", s):  # "1, 2, 3" is a list, not thousands
        return s
    return _THOUSANDS_RE.sub(repl, s)


def normalize(answer: str) -> Normalized:
    """Canonical form of one answer string (see module docstring for what is removed and why)."""
    s = answer.strip()
    s = s.replace("\n", " ").replace("\\\\", "\\") if "\\begin" not in s else s.replace("\n", " ")
    s = re.sub(r"^\$+|\$+$", "", s.strip()) if not s.startswith("\\$") else s
    s = s.strip().removeprefix("\\(").removesuffix("\\)").removeprefix("\\[").removesuffix("\\]")
    s = re.sub(r"\\boxed\s*\{(.*)\}", r"\1", s)
    # "32,\\!348": a thousands comma followed by a negative thin space; MATH also writes "11,\\! 111,\\! 100",
    # whose source space must not turn the number into the list "11, 111, 100".
    s = re.sub(r"(?<=\d),\\!\s*(?=\d{3}(?!\d))", ",", s)
    s = s.replace(",\\!", ",")
    s = _SPACING_RE.sub(" ", s)
    s = _LEFT_RIGHT_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    for old, new in _RELATIONS:
        s = s.replace(old, new)
    s = _LT_GT_RE.sub(lambda m: "<" if m.group(1) == "lt" else ">", s)
    s = re.sub(r"\\(le|ge)(?![a-zA-Z])", r"\\\1q", s).replace("\\neq", "\\ne")
    s = s.replace("−", "-").replace("–", "-").replace("×", "\\times").replace("·", "\\cdot").replace("π", "\\pi")
    s = s.replace("∞", "\\infty").replace("√", "\\sqrt")
    units: list[str] = []
    s = _cut(_TEXT_UNIT_TAIL_RE, s, units)
    s = _cut(_TEXT_WORDS_TAIL_RE, s, units)
    s = _unwrap_text(s)
    s = _DEGREE_RE.sub("", s)
    units += [_CURRENCY_NAMES.get(m.strip(), "") for m in _CURRENCY_RE.findall(s)]
    s = _CURRENCY_RE.sub("", s)
    percent = bool(re.search(r"\\?%|\bpercent(?:age)?\b|\bpct\b", s))
    s = re.sub(r"\\?%|\bpercent(?:age)?\b|\bpct\b", "", s)
    s = read_repeating_decimals(s)
    s = s.strip().rstrip(".").strip()
    s = read_number_words(read_infinity(s), is_unit_word)
    s = _strip_units(s, units)
    s = re.sub(r"^[a-zA-Z]\s*\\in\s*", "", s)  # "x \\in [-2, 7]" is the interval itself
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_HALF_RE.sub(r"\\frac{\1}", s)
    s = _FRAC_HALF2_RE.sub(r"\\frac\1{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = _join_thousands(s)
    if re.search(r"[\d\\]", s):  # a math answer: "2 and 3", "-12;-11" and "(0;1)" list with commas
        s = _CONNECTOR_RE.sub(",", s).replace(";", ",").strip(",")
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s*([(),\[\]{}^_+*/=<>-])\s*", r"\1", s)
    s = re.sub(r"(?<![\d])\.(\d)", r"0.\1", s)  # ".5" -> "0.5"
    s = re.sub(r"^\{([^{}]*)\}$", r"\1", s)
    s = re.sub(r"^[(\[](\\begin\{(\w+)\}.*\\end\{\2\})[)\]]$", r"\1", s)  # "(\\begin{pmatrix}..\\end{pmatrix})"
    if _REALS_RE.fullmatch(s):
        s = "(-\\infty,\\infty)"
    unit = " ".join(dict.fromkeys(k for k in map(unit_key, units) if k)) or None
    return Normalized(text=s, percent=percent, unit=unit)


_LABEL_NOISE_RE = re.compile(r"_\{[^{}]*\}|_\w|\\(?:frac|angle|overline|triangle|vec|text|mathrm)|[{}\s]")
_LABEL_RE = re.compile(r"[A-Za-z(),:|]+")
_CONSTANT_NOISE_RE = re.compile(r"\\(?:frac|sqrt|cdot|times|div|pi)|[\d\s{}()+\-*/^.,!]")


def _is_label(lhs: str) -> bool:
    """`x`, `f(x)`, `(p,q)`, `AB`, `|AB|`, `V_{1}:V_{2}`, `\\frac{NO}{BO}`: names, no numbers or operators."""
    return bool(_LABEL_RE.fullmatch(_LABEL_NOISE_RE.sub("", lhs)))


def _is_constant(side: str) -> bool:
    """`5+5+1`, `\\frac{1}{2}\\cdot 3`: a number or a computation, no names."""
    return bool(side.strip()) and not _CONSTANT_NOISE_RE.sub("", side)


def reduce_chain(text: str) -> str:
    """`x=5+5+1=\\frac{1}{3}\\approx 0.3` -> `x=\\frac{1}{3}`: a chain of equalities states its last side."""
    if "\\approx" in text and "=" in text:
        text = text.split("\\approx", 1)[0]
    if text.count("=") < 2:  # most answers: no chain, and no need to scan brackets
        return text
    parts = split_top_level(text, "=")  # `\\sum_{k=0}` holds an `=` that is no relation
    if len(parts) <= 2 or re.search(r"[<>,]|\\[lg]eq|\\ne", text):  # "a=1,b=2" is a list, not a chain
        return text
    return f"{parts[0]}={parts[-1]}" if _is_label(parts[0]) else parts[-1]


def strip_assignment(text: str) -> str:
    """`x=3` -> `3` (and `f(x)=`, `a_1=`, `(p,q)=`, `AB=`, `1+1=`); used only when the other answer has no `=`."""
    sides = split_top_level(text, "=")
    if len(sides) != 2 or re.search(r"[<>]|\\[lg]eq|\\ne", text):
        return text
    lhs, rhs = sides
    if _is_label(lhs) or (_is_constant(lhs) and _is_constant(rhs)):  # "7=11a+c" is an equation, not a value
        return rhs
    return _ASSIGN_RE.sub("", text, count=1)


def choice_letter(answer: str) -> str | None:
    """The multiple-choice letter an answer names ("B", "(B)", "\\text{(B)}", "B.", "(B) 42"), else None."""
    s = _unwrap_text(answer.strip().strip("$")).strip()
    s = re.sub(r"^(?:option|choice|answer)\s*:?\s*", "", s, flags=re.IGNORECASE)
    m = _MC_RE.match(s) or _MC_PREFIX_RE.match(s)
    return m.group(1) if m else None


_CHOICE_PREFIX_RE = re.compile(
    r"^(?:the\s+)?(?:(?:correct|right|best|final)\s+)?(?:option|choice|answer)\s*(?:is\s*)?:?\s*", re.IGNORECASE
)
_STATED_LETTER_RE = re.compile(r"^(\()?\s*([A-J])(?![A-Za-z0-9'])\s*(\))?(.*)$", re.DOTALL)
_AFTER_LETTER_RE = re.compile(r"^\s*(?:[.,;:!]|(?:because|since|as)\b)", re.IGNORECASE)
# Another option named after the letter: "(C)", a capital B-H or J standing alone, or "A" not followed by a
# lower-case word ("A lot" is prose); a bare "I" is a pronoun.
_OTHER_OPTION_RE = re.compile(r"\(\s*[A-J]\s*\)|(?<![A-Za-z0-9'\\])(?:[B-HJ]|A(?!\s+[a-z]))(?![A-Za-z0-9'])")


def stated_choice(answer: str) -> str | None:
    """The one option letter an extracted answer states, read more widely than `choice_letter` but never from
    prose: what `choice_letter` reads, and also `**B**`, `\\textbf{B}`, "option C", "the correct answer is (D)",
    "B) 12", "B, since ...", "B because ...". The letter must come first and stand alone; after it, a bracket
    closing it, a punctuation mark, or "because"/"since"/"as". Refused: "A good deal ..." (a letter that starts
    a sentence), "I think ...", "not B", and anything naming a second option ("B or C", "(B), (C)", "B, not A").
    """
    s = _unwrap_text(answer.replace("*", " ").strip().strip("$")).strip()
    s = _CHOICE_PREFIX_RE.sub("", s).strip()
    m = _STATED_LETTER_RE.match(s)
    if m is None or (m.group(1) and not m.group(3)):
        return choice_letter(answer)  # "(B": an unclosed bracket, as `choice_letter` reads it
    letter, closed, rest = m.group(2), m.group(3), m.group(4)
    if rest.strip() and not closed and not _AFTER_LETTER_RE.match(rest):
        return None
    return None if _OTHER_OPTION_RE.search(rest) else letter  # "(B) or (C)" names two


def is_unit_word(word: str) -> bool:
    """Whether `word` is a unit or counted noun we drop after a number."""
    return word.lower() in _UNIT_WORDS
