"""A reward server you already run, over HTTP, as a trainer reward: OpenRLHF's `--remote_rm_url` protocol.

Samples go out in batches of `batch_size`, one JSON POST per batch and `max_concurrency` batches in flight. The
default body is OpenRLHF's: `{"query": [prompt + response, ...], "prompts": [...], "labels": [...]}`; the reply
must hold `"rewards"`, one number per sample in the order sent, and may hold `"scores"` and `"extra_logs"`
(`{name: one value per sample}`), whose numbers become `components`. Key names are configurable.

Timeouts, connection errors, 429 and 5xx are retried with exponential backoff (a `Retry-After` header sets the
wait). Any other failure, or a reply that does not fit its batch (not JSON, a field missing, the wrong number of
values), fails the whole batch with an error naming the URL and the field, so a reward is never dropped or given
to the wrong sample; a reward that is not a finite number fails only its own sample. Failed samples score 0 with
`error` set (or raise `RemoteRewardError`, with `on_error="raise"`). No torch: the requests are plain text.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlloom.rewards.http_retry import RetriesExhaustedError, post_with_retries
from rlloom.rewards.scorer_inputs import not_text_error, plain, response_text
from rlloom.rewards.types import ScoreResult


class RemoteRewardConfig(BaseModel):
    """Where the reward server is, how to batch and retry, and the names of the protocol's fields."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="The endpoint POSTed to, e.g. 'http://127.0.0.1:5000/get_reward'.")
    batch_size: int = Field(default=64, gt=0, description="Samples per POST.")
    max_concurrency: int = Field(default=4, gt=0, description="POSTs in flight at once.")
    timeout: float = Field(default=180.0, gt=0, description="Seconds per HTTP attempt (OpenRLHF's 180).")
    max_retries: int = Field(
        default=4, ge=0, description="Extra attempts after a timeout, connection error, 429 or 5xx (5 in all)."
    )
    backoff: float = Field(default=1.0, ge=0, description="First retry delay in seconds; doubles each retry.")
    max_backoff: float = Field(default=60.0, ge=0, description="Cap on any one wait, Retry-After included.")
    query: Literal["prompt+response", "response"] = Field(
        default="prompt+response", description="What each query is: OpenRLHF's full sequence, or the response only."
    )
    query_key: str = Field(default="query", description="Request field holding the queries.")
    prompts_key: str | None = Field(default="prompts", description="Request field for the prompts; None: not sent.")
    labels_key: str | None = Field(default="labels", description="Request field for the labels; None: not sent.")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Merged into every request body.")
    reward_key: str = Field(default="rewards", description="Reply field with one reward per sample.")
    score_key: str | None = Field(default="scores", description="Optional reply field reported as a component.")
    extra_key: str | None = Field(default="extra_logs", description="Optional reply field {name: per-sample values}.")
    component_prefix: str = Field(default="", description="Prepended to every component name.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers.")
    api_key_env: str | None = Field(default=None, description="Environment variable with a Bearer token, if any.")
    on_error: Literal["zero", "raise"] = Field(
        default="zero", description="A failed batch scores 0 with `error` set, or raises RemoteRewardError."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {value!r}")
        return value


class RemoteSample(BaseModel):
    """One sample to score when the caller has no trajectories: the prompt, the response and the label."""

    model_config = ConfigDict(extra="forbid")

    response: str = Field(description="The model's output text.")
    prompt: str = Field(default="", description="The prompt as the policy saw it (chat template applied).")
    label: Any = Field(default=None, description="The ground truth, sent as the sample's label.")


class RemoteRewardError(RuntimeError):
    """A batch could not be scored: the server failed after all retries, refused, or replied out of protocol."""


@dataclass(slots=True)
class _Prepared:
    index: int
    query: str
    prompt: str
    label: Any


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: keep the text ones
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return str(content)


def default_prompt(trajectory: Any) -> str:
    """A trajectory's prompt text: `prompt_text` when kept, else its chat messages' text joined by newlines."""
    text = getattr(trajectory, "prompt_text", "") or ""
    if text:
        return str(text)
    messages = getattr(trajectory, "prompt_messages", None) or []
    return "\n".join(_message_text(m) for m in messages if isinstance(m, Mapping))


def _number(value: Any, *, allow_bool: bool) -> float | None:
    """`value` as a float when it is a JSON number (and, with allow_bool, true/false), else None."""
    if isinstance(value, bool):
        return float(value) if allow_bool else None
    if not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range
        return math.inf if value > 0 else -math.inf


def _error(message: str, kind: str = "remote") -> ScoreResult:
    return ScoreResult(score=0.0, error=message, details={"error_kind": kind})


class RemoteReward:
    """A trainer `reward_fn` (and an async scorer) backed by an HTTP reward server.

    `reward(trajectories)` and `await reward.ascore(trajectories)` return one `ScoreResult` per input, in order.
    Inputs are trajectory-like objects (`response_text`, `ground_truth`, `prompt_text` / `prompt_messages`),
    `RemoteSample`s or dicts of its fields. `prompt_renderer(trajectory) -> str` overrides how a trajectory's
    prompt is written (e.g. with the policy tokenizer's chat template, to send exactly the sequence OpenRLHF
    would). `await reward.score_response(response, ground_truth, extra_info=...)` is the `Scorer` form (the
    prompt from `extra_info["prompt"]`), so a remote reward can be a `Rubric` term.
    """

    def __init__(
        self,
        config: RemoteRewardConfig | Mapping[str, Any] | str,
        *,
        prompt_renderer: Callable[[Any], str] | None = None,
    ) -> None:
        if isinstance(config, str):
            config = RemoteRewardConfig(url=config)
        elif not isinstance(config, RemoteRewardConfig):
            config = RemoteRewardConfig.model_validate(dict(config))
        self.config = config
        self.prompt_renderer = prompt_renderer
        self.stats = {"requests": 0, "retries": 0, "failed_batches": 0}

    # ------------------------------------------------------------------------------------------------ entry points
    def __call__(self, trajectories: Sequence[Any]) -> list[ScoreResult]:
        """Score synchronously (on a private event loop; in a helper thread if this one already runs a loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.ascore(trajectories))
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, self.ascore(trajectories)).result()

    async def ascore(self, samples: Sequence[Any]) -> list[ScoreResult]:
        """Score every sample: `batch_size` per POST, `max_concurrency` POSTs at a time; results in input order."""
        results: list[ScoreResult | None] = [None] * len(samples)
        prepared: list[_Prepared] = []
        for i, sample in enumerate(samples):
            item = self._prepare(sample, i)
            if isinstance(item, ScoreResult):
                results[i] = item
            else:
                prepared.append(item)
        size = self.config.batch_size
        batches = [prepared[k : k + size] for k in range(0, len(prepared), size)]
        if batches:
            limit = asyncio.Semaphore(self.config.max_concurrency)
            async with httpx.AsyncClient(timeout=self.config.timeout, headers=self._headers()) as client:

                async def run(batch: list[_Prepared]) -> None:
                    async with limit:
                        try:
                            scored = await self._score_batch(client, batch)
                        except RemoteRewardError as exc:
                            self.stats["failed_batches"] += 1
                            if self.config.on_error == "raise":
                                raise
                            scored = [_error(str(exc)) for _ in batch]
                    for item, result in zip(batch, scored, strict=True):
                        results[item.index] = result

                try:
                    async with asyncio.TaskGroup() as group:
                        for batch in batches:
                            group.create_task(run(batch))
                except BaseExceptionGroup as failed:
                    first = next((e for e in failed.exceptions if isinstance(e, RemoteRewardError)), None)
                    if first is not None:
                        raise first from None
                    raise
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:  # cannot happen: every prepared sample is in exactly one batch
            raise RuntimeError(f"internal: samples {missing[:10]} were never scored")
        return [r for r in results if r is not None]

    async def score_response(
        self, response: str, ground_truth: Any, *, extra_info: Mapping[str, Any] | None = None
    ) -> ScoreResult:
        """The `Scorer` protocol: one sample in a one-sample batch; the prompt is `extra_info["prompt"]`."""
        text = response_text(response)
        if text is None:
            return _error(not_text_error(response), "input")
        prompt = str((extra_info or {}).get("prompt", ""))
        return (await self.ascore([RemoteSample(response=text, prompt=prompt, label=ground_truth)]))[0]

    # ---------------------------------------------------------------------------------------------------- inputs
    def _prepare(self, sample: Any, index: int) -> _Prepared | ScoreResult:
        if isinstance(sample, Mapping):
            try:
                sample = RemoteSample.model_validate(dict(sample))
            except ValidationError as exc:
                raise ValueError(f"samples[{index}] is invalid: {exc}") from exc
        if isinstance(sample, RemoteSample):
            response, prompt, label = sample.response, sample.prompt, sample.label
        elif hasattr(sample, "response_text"):
            text = response_text(sample.response_text)
            if text is None:
                return _error(not_text_error(sample.response_text), "input")
            renderer = self.prompt_renderer or default_prompt
            response, prompt, label = text, renderer(sample), getattr(sample, "ground_truth", None)
        else:
            raise TypeError(
                f"samples[{index}] is a {type(sample).__name__}; give trajectories (with response_text), "
                "RemoteSample objects or dicts with 'response', 'prompt', 'label'"
            )
        query = prompt + response if self.config.query == "prompt+response" else response
        return _Prepared(index=index, query=query, prompt=prompt, label=plain(label))

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **self.config.headers}
        if self.config.api_key_env:
            key = os.environ.get(self.config.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        return headers

    def body(self, batch: Sequence[_Prepared]) -> dict[str, Any]:
        """The JSON body POSTed for `batch`."""
        cfg = self.config
        body: dict[str, Any] = dict(cfg.extra_body)
        body[cfg.query_key] = [p.query for p in batch]
        if cfg.prompts_key:
            body[cfg.prompts_key] = [p.prompt for p in batch]
        if cfg.labels_key:
            body[cfg.labels_key] = [p.label for p in batch]
        return body

    # -------------------------------------------------------------------------------------------------- transport
    async def _post(self, client: httpx.AsyncClient, payload: bytes) -> Any:
        """The decoded JSON reply, after retrying timeouts, connection errors, 429 and 5xx."""
        cfg = self.config
        try:
            response = await post_with_retries(
                client,
                cfg.url,
                content=payload,
                max_retries=cfg.max_retries,
                backoff=cfg.backoff,
                max_backoff=cfg.max_backoff,
                timeout=cfg.timeout,
                stats=self.stats,
                honour_retry_after=True,
            )
        except RetriesExhaustedError as exc:
            raise RemoteRewardError(f"{cfg.url}: {exc}") from None
        status = response.status_code
        if not response.is_success:
            raise RemoteRewardError(f"{cfg.url}: HTTP {status} (not retried): {response.text[:300]}")
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content-type")
            raise RemoteRewardError(
                f"{cfg.url}: the reply is not JSON (HTTP {status}, {kind}): {response.text[:200]!r}"
            ) from None

    async def _score_batch(self, client: httpx.AsyncClient, batch: list[_Prepared]) -> list[ScoreResult]:
        payload = json.dumps(self.body(batch), ensure_ascii=False, default=str).encode("utf-8")
        reply = await self._post(client, payload)
        return self.parse_reply(reply, [p.index for p in batch])

    # ------------------------------------------------------------------------------------------------------ reply
    def parse_reply(self, reply: Any, indices: Sequence[int]) -> list[ScoreResult]:
        """One result per sample of a batch (`indices`: their positions in the call) from the decoded reply.

        Raises `RemoteRewardError` when the reply as a whole does not fit the batch."""
        cfg = self.config
        url, n = cfg.url, len(indices)
        if not isinstance(reply, Mapping):
            raise RemoteRewardError(f"{url}: the reply is a JSON {type(reply).__name__}, expected an object")
        rewards = self._column(reply, cfg.reward_key, n, cfg.reward_key)
        extras: dict[str, list[Any]] = {}
        batch_level: dict[str, Any] = {}
        if cfg.extra_key and reply.get(cfg.extra_key) is not None:
            logs = reply[cfg.extra_key]
            if not isinstance(logs, Mapping):
                raise RemoteRewardError(
                    f"{url}: {cfg.extra_key!r} is a JSON {type(logs).__name__}, expected an object {{name: values}}"
                )
            for name, values in logs.items():
                if isinstance(values, list):
                    extras[str(name)] = self._column(logs, name, n, f"{cfg.extra_key}.{name}")
                elif n == 1:
                    extras[str(name)] = [values]
                else:
                    batch_level[str(name)] = values  # one value for the whole batch: not any one sample's
        if cfg.score_key and reply.get(cfg.score_key) is not None:
            extras[cfg.score_key] = self._column(reply, cfg.score_key, n, cfg.score_key)
        results = []
        for j, index in enumerate(indices):
            raw = rewards[j]
            value = _number(raw, allow_bool=False)
            if value is None or not math.isfinite(value):
                shown = f"{raw!r:.60}" if value is None else f"{value}"
                kind = "not a number" if value is None else "not finite"
                results.append(_error(f"{url}: {cfg.reward_key!r} for sample {index} is {shown} ({kind})"))
                continue
            components: dict[str, float] = {}
            other: dict[str, Any] = {}
            for name, column in extras.items():
                number = _number(column[j], allow_bool=True)
                if number is not None and math.isfinite(number):
                    components[cfg.component_prefix + name] = number
                else:
                    other[name] = column[j]  # kept, not a component: text, null or a non-finite number
            details: dict[str, Any] = {}
            if other:
                details["extra"] = other
            if batch_level:
                details["batch_extra"] = batch_level
            results.append(ScoreResult(score=value, components=components, details=details))
        return results

    def _column(self, data: Mapping[str, Any], key: str, n: int, field: str) -> list[Any]:
        """`data[key]` as a list of exactly n values (a bare value is accepted for a one-sample batch)."""
        url = self.config.url
        if key not in data:
            fields = ", ".join(repr(k) for k in list(data)[:20]) or "none"
            raise RemoteRewardError(f"{url}: the reply has no {field!r} field (fields: {fields})")
        value = data[key]
        if not isinstance(value, list):
            if n == 1:
                return [value]
            raise RemoteRewardError(f"{url}: {field!r} is a JSON {type(value).__name__}, expected a list of {n} values")
        if len(value) != n:
            raise RemoteRewardError(
                f"{url}: {field!r} has {len(value)} values for a batch of {n} samples; cannot tell which is whose"
            )
        return value
