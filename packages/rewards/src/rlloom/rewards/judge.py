"""LLM-as-judge over any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, rlloom's rollout server, ...).

A rubric prompt asks the judge model to compare a response with the reference answer and end with a verdict
line ("VERDICT: CORRECT/INCORRECT", or "SCORE: n" out of 10); `parse_verdict` reads the LAST such line, and
anything else scores 0 with the reason in `error` (never a silent 1). Requests go through httpx with a timeout,
retries with exponential backoff on timeouts, connection errors, 429 and 5xx, a concurrency limit, and a cache
keyed by the full request (model, messages, sampling parameters), in memory and optionally on disk, so
re-scoring the same rollouts costs nothing. Empty responses are never sent: judges are easily fooled by
content-free answers ("One Token to Fool LLM-as-a-Judge", arXiv 2507.08794).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from rlloom.rewards.http_retry import RetriesExhaustedError, post_with_retries
from rlloom.rewards.scorer_inputs import not_text_error, plain, response_text
from rlloom.rewards.types import ScoreResult

BINARY_PROMPT = """You are grading an answer against a reference answer.

Question: {question}

Reference answer: {reference}

Response to grade: {response}

Decide whether the response's final answer means the same as the reference answer. Ignore formatting,
wording and extra explanation; a response that hedges between several answers, refuses, or gives no final
answer is incorrect. Think briefly, then end with exactly one line: "VERDICT: CORRECT" or "VERDICT: INCORRECT"."""

SCORE_PROMPT = """You are grading a response against a reference answer and a rubric.

Question: {question}

Reference answer: {reference}

Rubric: {rubric}

Response to grade: {response}

Judge how well the response satisfies the rubric and agrees with the reference. Think briefly, then end with
exactly one line "SCORE: n", where n is an integer from 0 (worst) to 10 (best)."""

_VERDICT = re.compile(r"VERDICT\s*[:=]\s*[*_`\"']*\s*(CORRECT|INCORRECT)\b", re.IGNORECASE)
_SCORE = re.compile(r"SCORE\s*[:=]\s*[*_`\"']*\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*10\b)?", re.IGNORECASE)


class JudgeConfig(BaseModel):
    """Where the judge lives and how to ask it."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="OpenAI-compatible API root, e.g. 'http://127.0.0.1:8000/v1'.")
    model: str = Field(description="Model name sent in each request.")
    api_key: str | None = Field(default=None, description="Bearer token; None reads api_key_env, else no auth.")
    api_key_env: str = Field(default="OPENAI_API_KEY", description="Environment variable holding the key.")
    mode: Literal["binary", "score"] = Field(default="binary", description="VERDICT line (1/0) or SCORE 0-10 (/10).")
    prompt_template: str | None = Field(
        default=None, description="Overrides the mode's prompt; fields {question} {reference} {response} {rubric}."
    )
    rubric: str = Field(default="Correctness and completeness.", description="Filled into {rubric} (score mode).")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature (0 = repeatable verdicts).")
    max_tokens: int = Field(default=512, gt=0, description="Upper bound on the judge's reply length.")
    timeout: float = Field(default=60.0, gt=0, description="Seconds per HTTP attempt.")
    max_retries: int = Field(
        default=3, ge=0, description="Extra attempts after a timeout, connection error, 429 or 5xx."
    )
    backoff: float = Field(default=0.5, ge=0, description="First retry delay in seconds; doubles each retry.")
    max_concurrency: int = Field(default=32, gt=0, description="Requests in flight at once per event loop.")
    max_response_chars: int = Field(
        default=20_000, gt=0, description="Longer responses are cut to their first and last halves of this size."
    )
    cache_dir: Path | None = Field(default=None, description="Also cache replies as JSON files here.")


class JudgeError(RuntimeError):
    """The endpoint could not produce a reply after all retries (message says what happened last)."""


def parse_verdict(text: str, mode: Literal["binary", "score"] = "binary") -> tuple[float, str | None]:
    """(score, error) from a judge reply: the last VERDICT line (1.0/0.0) or the last SCORE n (n/10)."""
    if mode == "binary":
        matches = _VERDICT.findall(text)
        if not matches:
            return 0.0, "judge reply has no 'VERDICT: CORRECT/INCORRECT' line"
        return (1.0 if matches[-1].upper() == "CORRECT" else 0.0), None
    scores = _SCORE.findall(text)
    if not scores:
        return 0.0, "judge reply has no 'SCORE: n' line"
    value = float(scores[-1])
    if not 0 <= value <= 10:
        return 0.0, f"judge score {value:g} is outside 0-10"
    return value / 10, None


def cut_middle(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters by dropping its middle: a long chain of thought puts its final
    answer at the end, so keeping only the head would show the judge a response with no answer."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]} [... {len(text) - limit} characters cut ...] {text[-tail:]}"


def cache_key(payload: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON request: same model, messages and parameters give the same key."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _reference_text(ground_truth: Any) -> str:
    """A string, a list of accepted aliases ("a OR b") or Search-R1's {"target": [...]}; else its JSON.
    Parquet rows hold numpy arrays of aliases, made plain first so the judge never sees "['a' 'b']"."""
    ground_truth = plain(ground_truth)
    if isinstance(ground_truth, Mapping) and "target" in ground_truth:
        ground_truth = ground_truth["target"]
    if isinstance(ground_truth, str):
        return ground_truth
    if isinstance(ground_truth, list | tuple) and all(isinstance(g, str) for g in ground_truth):
        return " OR ".join(ground_truth)
    return json.dumps(ground_truth, ensure_ascii=False, default=str)


class LLMJudge:
    """An async `Scorer` backed by a chat-completions endpoint; `ground_truth` is the reference answer.

    `extra_info` may carry "question" (and "rubric" in score mode). Reuse one judge across calls to share its
    cache and connections.
    """

    def __init__(self, config: JudgeConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._memory: dict[str, str] = {}
        self._per_loop: dict[int, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}
        self.stats = {"requests": 0, "retries": 0, "cache_hits": 0}

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        # httpx clients and semaphores belong to one event loop; batch workers run a fresh loop per item
        loop_id = id(asyncio.get_running_loop())
        if loop_id not in self._per_loop:
            key = self.config.api_key or os.environ.get(self.config.api_key_env)
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            client = httpx.AsyncClient(
                base_url=self.config.base_url.rstrip("/"), headers=headers, timeout=self.config.timeout,
                transport=self._transport,
            )  # fmt: skip
            self._per_loop = {loop_id: (client, asyncio.Semaphore(self.config.max_concurrency))}
        return self._per_loop[loop_id]

    def _disk_path(self, key: str) -> Path | None:
        return self.config.cache_dir / f"{key}.json" if self.config.cache_dir else None

    def _cached(self, key: str) -> str | None:
        if key in self._memory:
            return self._memory[key]
        path = self._disk_path(key)
        if path is not None and path.is_file():
            try:
                reply = json.loads(path.read_text(encoding="utf-8"))["reply"]
            except (OSError, ValueError, KeyError):
                return None  # a torn or foreign file: ask again and overwrite it
            self._memory[key] = reply
            return str(reply)
        return None

    def _store(self, key: str, reply: str) -> None:
        self._memory[key] = reply
        path = self._disk_path(key)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"reply": reply}), encoding="utf-8")
            tmp.replace(path)  # atomic: concurrent workers never read half a file

    async def complete(self, messages: list[dict[str, str]]) -> tuple[str, bool]:
        """The judge's reply text for `messages` and whether it came from the cache."""
        payload = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": self.config.max_tokens,
        }
        key = cache_key(payload)
        cached = self._cached(key)
        if cached is not None:
            self.stats["cache_hits"] += 1
            return cached, True
        client, limit = self._client()
        async with limit:
            try:
                response = await post_with_retries(
                    client,
                    "/chat/completions",
                    json=payload,
                    max_retries=self.config.max_retries,
                    backoff=self.config.backoff,
                    timeout=self.config.timeout,
                    stats=self.stats,
                )
            except RetriesExhaustedError as exc:
                raise JudgeError(f"judge failed after {exc.attempts} attempts; last: {exc.last}") from None
            if response.status_code >= 400:
                raise JudgeError(
                    f"judge endpoint refused the request: HTTP {response.status_code}: {response.text[:300]}"
                )
            try:
                reply = response.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                raise JudgeError(f"judge reply is not a chat completion ({exc!r}): {response.text[:300]}") from exc
            if not isinstance(reply, str):
                raise JudgeError(f"judge reply content is {type(reply).__name__}, expected text")
            self._store(key, reply)
            return reply, False

    def build_messages(
        self, response: str, reference: str, *, question: str = "", rubric: str | None = None
    ) -> list[dict[str, str]]:
        """The chat messages sent for one grading request."""
        template = self.config.prompt_template or (BINARY_PROMPT if self.config.mode == "binary" else SCORE_PROMPT)
        text = template.format(
            question=question or "(not given)", reference=reference, response=response,
            rubric=rubric or self.config.rubric,
        )  # fmt: skip
        return [{"role": "user", "content": text}]

    async def __call__(
        self, response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None
    ) -> ScoreResult:
        info = extra_info or {}
        text = response_text(response)
        if text is None:
            return ScoreResult(score=0.0, error=not_text_error(response))
        if not text.strip():
            return ScoreResult(score=0.0, error="empty response; not sent to the judge")
        truncated = len(text) > self.config.max_response_chars
        body = cut_middle(text, self.config.max_response_chars)
        reference = _reference_text(ground_truth)
        messages = self.build_messages(
            body, reference, question=str(info.get("question", "")), rubric=info.get("rubric")
        )
        try:
            reply, cached = await self.complete(messages)
        except JudgeError as exc:
            return ScoreResult(score=0.0, error=str(exc), details={"error_kind": "judge"})
        score, error = parse_verdict(reply, self.config.mode)
        details = {"reply": reply[-500:], "cached": cached, "truncated": truncated}
        return ScoreResult(score=score, error=error, details=details)

    async def aclose(self) -> None:
        """Close the HTTP client of the current event loop."""
        for client, _ in self._per_loop.values():
            await client.aclose()
        self._per_loop.clear()
