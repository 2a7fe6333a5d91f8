"""Format rewards against hand-worked cases, Search-R1's published reward table and DAPO's formula."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlloom.rewards.format import (
    kimi_length_rewards,
    overlong_penalty,
    overlong_scorer,
    r1_format,
    r1_format_scorer,
    search_r1_format_reward,
    search_r1_sequence,
    tool_call_format,
)


@pytest.mark.parametrize(
    ("text", "score", "reason"),
    [
        ("<think>2+2 is 4</think>\n<answer>4</answer>", 1.0, "ok"),
        ("  <think>a\nb</think><answer>4</answer>\n", 1.0, "ok"),
        ("<think></think><answer>4</answer>", 0.0, "empty <think>"),  # the empty-think hack
        ("<think>x</think><answer> </answer>", 0.0, "empty <answer>"),
        ("<answer>4</answer><think>x</think>", 0.0, "out of order"),
        ("<think>x</think><answer>4</answer> trailing", 0.0, "outside"),
        ("<think>x</think><think>y</think><answer>4</answer>", 0.0, "exactly one <think>, found 2"),
        ("The answer is 4", 0.0, "found 0"),
    ],
)
def test_r1_format(text: str, score: float, reason: str) -> None:
    check = r1_format(text)
    assert check.score == score and reason in check.reason
    assert r1_format_scorer(text).details["reason"] == check.reason


VALID = (
    "<think>I need the capital.</think>\n<search>capital of France</search>\n"
    "<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n"
    "<think>It is Paris.</think>\n<answer>Paris</answer>"
)


@pytest.mark.parametrize(
    ("text", "valid", "reason"),
    [
        (VALID, True, "ok"),
        ("<think>easy</think><answer>Paris</answer>", True, "ok"),
        ("<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n" + VALID, True, "ok"),
        (
            "<search>q</search><information>d</information><think>t</think><answer>a</answer>",
            False,
            "<search> in state start",
        ),
        ("<think>t</think> so <answer>a</answer>", False, "unexpected text 'so'"),
        (
            "<think>t</think><search>q</search><think>t</think><answer>a</answer>",
            False,
            "<think> in state after_search",
        ),
        ("<think>t</think><search>q</search><information>d</information>", False, "ended in state information"),
        ("<think>t</think><answer>a", False, "unbalanced <answer>"),
    ],
)
def test_search_r1_sequence(text: str, valid: bool, reason: str) -> None:
    check = search_r1_sequence(text)
    assert check.score == float(valid) and reason in check.reason, check


def test_search_r1_reward_table() -> None:
    # Search-R1 qa_em_format: correct+valid 1, correct+invalid 0.8, wrong+valid 0.2, wrong+invalid 0.1, none+invalid 0
    assert search_r1_format_reward(VALID, ["paris"]).score == 1.0
    assert search_r1_format_reward("Sure. <answer>Paris</answer>", ["paris"]).score == pytest.approx(0.8)
    assert search_r1_format_reward(VALID.replace("<answer>Paris", "<answer>Lyon"), ["paris"]).score == 0.2
    assert search_r1_format_reward("<answer>Lyon</answer> oops", ["paris"]).score == 0.1
    assert search_r1_format_reward("no tags at all", ["paris"]).score == 0.0
    wrong_but_retrieved = VALID.replace("<answer>Paris", "<answer>Lyon")
    assert search_r1_format_reward(wrong_but_retrieved, ["paris"], retrieval_score=0.1).score == pytest.approx(0.3)


def test_search_r1_retrieval_bonus_is_judged_block_by_block() -> None:
    # Search-R1's is_retrieval_correct tests each <information> block alone: a gold split across two blocks
    # ("... New" | "York ...") was never retrieved, so the bonus is not paid.
    split = (
        "<think>t</think><search>q1</search><information>Doc 1: he moved to New</information>"
        "<think>t</think><search>q2</search><information>York Times is a paper</information>"
        "<think>t</think><answer>Boston</answer>"
    )
    assert search_r1_sequence(split).score == 1.0
    assert search_r1_format_reward(split, ["New York"], retrieval_score=0.1).score == pytest.approx(0.2)
    whole = split.replace("moved to New", "moved to New York")
    assert search_r1_format_reward(whole, ["New York"], retrieval_score=0.1).score == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("text", "score", "reason"),
    [
        ('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', 1.0, "ok (1 call)"),
        (
            '<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>',
            1.0,
            "2 calls",
        ),
        ('<tool_call>{"name": "search", "arguments": {"q": }}</tool_call>', 0.0, "invalid JSON"),
        ('<tool_call>["search"]</tool_call>', 0.0, "expected a JSON object, got list"),
        ('<tool_call>{"arguments": {}}</tool_call>', 0.0, "'name'"),
        ('<tool_call>{"name": "s", "arguments": [1]}</tool_call>', 0.0, "'arguments' must be an object"),
        ('<tool_call>{"name": "s", "arguments": {}}', 0.0, "unbalanced"),
        ("just text", 0.0, "no tool call"),
    ],
)
def test_tool_call_format(text: str, score: float, reason: str) -> None:
    check = tool_call_format(text)
    assert check.score == score and reason in check.reason, check


def test_tool_call_allowed_tools_and_optional_call() -> None:
    call = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    assert "unknown tool 'rm'" in tool_call_format(call, allowed_tools=["search"]).reason
    assert tool_call_format("final answer", require_call=False).score == 1.0


def test_overlong_penalty_hand_values() -> None:
    # L_max = 100, L_cache = 20: free up to 80, then linear to -1 at 100, -1 beyond
    values = [overlong_penalty(n, max_length=100, buffer_length=20) for n in (0, 80, 81, 90, 100, 101, 500)]
    assert values == pytest.approx([0.0, 0.0, -0.05, -0.5, -1.0, -1.0, -1.0])
    with pytest.raises(ValueError, match="buffer_length"):
        overlong_penalty(5, max_length=10, buffer_length=20)


@given(n=st.integers(0, 30_000), max_length=st.integers(1, 20_480), frac=st.floats(0.01, 1.0))
def test_overlong_matches_dapo_equation(n: int, max_length: int, frac: float) -> None:
    cache = max(1, int(max_length * frac))
    # DAPO eq. 13, written out independently
    if n <= max_length - cache:
        expected = 0.0
    elif n <= max_length:
        expected = ((max_length - cache) - n) / cache
    else:
        expected = -1.0
    got = overlong_penalty(n, max_length=max_length, buffer_length=cache)
    assert got == pytest.approx(expected) and -1.0 <= got <= 0.0


def test_overlong_scorer_needs_its_settings() -> None:
    assert overlong_scorer("x" * 90, extra_info={"max_length": 100, "buffer_length": 20}).score == pytest.approx(-0.5)
    assert (
        overlong_scorer("x", extra_info={"max_length": 100, "buffer_length": 20, "response_length": 100}).score == -1.0
    )
    missing = overlong_scorer("x", extra_info={"max_length": 100})
    assert missing.error and "buffer_length" in missing.error


def test_kimi_length_rewards_hand_values() -> None:
    # lengths 10/20/30 -> lambda 0.5 / 0 / -0.5; wrong answers get min(0, lambda)
    assert kimi_length_rewards([10, 20, 30], [True, False, True]) == pytest.approx([0.5, 0.0, -0.5])
    assert kimi_length_rewards([10, 20, 30], [False, True, False]) == pytest.approx([0.0, 0.0, -0.5])
    assert kimi_length_rewards([7, 7], [True, False]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="same length"):
        kimi_length_rewards([1], [True, False])


_TAGGY = st.lists(
    st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "<search>", "</search>", "<information>",
                     "</information>", "<tool_call>", "</tool_call>", "{", "}", '"name"', ":", "x", " ", "\udcff"]),
    max_size=30,
).map("".join)  # fmt: skip


@given(text=st.one_of(_TAGGY, st.text(max_size=200)))
def test_checks_never_raise_and_stay_in_range(text: str) -> None:
    for check in (r1_format(text), search_r1_sequence(text), tool_call_format(text)):
        assert check.score in (0.0, 1.0) and check.reason
    assert 0.0 <= search_r1_format_reward(text, ["x"]).score <= 1.0


def test_huge_response_is_fast() -> None:
    import time

    text = "<think>" + "a" * 1_000_000 + "</think><answer>" + "b" * 1_000_000 + "</answer>"
    start = time.monotonic()
    assert r1_format(text).score == 1.0 and search_r1_sequence(text).score == 1.0
    assert tool_call_format(text).reason == "no tool call"
    assert time.monotonic() - start < 5.0
