"""Structure rewards: does the response have the shape the prompt asked for, and is it too long?

Every check returns a `FormatCheck(score, reason)`, so a training log says *why* a response lost its format
reward. Covered: R1-style `<think>...</think><answer>...</answer>`, EasyR1's `<think>...</think>` then
`\\boxed{}`, Search-R1's think -> search -> information -> ... -> answer tag sequence (and its `qa_em_format`
reward table), `<tool_call>{json}</tool_call>` validity, DAPO's soft overlong punishment and Kimi k1.5's group
length reward. Each check has a `Scorer` wrapper.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from rlloom.rewards.qa import exact_match, extract_tagged_answer, normalize_answer, qa_golds
from rlloom.rewards.scorer_inputs import not_text_error, plain, response_text
from rlloom.rewards.types import ScoreResult


class FormatCheck(NamedTuple):
    """A structure verdict: the score and a human-readable reason."""

    score: float
    reason: str


_R1 = re.compile(r"\A\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*\Z", re.DOTALL)
_R1_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def r1_format(text: str, *, require_content: bool = True) -> FormatCheck:
    """1.0 for exactly one `<think>...</think>` followed by one `<answer>...</answer>` and nothing else.

    `require_content` rejects an empty think or answer block: an empty `<think></think>` otherwise earns the full
    format reward (a known hack).
    """
    for tag in _R1_TAGS:
        count = text.count(tag)
        if count != 1:
            return FormatCheck(0.0, f"expected exactly one {tag}, found {count}")
    match = _R1.match(text)
    if match is None:
        return FormatCheck(0.0, "tags out of order or text outside <think>/<answer>")
    if require_content:
        if not match.group(1).strip():
            return FormatCheck(0.0, "empty <think> block")
        if not match.group(2).strip():
            return FormatCheck(0.0, "empty <answer> block")
    return FormatCheck(1.0, "ok")


_THINK_BOXED = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
_TAG_SPACES = re.compile(r"\s*(<|>|/)\s*")


def strip_tag_spaces(text: str) -> str:
    """Drop whitespace around `<`, `>` and `/` (EasyR1 does this first: Qwen2.5-VL-32B writes `< think >`)."""
    return _TAG_SPACES.sub(r"\1", text)


def think_boxed_format(text: str) -> FormatCheck:
    """1.0 if the whole response is `<think>...</think>` then text holding `\\boxed{...}` (EasyR1's math format:
    examples/reward_function/math.py `format_reward`, a full regex match after `strip_tag_spaces`)."""
    text = strip_tag_spaces(text)
    if _THINK_BOXED.fullmatch(text):
        return FormatCheck(1.0, "ok")
    if "<think>" not in text or "</think>" not in text:
        return FormatCheck(0.0, "no <think>...</think> block")
    if not text.startswith("<think>"):
        return FormatCheck(0.0, "text before <think>")
    return FormatCheck(0.0, "no \\boxed{} answer after </think>")


_SEARCH_TAGS = re.compile(r"(</?(?:think|search|information|answer)>)")
_ASSISTANT = re.compile(r"<\|im_start\|>assistant\s*")
# state -> {tag: next state}; the machine of Search-R1's `is_valid_sequence` (qa_em_format.py).
_TRANSITIONS: dict[str, dict[str, str]] = {
    "start": {"<think>": "in_think"},
    "information": {"<think>": "in_think"},
    "in_think": {"</think>": "after_think"},
    "after_think": {"<search>": "in_search", "<answer>": "in_answer"},
    "in_search": {"</search>": "after_search"},
    "after_search": {"<information>": "in_information"},
    "in_information": {"</information>": "information"},
    "in_answer": {"</answer>": "end"},
    "end": {},
}
_INSIDE = frozenset({"in_think", "in_search", "in_information", "in_answer"})


def search_r1_sequence(text: str) -> FormatCheck:
    """1.0 if the response follows think -> (search -> information -> think)* -> answer with only whitespace
    between blocks (Search-R1 v0.3 `is_valid_sequence`); the reason names the first offending tag or text.

    If the text contains `<|im_start|>assistant`, only what follows the first one is checked (as Search-R1
    does when given prompt + response).
    """
    marker = _ASSISTANT.search(text)
    content = text[marker.end() :] if marker else text
    for tag in ("think", "search", "information", "answer"):
        opening, closing = content.count(f"<{tag}>"), content.count(f"</{tag}>")
        if opening != closing:
            return FormatCheck(0.0, f"unbalanced <{tag}>: {opening} opening vs {closing} closing tags")
    state = "start"
    for part in _SEARCH_TAGS.split(content):
        if not part.strip():
            continue
        if _SEARCH_TAGS.fullmatch(part):
            nxt = _TRANSITIONS[state].get(part)
            if nxt is None:
                return FormatCheck(0.0, f"unexpected tag {part} in state {state}")
            state = nxt
        elif state not in _INSIDE:
            snippet = part.strip()[:40]
            return FormatCheck(0.0, f"unexpected text {snippet!r} outside tags (state {state})")
    if state != "end":
        return FormatCheck(0.0, f"incomplete sequence, ended in state {state}")
    return FormatCheck(1.0, "ok")


_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def search_r1_format_reward(
    response: str,
    golds: str | Sequence[str],
    *,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
) -> FormatCheck:
    """Search-R1's `qa_em_format` table: correct+valid 1, correct+invalid 1-s, wrong/missing+valid s
    (+retrieval_score if a gold alias appears in an `<information>` block), wrong+invalid f, missing+invalid 0;
    with s=structure_format_score, f=final_format_score (defaults: the paper's 0.2 / 0.1 / 0).
    """
    valid = search_r1_sequence(response)
    answer = extract_tagged_answer(response)
    retrieved = False
    if valid.score and retrieval_score:
        # block by block, as Search-R1's is_retrieval_correct: joined blocks would match a gold across a seam
        docs = [normalize_answer(d) for d in _INFORMATION.findall(response)]
        aliases = [a for a in (normalize_answer(g) for g in qa_golds(golds)) if a]
        retrieved = any(a in doc for doc in docs for a in aliases)
    if answer is not None and exact_match(answer, golds):
        if valid.score:
            return FormatCheck(1.0, "correct answer, valid format")
        return FormatCheck(1.0 - structure_format_score, f"correct answer, invalid format: {valid.reason}")
    what = "no answer" if answer is None else "wrong answer"
    if valid.score:
        bonus = retrieval_score if retrieved else 0.0
        return FormatCheck(
            structure_format_score + bonus, f"{what}, valid format" + (", gold retrieved" if bonus else "")
        )
    if answer is None:
        return FormatCheck(0.0, f"no answer, invalid format: {valid.reason}")
    return FormatCheck(final_format_score, f"wrong answer, invalid format: {valid.reason}")


_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tool_call_format(
    text: str, *, allowed_tools: Sequence[str] | None = None, require_call: bool = True
) -> FormatCheck:
    """1.0 if every `<tool_call>...</tool_call>` holds a JSON object `{"name": str, "arguments": object}`
    (Hermes/Qwen convention; `arguments` may also be a JSON-encoded object string) and names an allowed tool.

    Unclosed or stray tags fail. With `require_call=False`, a response with no tool call scores 1.0.
    """
    opening, closing = text.count("<tool_call>"), text.count("</tool_call>")
    if opening != closing:
        return FormatCheck(0.0, f"unbalanced <tool_call>: {opening} opening vs {closing} closing tags")
    bodies = _TOOL_CALL.findall(text)
    if not bodies:
        return FormatCheck(0.0 if require_call else 1.0, "no tool call")
    for i, body in enumerate(bodies, 1):
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            return FormatCheck(0.0, f"tool call {i}: invalid JSON ({exc.msg} at char {exc.pos})")
        if not isinstance(call, dict):
            return FormatCheck(0.0, f"tool call {i}: expected a JSON object, got {type(call).__name__}")
        name, arguments = call.get("name"), call.get("arguments")
        if not isinstance(name, str) or not name:
            return FormatCheck(0.0, f"tool call {i}: missing or non-string 'name'")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return FormatCheck(0.0, f"tool call {i}: 'arguments' is a string but not JSON")
        if not isinstance(arguments, dict):
            return FormatCheck(0.0, f"tool call {i}: 'arguments' must be an object, got {type(arguments).__name__}")
        if allowed_tools is not None and name not in allowed_tools:
            return FormatCheck(0.0, f"tool call {i}: unknown tool {name!r}; allowed: {sorted(allowed_tools)}")
    return FormatCheck(1.0, f"ok ({len(bodies)} call{'s' if len(bodies) > 1 else ''})")


def overlong_penalty(length: int, *, max_length: int, buffer_length: int, penalty_factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), in [-penalty_factor, 0]:
    0 if length <= max_length - buffer_length, linear down to -penalty_factor at max_length, -penalty_factor beyond.

    The same rule, with the same parameter names, as the trainer's `algorithm.overlong` in rlloom-core-rl
    (`overlong_reward_penalty`, on tensors; the packages do not depend on each other, and a workspace test pins the
    two together), for trainers that shape rewards in the scorer (TRL, veRL).
    """
    if buffer_length <= 0 or buffer_length > max_length:
        raise ValueError(f"buffer_length must be in (0, max_length={max_length}], got {buffer_length}")
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    expected = max_length - buffer_length
    excess = min(max(length - expected, 0), buffer_length)
    return -excess / buffer_length * penalty_factor


def kimi_length_rewards(lengths: Sequence[int], correct: Sequence[bool], *, weight: float = 1.0) -> list[float]:
    """Kimi k1.5's group length reward (arXiv 2501.12599, sec. 2.3.3) for the responses to one prompt.

    lambda = 0.5 - (len - min_len) / (max_len - min_len); a correct response gets lambda, a wrong one
    min(0, lambda): shorter right answers are favoured and long wrong ones punished. All zeros if the group's
    lengths are equal.
    """
    if len(lengths) != len(correct):
        raise ValueError(f"lengths ({len(lengths)}) and correct ({len(correct)}) must have the same length")
    if not lengths:
        return []
    lo, hi = min(lengths), max(lengths)
    if hi == lo:
        return [0.0] * len(lengths)
    out = []
    for n, ok in zip(lengths, correct, strict=True):
        lam = 0.5 - (n - lo) / (hi - lo)
        out.append(weight * (lam if ok else min(0.0, lam)))
    return out


def _result(check: FormatCheck) -> ScoreResult:
    return ScoreResult(score=check.score, details={"reason": check.reason})


def r1_format_scorer(
    response: str, ground_truth: Any = None, *, extra_info: Mapping[str, Any] | None = None
) -> ScoreResult:
    """`Scorer` for `r1_format`; the ground truth is ignored."""
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    return _result(r1_format(text))


def think_boxed_format_scorer(
    response: str, ground_truth: Any = None, *, extra_info: Mapping[str, Any] | None = None
) -> ScoreResult:
    """`Scorer` for `think_boxed_format`; the ground truth is ignored."""
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    return _result(think_boxed_format(text))


def search_r1_format_scorer(
    response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None
) -> ScoreResult:
    """`Scorer` for Search-R1's `qa_em_format` reward; `extra_info` may override the three scores by name."""
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    info = extra_info or {}
    try:
        golds = qa_golds(ground_truth)
    except (TypeError, ValueError) as exc:
        return ScoreResult(score=0.0, error=f"bad ground_truth: {exc}")
    names = ("structure_format_score", "final_format_score", "retrieval_score")
    check = search_r1_format_reward(text, golds, **{k: float(info[k]) for k in names if k in info})
    return _result(check)


def tool_call_scorer(
    response: str, ground_truth: Any = None, *, extra_info: Mapping[str, Any] | None = None
) -> ScoreResult:
    """`Scorer` for `tool_call_format`; `extra_info["tools"]` (list of names) restricts the allowed tools."""
    text = response_text(response)
    if text is None:
        return ScoreResult(score=0.0, error=not_text_error(response))
    tools = plain((extra_info or {}).get("tools"))
    return _result(tool_call_format(text, allowed_tools=tools))


def overlong_scorer(
    response: str, ground_truth: Any = None, *, extra_info: Mapping[str, Any] | None = None
) -> ScoreResult:
    """`Scorer` for `overlong_penalty`. Needs `extra_info` keys `max_length` and `buffer_length` (optional
    `penalty_factor`); the length is `extra_info["response_length"]` (tokens, from the rollout) or, if absent, the
    response's character count.
    """
    info = extra_info or {}
    missing = [k for k in ("max_length", "buffer_length") if k not in info]
    if missing:
        return ScoreResult(score=0.0, error=f"overlong_scorer needs extra_info keys {missing} (token counts)")
    length = int(info.get("response_length", len(response)))
    try:
        penalty = overlong_penalty(
            length,
            max_length=int(info["max_length"]),
            buffer_length=int(info["buffer_length"]),
            penalty_factor=float(info.get("penalty_factor", 1.0)),
        )
    except ValueError as exc:
        return ScoreResult(score=0.0, error=str(exc))
    return ScoreResult(score=penalty, details={"length": length})
