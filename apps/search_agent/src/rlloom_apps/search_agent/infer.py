"""`search-agent infer`: ask a search agent questions and show each conversation (Search-R1's infer.py).

The question goes into Search-R1's prompt, the model searches through the given retriever, and the whole
assistant side is printed (its turns with the `<information>` blocks between them), then its answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlloom_apps.search_agent.data import search_r1_prompt
from rlloom_apps.search_agent.evaluate import EvalSettings, model_text

from rlloom.agent import AgentLoop, SearchEnv, SearchEnvConfig
from rlloom.rewards.qa import extract_tagged_answer


@dataclass(slots=True)
class Answered:
    question: str
    answer: str | None  # the last <answer> the model wrote; None if it never answered
    searches: int
    turns: int
    finish_reason: str
    transcript: str  # the assistant side: the model's turns and the observations between them


async def ask(
    engine: Any, tokenizer: Any, questions: Sequence[str], retriever: Any, settings: EvalSettings
) -> list[Answered]:
    """One conversation per question, all at once; the same protocol `search-agent eval --method search` uses."""
    if not questions or not all(q.strip() for q in questions):
        raise ValueError("give at least one non-empty question")
    config = settings.loop_config(compute_reward=False).model_copy(update={"progress": False})
    env_config = SearchEnvConfig(top_k=settings.top_k)
    loop = AgentLoop(engine, tokenizer, lambda: SearchEnv(retriever, None, env_config), config)
    rows = [{"prompt": [{"role": "user", "content": search_r1_prompt(q)}]} for q in questions]
    out = []
    for question, traj in zip(questions, await loop.arun(rows), strict=True):
        out.append(
            Answered(
                question=question,
                answer=extract_tagged_answer(model_text(traj, tokenizer)),
                searches=int(traj.metrics.get("searches", 0)),
                turns=int(traj.metrics["turns"]),
                finish_reason=traj.finish_reason,
                transcript=tokenizer.decode(traj.response_ids, skip_special_tokens=True),
            )
        )
    return out
