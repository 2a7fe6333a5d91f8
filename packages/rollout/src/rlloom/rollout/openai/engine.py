"""`OpenAIEngine`: a `RolloutEngine` backed by any OpenAI-compatible HTTP endpoint.

For evaluation against a hosted model, and for training with a remote inference server (vLLM, SGLang,
`rlloom-rollout serve`). Token-id prompts go to `/v1/completions` with `prompt` as a list of ids (vLLM and this
package's server accept that) and `return_token_ids`, so the ids and logprobs that come back are the sampled
ones; chat-message prompts go to `/v1/chat/completions`. A server that returns no token ids (a hosted API) gives
completions with empty `token_ids` and no logprobs: fine for evaluation, not for training, and we never
re-tokenise text to fake them. Requests share one connection pool per event loop, are limited by a semaphore,
retried with exponential backoff on network errors, 429 and 5xx, and fail fast with the server's message on
other 4xx.
"""

from __future__ import annotations

import asyncio
import random
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import httpx
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlloom.core_rl.contracts.generation import Completion, FinishReason, GenerationRequest, SamplingParams

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEngineError(RuntimeError):
    """The endpoint refused a request or stayed unreachable after all retries."""


class OpenAIEngineConfig(BaseModel):
    """Where the endpoint is and how hard to try."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Endpoint root including /v1, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="Model name the server expects in `model`.")
    api_key: str | None = Field(default=None, description="Sent as a Bearer token when given.")
    max_concurrency: int = Field(default=32, ge=1, description="Requests in flight at most (per event loop).")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(default=4, ge=0, description="Retries after the first try (network, 429, 5xx).")
    backoff_s: float = Field(default=0.5, gt=0, description="First retry delay; doubles each retry, with jitter.")
    vllm_extensions: bool = Field(
        default=True,
        description="Send vLLM's extra fields (top_k, min_p, stop_token_ids, return_token_ids...) when set; "
        "turn off for hosted APIs that reject unknown fields.",
    )
    mode: Literal["auto", "chat", "completions"] = Field(
        default="auto", description="auto: token-id prompts use completions, chat messages use chat."
    )
    context_window: int | Literal["auto"] | None = Field(
        default="auto",
        description="The served model's context length (vLLM's --max-model-len): agent loops end a conversation "
        "there with finish 'length' instead of sending a prompt the server would reject. 'auto' reads "
        "`max_model_len` from the server's /v1/models on first use (vLLM and `rlloom-rollout serve` report it; "
        "hosted APIs do not, which leaves it unknown); None never asks.",
    )

    eos_token_ids: list[int] = Field(
        default_factory=list,
        description="The served model's end-of-sequence ids beyond its tokenizer's eos_token (the eos_token_id list "
        "of its generation_config.json: Qwen instruct models end with <|im_end|> or <|endoftext|>). An agent loop "
        "drops a non-final turn's trailing EOS before a text observation and needs to know them all; the HTTP API "
        "does not report them.",
    )

    @field_validator("context_window")
    @classmethod
    def _positive_window(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 2:
            raise ValueError(f"context_window must be at least 2 tokens, 'auto' or None; got {value}")
        return value


class OpenAIEngine:
    """Completes requests through an OpenAI-compatible server; implements core-rl's `RolloutEngine` and the
    capabilities `HasContextWindow`, `HasEosTokens` and `AsyncClosable` (its connection pools are per event loop)."""

    def __init__(self, config: OpenAIEngineConfig, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self._transport = transport
        self._context_window: int | None = None if config.context_window == "auto" else config.context_window
        self._window_asked = config.context_window != "auto"
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, asyncio.Semaphore]
        ] = weakref.WeakKeyDictionary()

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """One client and semaphore per event loop (both are bound to the loop that made them)."""
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
            client = httpx.AsyncClient(
                base_url=self.config.base_url.rstrip("/"),
                headers=headers,
                timeout=self.config.timeout_s,
                transport=self._transport,
                limits=httpx.Limits(max_connections=self.config.max_concurrency),
            )
            self._clients[loop] = (client, asyncio.Semaphore(self.config.max_concurrency))
        return self._clients[loop]

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The configured end-of-sequence ids (an agent loop adds its tokenizer's own)."""
        return frozenset(self.config.eos_token_ids)

    @property
    def context_window(self) -> int | None:
        """The served model's context length: the configured one, or (with 'auto') the server's, asked once."""
        if not self._window_asked:
            self._window_asked = True
            self._context_window = self._served_context_window()
        return self._context_window

    def _served_context_window(self) -> int | None:
        """`max_model_len` of our model in GET /models; None (with a warning) when the server does not say."""
        url = self.config.base_url.rstrip("/") + "/models"
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        sync_transport = self._transport if isinstance(self._transport, httpx.BaseTransport) else None
        try:
            with httpx.Client(timeout=min(self.config.timeout_s, 30.0), transport=sync_transport) as client:
                r = client.get(url, headers=headers)
            r.raise_for_status()
            cards = r.json().get("data") or []
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            warnings.warn(
                f"OpenAIEngine: could not read the context length from {url} ({type(exc).__name__}: {exc}); "
                "set OpenAIEngineConfig.context_window to cap agent conversations",
                stacklevel=3,
            )
            return None
        for card in cards:
            if isinstance(card, dict) and card.get("id") == self.config.model:
                length = card.get("max_model_len")
                return int(length) if isinstance(length, int) and length >= 2 else None
        return None

    # -- RolloutEngine -------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Complete all requests concurrently (up to `max_concurrency`); call from sync code only."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("OpenAIEngine.generate was called inside an event loop; await agenerate instead")

        async def run_all() -> list[list[Completion]]:
            try:
                return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))
            finally:
                await self.aclose()

        return asyncio.run(run_all())

    async def agenerate(self, request: GenerationRequest) -> list[Completion]:
        """Complete one request (its n samples in one HTTP call)."""
        use_chat = self.config.mode == "chat" or (self.config.mode == "auto" and request.messages is not None)
        if use_chat and request.messages is None:
            raise ValueError(f"request {request.request_id}: mode='chat' needs `messages`, got only prompt_ids")
        if not use_chat and request.prompt_ids is None:
            raise ValueError(f"request {request.request_id}: mode='completions' needs `prompt_ids`, got messages")
        if not self.config.vllm_extensions:
            _refuse_unsendable(request)
        started = time.perf_counter()
        path = "/chat/completions" if use_chat else "/completions"
        body = self._body(request, use_chat)
        data = await self._post(path, body)
        latency = time.perf_counter() - started
        return self._completions(request, data, use_chat, latency)

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        """Push weights to a server that has rlloom's POST /v1/update_weights (safetensors bytes)."""
        from safetensors.torch import save

        tensors, storages = {}, set()
        for name, value in named_tensors.items():
            tensor = value.detach().to("cpu").contiguous()
            if tensor.untyped_storage().data_ptr() in storages:  # tied weights (embeddings = LM head): safetensors
                tensor = tensor.clone()  # refuses tensors that share memory
            storages.add(tensor.untyped_storage().data_ptr())
            tensors[name] = tensor
        payload = save(tensors)
        headers = {"content-type": "application/octet-stream"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        url = self.config.base_url.rstrip("/") + "/update_weights"
        try:
            with httpx.Client(timeout=max(self.config.timeout_s, 600.0)) as client:
                r = client.post(url, content=payload, headers=headers)
        except httpx.TransportError as exc:  # refused, reset or timed out: the server is not there (any more)
            raise OpenAIEngineError(
                f"weight update to {url} failed ({type(exc).__name__}: {exc}); is `rlloom-rollout serve` "
                "still running there? The server keeps its old weights until a push succeeds"
            ) from exc
        if r.status_code == 404:
            raise OpenAIEngineError(
                f"{url} does not exist: only `rlloom-rollout serve` accepts weight pushes; for a vLLM server "
                "use its own weight-update API or restart it from a new checkpoint"
            )
        if r.status_code >= 400:
            raise OpenAIEngineError(f"weight update refused ({r.status_code}): {_server_message(r)}")

    async def aclose(self) -> None:
        """Close this event loop's connection pool."""
        loop = asyncio.get_running_loop()
        entry = self._clients.pop(loop, None)
        if entry is not None:
            await entry[0].aclose()

    # -- wire format ---------------------------------------------------------------------------------------
    def _body(self, request: GenerationRequest, use_chat: bool) -> dict[str, Any]:
        p: SamplingParams = request.sampling
        body: dict[str, Any] = {
            "model": self.config.model,
            "n": p.n,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_tokens,
        }
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        if use_chat:
            body["messages"] = request.messages
            body["logprobs"] = p.logprobs
            if request.chat_template_kwargs:
                body["chat_template_kwargs"] = dict(request.chat_template_kwargs)  # vLLM's field
        else:
            body["prompt"] = request.prompt_ids
            if p.logprobs:
                body["logprobs"] = 1
        if self.config.vllm_extensions:
            body["return_token_ids"] = True
            body["include_stop_str_in_output"] = p.include_stop_str_in_output
            if p.top_k:
                body["top_k"] = p.top_k
            if p.min_p:
                body["min_p"] = p.min_p
            if p.stop_token_ids:
                body["stop_token_ids"] = list(p.stop_token_ids)
            if p.ignore_eos:
                body["ignore_eos"] = True
        if request.multimodal:
            body.update(request.multimodal)  # passed through as extra fields the server understands
        return body

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        client, limit = self._client()
        delay = self.config.backoff_s
        last = ""
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                await asyncio.sleep(delay * (1.0 + random.random() * 0.25))
                delay *= 2
            try:
                async with limit:
                    r = await client.post(path, json=body)
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code in _RETRY_STATUS:
                last = f"HTTP {r.status_code}: {_server_message(r)}"
                continue
            if r.status_code >= 400:
                raise OpenAIEngineError(f"{self.config.base_url}{path} refused the request: {_server_message(r)}")
            result: dict[str, Any] = r.json()
            return result
        raise OpenAIEngineError(
            f"{self.config.base_url}{path} failed after {self.config.max_retries + 1} tries; last error: {last}"
        )

    def _completions(
        self, request: GenerationRequest, data: dict[str, Any], use_chat: bool, latency: float
    ) -> list[Completion]:
        prompt_ids = request.prompt_ids or list(data.get("prompt_token_ids") or [])
        out = []
        for i, choice in enumerate(sorted(data.get("choices", []), key=lambda c: c.get("index", 0))):
            text = choice["message"].get("content") or "" if use_chat else choice.get("text", "")
            token_ids = [int(t) for t in choice.get("token_ids") or []]
            logprobs = _choice_logprobs(choice, use_chat)
            if logprobs is not None and len(logprobs) != len(token_ids):
                logprobs = None  # the server gave no token ids to pair them with
            versions = choice.get("policy_versions")  # rlloom's server labels each token's policy version
            if not isinstance(versions, list) or len(versions) != len(token_ids):
                versions = None
            out.append(
                Completion(
                    request_id=request.request_id,
                    prompt_ids=list(prompt_ids),
                    token_ids=token_ids,
                    text=text,
                    finish_reason=_finish_reason(choice.get("finish_reason")),
                    logprobs=logprobs if request.sampling.logprobs else None,
                    stop_reason=choice.get("stop_reason"),
                    sample_index=i,
                    timing={"latency_s": latency},
                    policy_versions=[int(v) for v in versions] if versions is not None else None,
                )
            )
        if len(out) != request.sampling.n:
            raise OpenAIEngineError(f"asked for n={request.sampling.n} samples, the server returned {len(out)}")
        return out


def _refuse_unsendable(request: GenerationRequest) -> None:
    """Without vLLM's extensions these knobs cannot be sent: refuse them rather than sample without them."""
    p = request.sampling
    unsent = [
        name
        for name, is_set in (
            ("top_k", p.top_k > 0),
            ("min_p", p.min_p > 0.0),
            ("stop_token_ids", bool(p.stop_token_ids)),
            ("ignore_eos", p.ignore_eos),
        )
        if is_set
    ]
    if unsent:
        raise ValueError(
            f"request {request.request_id}: SamplingParams.{', '.join(unsent)} cannot be sent with "
            "OpenAIEngineConfig.vllm_extensions=False (the OpenAI API has no such fields); leave them at their "
            "defaults, or set vllm_extensions=True for a vLLM-compatible server"
        )
    if request.chat_template_kwargs and request.messages is not None:
        raise ValueError(
            f"request {request.request_id}: chat_template_kwargs ({', '.join(request.chat_template_kwargs)}) cannot "
            "be sent with OpenAIEngineConfig.vllm_extensions=False (the OpenAI API renders its own template); "
            "leave them out, or set vllm_extensions=True for a vLLM-compatible server"
        )


def _choice_logprobs(choice: dict[str, Any], use_chat: bool) -> list[float] | None:
    lp = choice.get("logprobs")
    if not lp:
        return None
    if use_chat:
        return [float(t["logprob"]) for t in lp.get("content") or []]
    return [float(x) for x in lp.get("token_logprobs") or []]


def _finish_reason(reason: str | None) -> FinishReason:
    if reason == "length":
        return "length"
    if reason in ("stop", "tool_calls", "function_call", "eos"):
        return "stop"
    return "abort"


def _server_message(r: httpx.Response) -> str:
    try:
        err = r.json().get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        return str(err or r.json().get("detail") or r.text)
    except ValueError:
        return r.text[:500]
