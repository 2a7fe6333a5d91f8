"""Which scorer grades which dataset, and how to load a user's own scorer, by name.

`DEFAULT_SCORERS` maps `data_source` names (as in Search-R1/veRL parquet rows) to import paths, resolved
lazily: `import rlloom.rewards` never imports SymPy or the code sandbox, and a missing optional part fails only
when a dataset that needs it is scored. Custom scorers are named like veRL's `custom_reward_function`:
`"package.module:function"` or `"path/to/file.py:function"`. Specs are strings so they can be sent to worker
processes and written in configs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from rlloom.rewards.types import Scorer, ScoreResult

_MATH = "rlloom.rewards.math:math_scorer"
_MATH_BOXED = "rlloom.rewards.math:boxed_math_scorer"  # only a \\boxed{} answer counts (veRL's geo3k, EasyR1)
_QA = "rlloom.rewards.qa:qa_em_scorer"

DEFAULT_SCORERS: dict[str, str] = {
    **dict.fromkeys(["gsm8k", "math", "math500", "aime", "amc", "minerva", "olympiadbench", "dapo_math"], _MATH),
    "geometry3k": _MATH_BOXED,
    **dict.fromkeys(["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "squad"], _QA),
    "humaneval": "rlloom.rewards.code:humaneval_scorer",
    "mbpp": "rlloom.rewards.code:mbpp_scorer",
    **dict.fromkeys(["io", "apps", "codecontests", "taco", "livecodebench"], "rlloom.rewards.code:io_scorer"),
    **dict.fromkeys(["easyr1_math", "geo3k_easyr1"], "rlloom.rewards.math.easyr1:easyr1_math_scorer"),
    "r1_format": "rlloom.rewards.format:r1_format_scorer",
    "think_boxed_format": "rlloom.rewards.format:think_boxed_format_scorer",
    "search_r1_format": "rlloom.rewards.format:search_r1_format_scorer",
    "tool_call": "rlloom.rewards.format:tool_call_scorer",
    "qa_em": _QA,
    "qa_f1": "rlloom.rewards.qa:qa_f1_scorer",
    "qa_sub_em": "rlloom.rewards.qa:qa_substring_scorer",
}

# Prefixes that veRL/HF dataset names carry, e.g. "lighteval/MATH", "openai/gsm8k", "searchR1_nq".
_ALIASES = {
    "lighteval/math": "math",
    "openai/gsm8k": "gsm8k",
    "hiyouga/geometry3k": "geometry3k",
    "math_dapo": "dapo_math",
    # the other names veRL's `default_compute_score` routes, as their HF org prefix is stripped
    "math-lighteval": "math",  # DigitalLearningGmbH/MATH-lighteval (veRL's math_dataset.py)
    "math-500": "math500",  # HuggingFaceH4/MATH-500
    "openai_humaneval": "humaneval",  # openai/openai_humaneval
    "codeforces": "io",
    **dict.fromkeys(
        [f"numina_{n}" for n in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12", "olympiads")],
        "math",
    ),
}


class ScorerLoadError(LookupError):
    """A scorer name, module, file or function could not be resolved; the message says how to fix it."""


def canonical_source(data_source: str) -> str | None:
    """The registry key for a dataset name, tolerating case, HF org prefixes and `searchR1_` prefixes.

    Any name starting with "aime" (aime24, aime2025, HuggingFaceH4/aime_2024, ...) is AIME, graded by the math
    checker, as veRL's `default_compute_score` routes `data_source.startswith("aime")`.
    """
    key = data_source.strip().lower()
    key = _ALIASES.get(key, key)
    if key in DEFAULT_SCORERS:
        return key
    for prefix in ("searchr1_", "search_r1_"):
        if key.startswith(prefix) and key[len(prefix) :] in DEFAULT_SCORERS:
            return key[len(prefix) :]
    tail = key.rsplit("/", 1)[-1]
    tail = _ALIASES.get(tail, tail)
    if tail.startswith("aime") and "aime" in DEFAULT_SCORERS:
        return "aime"
    return tail if tail in DEFAULT_SCORERS else None


def _load_file(path: Path) -> Any:
    if not path.is_file():
        raise ScorerLoadError(f"scorer file {str(path)!r} does not exist; give an existing .py file")
    # named by a stable digest of the path (Python's hash() is salted per process, so scoring workers named the same
    # file differently), and the same name rlloom-core-rl's user_code gives it: one file, one module
    resolved = str(path.resolve())
    name = f"rlloom_user_{path.stem}_{hashlib.sha1(resolved.encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ScorerLoadError(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ScorerLoadError(f"importing scorer file {str(path)!r} failed: {type(exc).__name__}: {exc}") from exc
    return module


def load_function(spec: str) -> Callable[..., Any]:
    """Load `"module:function"` or `"path/to/file.py:function"` (the function name after the LAST colon)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ScorerLoadError(
            f"scorer {spec!r} is neither a known data_source ({', '.join(sorted(DEFAULT_SCORERS))}) "
            "nor 'module:function' / 'path/to/file.py:function'"
        )
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(Path(target))
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ScorerLoadError(
                f"cannot import module {target!r} for scorer {spec!r}: {exc}. Is the package installed "
                "(e.g. the rewards extra that provides it) and on sys.path?"
            ) from exc
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))[:20]
        raise ScorerLoadError(f"{target!r} has no function {attr!r}; callables there: {public}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ScorerLoadError(f"{spec!r} is a {type(fn).__name__}, not a callable scorer")
    return cast(Callable[..., Any], fn)


_CACHE: dict[str, Callable[..., Any]] = {}


def scorer_spec(name: str) -> str:
    """The import spec for a data_source name (via `DEFAULT_SCORERS`), or `name` itself if it is a spec."""
    source = canonical_source(name)
    return DEFAULT_SCORERS[source] if source else name


def is_loaded(name: str) -> bool:
    """Whether `get_scorer(name)` is already cached in this process (so calling it costs no import)."""
    return name in _CACHE


def get_scorer(name: str) -> Scorer:
    """The scorer for a data_source name or a custom spec; imported on first use and cached per process."""
    if name in _CACHE:
        return cast(Scorer, _CACHE[name])
    fn = load_function(scorer_spec(name))
    _CACHE[name] = fn
    return cast(Scorer, fn)


def register(name: str, spec: str) -> None:
    """Add or replace a data_source -> scorer mapping in this process (`spec` as for `load_function`).

    `score_batch` resolves names to specs in the calling process, so its workers honour registrations too.
    """
    load_function(spec)  # fail now, with the reason, rather than at scoring time
    DEFAULT_SCORERS[name.lower()] = spec
    _CACHE.pop(name, None)


def to_result(value: Any, scorer: str | None = None) -> ScoreResult:
    """Normalise what a scorer returned: a float/int/bool, a `ScoreResult`, or a veRL-style dict with `score`.

    A NaN or infinite score becomes 0 with `error` naming `scorer` (when given) and the value: one such reward
    would otherwise turn a whole batch's advantages into NaN.
    """
    result = _as_result(value)
    if math.isfinite(result.score):
        return result
    who = f"scorer {scorer!r}" if scorer else "scorer"
    error = f"{who} returned a non-finite score ({result.score!r}); scored 0"
    return result.model_copy(update={"score": 0.0, "error": f"{result.error}; {error}" if result.error else error})


def _as_result(value: Any) -> ScoreResult:
    if isinstance(value, ScoreResult):
        return value
    if isinstance(value, bool | int | float):
        return ScoreResult(score=float(value))
    if isinstance(value, Mapping) and "score" in value:
        extras = {k: v for k, v in value.items() if k != "score"}
        numeric = {k: float(v) for k, v in extras.items() if isinstance(v, bool | int | float)}
        rest = {k: v for k, v in extras.items() if k not in numeric}
        return ScoreResult(score=float(value["score"]), components=numeric, details=rest)
    raise TypeError(f"a scorer must return a float, a ScoreResult or a dict with 'score'; got {type(value).__name__}")


def is_async_scorer(fn: Callable[..., Any]) -> bool:
    """True for `async def` scorers (e.g. LLM judges), which callers must await."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
