"""An OpenAI-compatible HTTP server in front of any rollout engine, plus a weight-update endpoint.

Judge rewards, agents and eval tools already speak the OpenAI API, so exposing the policy that way lets them
use a local model unchanged; a trainer pushes new weights with POST /v1/update_weights (a safetensors payload
or a path). Each choice also carries `token_ids` and the response `prompt_token_ids` (as vLLM does with
`return_token_ids`), so `OpenAIEngine` gets exact tokens back. Bad requests get a 400 naming the field;
an engine error becomes a 500 for that request only, and the server keeps serving (`openai_errors.py`).
`ServerLimits` bounds what one request may ask: prompts per body, and the bytes of a weight update, which is
also refused (400) when a tensor holds NaN or infinity, since every later generation would fail on it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Coroutine
from typing import Any, Protocol, runtime_checkable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool

from rlloom.core_rl.contracts.engines import HasContextWindow, InflightWeightUpdate, RolloutEngine
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.prompts import render_prompt
from rlloom.rollout.openai.errors import TooLargeError, error_response, install_error_handlers, validation_message
from rlloom.rollout.openai.schema import (
    ChatCompletionBody,
    CompletionBody,
    FieldError,
    ServerLimits,
    WeightsFromPath,
)
from rlloom.rollout.weights import read_safetensors

__all__ = ["ServerLimits", "create_app"]

_HEADER_ROOM = 64 << 20  # a safetensors header (names, shapes, offsets as JSON) for thousands of tensors
_UNKNOWN_MODEL_BYTES = 64 << 30


def _tokens_text(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([t]) for t in ids] if tokenizer is not None else [str(t) for t in ids]


@runtime_checkable
class HoldsModule(Protocol):
    """An engine that generates from a module of this process (`HFEngine.model`): its size bounds a weight push."""

    @property
    def model(self) -> Any: ...


def update_byte_limit(engine: RolloutEngine, limits: ServerLimits) -> int:
    """`limits.max_update_bytes`, or room for the served model's weights sent in fp32 (twice bf16) plus a header."""
    if limits.max_update_bytes is not None:
        return limits.max_update_bytes
    import torch

    model = engine.model if isinstance(engine, HoldsModule) else None
    if not isinstance(model, torch.nn.Module):
        return _UNKNOWN_MODEL_BYTES
    weights = sum(t.numel() * 4 for t in model.state_dict().values())  # fp32, the widest a trainer sends
    return max(weights, 1) + _HEADER_ROOM


def create_app(
    engine: RolloutEngine,
    model_name: str,
    tokenizer: Any = None,
    default_max_tokens: int = 256,
    limits: ServerLimits | None = None,
) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; `tokenizer` renders text prompts and token strings."""
    limits = limits or ServerLimits()
    if not model_name:
        raise ValueError("create_app: model_name is empty; give the name clients pass as `model`")
    if default_max_tokens < 1:
        raise ValueError(f"create_app: default_max_tokens is {default_max_tokens}; give 1 or more")
    app = FastAPI(title="rlloom-rollout", version="1")
    install_error_handlers(app)
    created = int(time.time())
    window = engine.context_window if isinstance(engine, HasContextWindow) else None
    max_update_bytes = update_byte_limit(engine, limits)

    def card() -> dict[str, Any]:
        entry: dict[str, Any] = {"id": model_name, "object": "model", "created": created, "owned_by": "rlloom"}
        if window:
            entry["max_model_len"] = window  # vLLM's field: clients cap prompts by it
        return entry

    def check_model(name: str) -> JSONResponse | None:
        if name != model_name:
            message = f"model `{name}` is not served here; use `{model_name}`"
            return error_response(404, message, "model", code="model_not_found")
        return None

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}", response_model=None)
    async def model_card(model_id: str) -> JSONResponse | dict[str, Any]:
        return check_model(model_id) or card()

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionBody) -> JSONResponse | dict[str, Any]:
        if (bad := check_model(body.model)) is not None:
            return bad
        request = GenerationRequest(
            messages=body.messages,
            sampling=body.sampling(True, default_max_tokens),
            chat_template_kwargs=body.chat_template_kwargs,
        )
        if tokenizer is not None:
            _check_fits(len(_render_chat(tokenizer, request)), window, "messages")
        completions = await engine.agenerate(request)
        choices = [_chat_choice(c, tokenizer, body.logprobs) for c in completions]
        return _envelope("chat.completion", body.model, completions, choices)

    @app.post("/v1/completions", response_model=None)
    async def complete(body: CompletionBody) -> JSONResponse | dict[str, Any]:
        if (bad := check_model(body.model)) is not None:
            return bad
        sampling = body.sampling(True, default_max_tokens)
        prompts = body.prompts()
        if len(prompts) > limits.max_prompts:
            raise FieldError(
                "prompt",
                f"{len(prompts)} prompts exceed this server's limit of {limits.max_prompts} per request; send them "
                "in several requests (or restart the server with a larger --max-prompts)",
            )
        requests = [_prompt_request(p, sampling, tokenizer, window) for p in prompts]
        results = await _all_or_none([engine.agenerate(r) for r in requests])
        choices, flat = [], []
        for prompt_index, completions in enumerate(results):
            for c in completions:
                choices.append(_text_choice(c, prompt_index * body.n, tokenizer, body.logprobs is not None))
                flat.append(c)
        prompt_tokens = sum(len(r.prompt_ids or []) for r in requests)  # each prompt once, whatever n
        return _envelope("text_completion", body.model, flat, choices, prompt_tokens)

    @app.post("/v1/update_weights", response_model=None)
    async def update_weights(request: Request) -> JSONResponse | dict[str, Any]:
        """Body: raw safetensors bytes (Content-Type application/octet-stream) or JSON {"path": ...}."""
        started = time.perf_counter()
        tensors = await _read_weights(request, max_update_bytes)
        await run_in_threadpool(check_finite, tensors)
        try:
            await run_in_threadpool(engine.update_weights, tensors)
        except (KeyError, ValueError) as exc:  # names or shapes that do not fit the served model
            return error_response(400, str(exc).strip("'\""))
        return {"updated": len(tensors), "seconds": round(time.perf_counter() - started, 4)}

    def no_inflight() -> JSONResponse | None:
        if isinstance(engine, InflightWeightUpdate):
            return None
        message = (
            f"the engine behind this server ({type(engine).__name__}) cannot take weights in flight (no "
            "pause_generation/resume_generation); push weights between requests with /v1/update_weights"
        )
        return error_response(400, message)

    @app.get("/v1/inflight")
    async def inflight() -> dict[str, Any]:
        """Whether the engine takes weights in flight (/v1/pause_generation, /v1/resume_generation) and whether
        paused requests keep their KV cache; `InflightOpenAIEngine` reads it."""
        if not isinstance(engine, InflightWeightUpdate):
            return {"inflight": False, "keeps_kv_cache": False}
        return {"inflight": True, "keeps_kv_cache": bool(engine.keeps_kv_cache)}

    @app.post("/v1/pause_generation", response_model=None)
    async def pause_generation() -> JSONResponse | dict[str, Any]:
        """Stop running requests at a token boundary (answers once they all stopped); new ones wait."""
        if (refused := no_inflight()) is not None:
            return refused
        assert isinstance(engine, InflightWeightUpdate)
        await run_in_threadpool(engine.pause_generation)
        return {"paused": True, "keeps_kv_cache": engine.keeps_kv_cache}

    @app.post("/v1/resume_generation", response_model=None)
    async def resume_generation(body: ResumeBody) -> JSONResponse | dict[str, Any]:
        """Continue under the weights loaded meanwhile; tokens sampled from now on carry `policy_version`."""
        if (refused := no_inflight()) is not None:
            return refused
        assert isinstance(engine, InflightWeightUpdate)
        await run_in_threadpool(engine.resume_generation, body.policy_version)
        return {"paused": False, "policy_version": body.policy_version}

    return app


class ResumeBody(BaseModel):
    """POST /v1/resume_generation: the policy version the tokens sampled from now on are labelled with."""

    model_config = ConfigDict(extra="forbid")

    policy_version: int


async def _all_or_none(calls: list[Coroutine[Any, Any, list[Completion]]]) -> list[list[Completion]]:
    """Every prompt's completions; when one fails the others are cancelled, so the engine frees their rows
    instead of decoding answers nobody will receive (`asyncio.gather` alone lets them run on)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _check_fits(prompt_tokens: int, window: int | None, field: str) -> None:
    """Refuse a prompt that leaves no room in the context (a longer completion is cut to `length`)."""
    if window and prompt_tokens >= window:
        raise FieldError(field, f"{prompt_tokens} tokens, but the model's context is {window} tokens; shorten it")


def _render_chat(tokenizer: Any, request: GenerationRequest) -> list[int]:
    if getattr(tokenizer, "chat_template", None) is None:
        raise FieldError(
            "messages",
            "this server's tokenizer has no chat template, so it cannot render messages; send a text `prompt` "
            "to /v1/completions, or restart the server with --tokenizer DIR holding a chat template",
        )
    return render_prompt(tokenizer, request)


def _prompt_request(
    prompt: str | list[int], sampling: SamplingParams, tokenizer: Any, window: int | None
) -> GenerationRequest:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise FieldError("prompt", "is text but this server has no tokenizer; send token ids")
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if not ids:
            raise FieldError("prompt", "tokenized to nothing; send non-empty text")
        prompt = ids
    if not prompt:
        raise FieldError("prompt", "holds an empty list of token ids; send at least one")
    _check_fits(len(prompt), window, "prompt")
    return GenerationRequest(prompt_ids=prompt, sampling=sampling)


def check_finite(tensors: dict[str, Any]) -> None:
    """Refuse weights holding NaN or infinity: loaded, they would make every later generation fail."""
    import torch

    for name, tensor in tensors.items():
        if tensor.is_floating_point() or tensor.is_complex():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise ValueError(
                    f"update_weights: tensor {name!r} holds {bad} NaN or infinite value(s) of {tensor.numel()}; "
                    "the trainer's weights have diverged. Nothing was loaded: the served weights are unchanged"
                )


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as its declared length or the bytes received pass `limit`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLargeError(int(declared), limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLargeError(len(body), limit)
    return bytes(body)


async def _read_weights(request: Request, limit: int) -> dict[str, Any]:
    """The tensors of an update_weights request: a JSON {"path": ...} on the server's disk, or raw bytes."""
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            target = WeightsFromPath.model_validate(json.loads(await _read_body(request, min(limit, 1 << 20))))
        except json.JSONDecodeError as exc:
            raise ValueError(f"update_weights: the body is not valid JSON ({exc}); send {{'path': ...}}") from exc
        except ValidationError as exc:
            problem = validation_message(exc.errors())[0]
            raise FieldError(
                "path", f"send {{'path': a .safetensors file or folder on the server}} ({problem})"
            ) from exc
        try:
            return await run_in_threadpool(read_safetensors, target.path)
        except FileNotFoundError as exc:
            raise FieldError("path", str(exc)) from exc
        except Exception as exc:  # safetensors' own error for a file in another format
            raise FieldError("path", f"{target.path} is not a safetensors file ({exc}); give one") from exc
    from safetensors.torch import load as load_safetensors

    payload = await _read_body(request, limit)
    if not payload:
        raise ValueError("update_weights: empty body; send safetensors bytes or JSON {'path': ...}")
    try:
        return load_safetensors(payload)
    except Exception as exc:
        raise ValueError(f"update_weights: the body is not a safetensors payload ({exc}); send one") from exc


def _chat_choice(c: Completion, tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": c.sample_index,
        "message": {"role": "assistant", "content": c.text},
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
        "token_ids": c.token_ids,
        "policy_versions": c.policy_versions,
        "logprobs": None,
    }
    if logprobs and c.logprobs is not None:
        tokens = _tokens_text(tokenizer, c.token_ids)
        choice["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                for t, lp in zip(tokens, c.logprobs, strict=True)
            ]
        }
    return choice


def _text_choice(c: Completion, first_index: int, tokenizer: Any, logprobs: bool) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": first_index + c.sample_index,
        "text": c.text,
        "finish_reason": c.finish_reason,
        "stop_reason": c.stop_reason,
        "token_ids": c.token_ids,
        "prompt_token_ids": c.prompt_ids,
        "policy_versions": c.policy_versions,
        "logprobs": None,
    }
    if logprobs and c.logprobs is not None:
        choice["logprobs"] = {
            "tokens": _tokens_text(tokenizer, c.token_ids),
            "token_logprobs": c.logprobs,
            "top_logprobs": None,
            "text_offset": None,
        }
    return choice


def _envelope(
    kind: str,
    model: str,
    completions: list[Completion],
    choices: list[dict[str, Any]],
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """The response body; `prompt_tokens` sums a batch's prompts (default: the one prompt of `completions`)."""
    if prompt_tokens is None:
        prompt_tokens = len(completions[0].prompt_ids) if completions else 0
    return {
        "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "prompt_token_ids": completions[0].prompt_ids if completions else [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": sum(len(c.token_ids) for c in completions),
            "total_tokens": prompt_tokens + sum(len(c.token_ids) for c in completions),
        },
    }
