"""ToolEnv through AgentLoop: chat-template turn glue as masked tokens, tool errors as observations."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from rlloom.agent.envs.group import EnvGroup
from rlloom.agent.envs.single_turn import SingleTurnEnv
from rlloom.agent.envs.tool import ToolEnv
from rlloom.agent.loop import AgentLoop, AgentLoopConfig, rollout_metrics
from rlloom.agent.rewards import AgentRubric
from rlloom.agent.tools import Toolset
from rlloom.agent.turns import with_tool_instructions


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: numerator
        b: denominator
    """
    return a / b


def answer_is(response: str, ground_truth: Any, *, extra_info: Any = None) -> float:
    return float(response.strip() == f"<answer>{ground_truth}</answer>")


TURNS = [
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": "3"}}</tool_call>',
    '<tool_call>{"name": "divide", "arguments": {"a": 1, "b": 0}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><tool_call>{not json}</tool_call>',
    "<answer>5</answer>",
]


def scripted(context: str) -> str:
    return TURNS[context.count("<|im_start|>assistant") - 1]


def test_tool_conversation_matches_the_chat_template(tokenizer: Any, replay_engine: Any) -> None:
    toolset = Toolset([add, divide])
    engine = replay_engine(tokenizer, scripted)
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(toolset, AgentRubric(answer_is, tool_use_weight=0.1)))
    [traj] = loop.run([{"question": "What is 2+3?", "answer": "5"}])

    # Independent expectation: the tokenizer's own template over the full message list. The char tokenizer's
    # template ignores `tools`, so the loop put Qwen2.5's tool preamble in a system message.
    messages = with_tool_instructions([{"role": "user", "content": "What is 2+3?"}], toolset.schemas)
    tool_results = [
        ["5"],
        ["Error: divide raised ZeroDivisionError: float division by zero"],
        [
            "Error: invalid arguments for add: b: Missing required argument",
            "Error: tool call is not valid JSON (Expecting property name enclosed in double quotes at position 1):"
            " {not json}",
        ],
    ]
    for turn, results in zip(TURNS, tool_results, strict=False):
        messages.append({"role": "assistant", "content": turn})
        messages += [{"role": "tool", "content": r} for r in results]
    messages.append({"role": "assistant", "content": TURNS[-1]})
    expected = tokenizer.apply_chat_template(messages, tokenize=False)
    full = tokenizer.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False)
    assert full + "\n" == expected  # the template's final "\n" after the last <|im_end|> is not sampled

    # model tokens = the four turns, each with its sampled <|im_end|>; everything else is masked
    sampled = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m], False)
    assert sampled == "".join(t + "<|im_end|>" for t in TURNS)
    masked = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if not m], False)
    assert masked.startswith("\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")

    assert traj.finish_reason == "stop"
    assert traj.metrics["turns"] == 4
    assert traj.metrics["tool_calls"] == 4
    assert traj.metrics["tool_errors"] == 3
    assert traj.metrics["tool_latency_s"] >= 0.0
    assert traj.reward_components == {"outcome": 1.0, "format": pytest.approx(3 / 4), "tool_use": 0.25}
    assert traj.reward == pytest.approx(1.0 + 0.1 * 0.25)
    stats = rollout_metrics([traj])
    assert stats["agent/finish/stop"] == 1.0
    assert stats["agent/tool_errors/mean"] == 3.0


def test_unknown_tool_and_timeout_are_observations(tokenizer: Any, replay_engine: Any) -> None:
    async def slow(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        await asyncio.sleep(seconds)
        return "done"

    calls = [
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "slow", "arguments": {"seconds": 5}}</tool_call>',
        "final",
    ]
    toolset = Toolset([slow], timeout_s=0.05)
    engine = replay_engine(tokenizer, lambda ctx: calls[ctx.count("<|im_start|>assistant") - 1])
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(toolset, AgentRubric(answer_is)))
    [traj] = loop.run([{"question": "q", "answer": "x"}])
    text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    assert "Error: unknown tool 'nope'; available tools: slow" in text
    assert "Error: slow did not finish within 0.05 s" in text
    assert traj.metrics["tool_errors"] == 2
    assert traj.reward == 0.0


@pytest.mark.parametrize("sync_tool", [False, True])
def test_64_conversations_overlap_their_tool_calls(tokenizer: Any, replay_engine: Any, sync_tool: bool) -> None:
    """Each conversation makes 3 calls to a 100 ms tool; all 64 must take a small multiple of one's own time."""

    async def wait_async(ms: int) -> str:
        """Wait.

        Args:
            ms: milliseconds
        """
        await asyncio.sleep(ms / 1000)
        return "ok"

    def wait_sync(ms: int) -> str:
        """Wait.

        Args:
            ms: milliseconds
        """
        time.sleep(ms / 1000)
        return "ok"

    fn = wait_sync if sync_tool else wait_async
    call = json.dumps({"name": fn.__name__, "arguments": {"ms": 100}})

    def script(context: str) -> str:
        return f"<tool_call>{call}</tool_call>" if context.count("<|im_start|>tool") < 3 else "done"

    toolset = Toolset([fn], max_threads=64)
    engine = replay_engine(tokenizer, script, delay_s=0.005)
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(toolset, AgentRubric(answer_is)))
    t0 = time.perf_counter()
    trajs = loop.run([{"question": f"q{i}", "answer": "x"} for i in range(64)])
    total = time.perf_counter() - t0
    slowest_own = max(t.metrics["wall_s"] for t in trajs)
    assert all(t.metrics["tool_calls"] == 3 and t.metrics["tool_errors"] == 0 for t in trajs)
    assert slowest_own >= 0.3
    assert total < 3 * slowest_own  # the sum of the conversations' own times would be > 64 x 0.3 s = 19 s


def test_tool_results_follow_call_order_one_message_per_call(tokenizer: Any, replay_engine: Any) -> None:
    """Hermes tool messages carry no call id: the i-th result must answer the i-th call, malformed ones included."""
    turns = [
        '<tool_call>{not json}</tool_call><tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call><tool_call>{"name": "add", "arguments": '
        '{"a": 1, "b": 1}}</tool_call>',
        "<answer>5</answer>",
    ]
    engine = replay_engine(tokenizer, lambda ctx: turns[ctx.count("<|im_start|>assistant") - 1])
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(Toolset([add]), AgentRubric(answer_is)))
    [traj] = loop.run([{"question": "q", "answer": "5"}])
    results = [chunk.split("<|im_end|>")[0] for chunk in traj.response_text.split("<|im_start|>tool\n")[1:]]
    assert results == [
        "Error: tool call is not valid JSON (Expecting property name enclosed in double quotes at position 1):"
        " {not json}",
        "5",
        "Error: tool call 'add': \"arguments\" must be a JSON object",
        "2",
    ]
    assert traj.metrics["tool_calls"] == 4
    assert traj.metrics["tool_errors"] == 2


# Qwen3's chat template, cut to what a tool conversation uses (tools, the last-query rule that gives only the
# final assistant turn an empty <think></think>, merged <tool_response> turns), as in its tokenizer_config.json.
QWEN3_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and not(message.content.startswith('<tool_response>') "
    "and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}{%- set content = message.content %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{%- set reasoning_content = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' "
    "+ content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_qwen3_template_tool_turns_get_its_tool_response_glue(replay_engine: Any) -> None:
    """Qwen3's template renders a final assistant turn with an empty <think></think> but an earlier one without,
    so the earlier turn's rendering changes once tool results follow; the glue must still come out (it raised)."""
    from rlloom.core_rl.tiny import char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = QWEN3_TEMPLATE
    turns = [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>',
        "<answer>5</answer>",
    ]
    engine = replay_engine(tok, lambda context: turns[context.count("<|im_start|>assistant") - 1])
    loop = AgentLoop(engine, tok, lambda: ToolEnv(Toolset([add]), AgentRubric(answer_is)))
    [traj] = loop.run([{"question": "What is 2+3?", "answer": "5"}])

    response = tok.decode(traj.response_ids, skip_special_tokens=False)
    # hand-written: both results in one user turn, as Qwen3 renders consecutive tool messages
    glue = "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
    assert response == f"{turns[0]}<|im_end|>{glue}<|im_start|>assistant\n{turns[1]}<|im_end|>"
    assert tok.decode(traj.prompt_ids, skip_special_tokens=False).endswith(
        "</tools><|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    sampled = tok.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m], False)
    assert sampled == "".join(t + "<|im_end|>" for t in turns)
    assert traj.finish_reason == "stop" and traj.reward == 1.0 and traj.metrics["tool_errors"] == 0


def test_chat_template_kwargs_reach_the_prompt_and_every_turns_glue(replay_engine: Any) -> None:
    """Qwen3 without thinking (`enable_thinking: false`): its template opens every generation prompt with an empty
    think block; the loop's prompt and its masked turn glue must carry it too, as the template renders them."""
    from rlloom.core_rl.tiny import char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = QWEN3_TEMPLATE.replace(
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
        "{%- endif %}{%- endif %}",
    )
    assert "enable_thinking" in tok.chat_template
    turns = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "<answer>5</answer>"]
    engine = replay_engine(tok, lambda context: turns[context.count("<|im_start|>assistant") - 1])
    config = AgentLoopConfig(chat_template_kwargs={"enable_thinking": False})
    loop = AgentLoop(engine, tok, lambda: ToolEnv(Toolset([add]), AgentRubric(answer_is)), config)
    [traj] = loop.run([{"question": "What is 2+3?", "answer": "5"}])

    empty_think = "<think>\n\n</think>\n\n"
    prompt = tok.decode(traj.prompt_ids, skip_special_tokens=False)
    assert prompt.endswith(f"<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n{empty_think}")
    glue = f"\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n{empty_think}"
    response = tok.decode(traj.response_ids, skip_special_tokens=False)
    assert response == f"{turns[0]}<|im_end|>{glue}{turns[1]}<|im_end|>"
    sampled = tok.decode([t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m], False)
    assert sampled == "".join(t + "<|im_end|>" for t in turns)  # the think blocks are template glue, mask 0
    with pytest.raises(ValueError, match="tokenize cannot be set there"):
        AgentLoopConfig(chat_template_kwargs={"tokenize": True})


def test_a_template_without_a_tool_role_names_the_tool_role_fix(replay_engine: Any) -> None:
    """Mistral/Gemma-style templates raise on a `tool` message; the error must say which roles and what to pass,
    and `tool_role="user"` must then work."""
    from rlloom.core_rl.tiny import CHATML_TEMPLATE, char_tokenizer

    tok = char_tokenizer()
    tok.chat_template = (
        "{%- for m in messages %}{%- if m.role not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('Only user and assistant roles are supported!') }}{%- endif %}{%- endfor %}"
        + CHATML_TEMPLATE
    )
    turns = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "<answer>5</answer>"]
    engine = replay_engine(tok, lambda context: turns[context.count("<|im_start|>assistant") - 1])
    toolset = Toolset([add])
    loop = AgentLoop(engine, tok, lambda: ToolEnv(toolset, AgentRubric(answer_is)))
    with pytest.raises(ValueError, match=r"roles 'tool' .*Only user and assistant.*tool_role='user'"):
        loop.run([{"question": "2+3?", "answer": "5"}])
    as_user = AgentLoop(engine, tok, lambda: ToolEnv(toolset, AgentRubric(answer_is), tool_role="user"))
    [traj] = as_user.run([{"question": "2+3?", "answer": "5"}])
    assert "<|im_start|>user\n5<|im_end|>" in tok.decode(traj.response_ids, skip_special_tokens=False)
    assert traj.reward == 1.0


def test_a_batch_without_tool_calls_reports_zero_calls(tokenizer: Any, replay_engine: Any) -> None:
    # the counters are logged as 0 when no conversation called a tool, not left out of the metrics
    engine = replay_engine(tokenizer, lambda ctx: "It is 5.")
    loop = AgentLoop(engine, tokenizer, lambda: ToolEnv(Toolset([add]), AgentRubric(answer_is)))
    trajectories = loop.run([{"question": "2+3?", "answer": "5"}], n=2)
    assert [t.metrics["tool_calls"] for t in trajectories] == [0.0, 0.0]
    metrics = rollout_metrics(trajectories)
    assert (metrics["agent/tool_calls/mean"], metrics["agent/tool_errors/mean"]) == (0.0, 0.0)


def test_env_group_routes_each_sample_to_its_environment(tokenizer: Any, replay_engine: Any) -> None:
    """A mixed batch: 'calc' rows get the tool environment (tool preamble, tool turns, tool-use reward), 'plain'
    rows a single-turn one; each trajectory is scored by its own environment's rubric."""

    def script(context: str) -> str:
        if "# Tools" not in context:
            return "<answer>7</answer>"
        return TURNS[0] if context.count("<|im_start|>assistant") == 1 else "<answer>5</answer>"

    engine = replay_engine(tokenizer, script)
    makers = {
        "calc": lambda: ToolEnv(Toolset([add]), AgentRubric(answer_is, tool_use_weight=0.1)),
        "plain": lambda: SingleTurnEnv(AgentRubric(answer_is)),
    }
    loop = AgentLoop(engine, tokenizer, lambda: EnvGroup(makers))
    rows = [
        {"question": "What is 2+3?", "answer": "5", "data_source": "calc"},
        {"question": "What is 3+4?", "answer": "7", "data_source": "plain"},
    ]
    calc, plain = loop.run(rows)
    assert "# Tools" in tokenizer.decode(calc.prompt_ids) and "# Tools" not in tokenizer.decode(plain.prompt_ids)
    assert (calc.metrics["turns"], calc.metrics["tool_calls"], plain.metrics["turns"]) == (2, 1, 1)
    assert calc.reward_components == {"outcome": 1.0, "format": 1.0, "tool_use": 1.0}
    assert calc.reward == pytest.approx(1.1)  # outcome + 0.1 x tool use: the calc rubric
    assert plain.reward_components["tool_use"] == 0.0 and plain.reward == 1.0  # no tool call, no tool weight
    with pytest.raises(ValueError, match=r"sample field 'data_source' is 'code', which names no environment"):
        loop.run([{"question": "q", "answer": "a", "data_source": "code"}])
