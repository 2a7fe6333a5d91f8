"""An OpenAI-compatible HTTP server in front of any rollout engine, plus a weight-update endpoint.

Judge rewards, agents and eval tools already speak the OpenAI API, so exposing the policy that way lets them
use a local model unchanged; a trainer pushes new weights with POST /v1/update_weights (a safetensors payload
or a path). Each choice also carries `token_ids` and the response `prompt_token_ids` (as vLLM does with
`return_token_ids`), so `OpenAIEngine` gets exact tokens back. Bad requests get a 400 naming the field;
an engine error becomes a 500 for that request only, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from rlloom.core_rl.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.protocols import RolloutEngine
from rlloom.rollout.openai_schema import ChatCompletionBody, CompletionBody, WeightsFromPath
from rlloom.rollout.weights import read_safetensors


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param}})


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, first = [], None
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        field = ".".join(loc) or "body"
        first = first or field
        parts.append(f"{field}: {err.get('msg', 'invalid')}")
    return "; ".join(parts), first


def _tokens_text(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([t]) for t in ids] if tokenizer is not None else [str(t) for t in ids]


def create_app(engine: RolloutEngine, model_name: str, tokenizer: Any = None, default_max_tokens: int = 256) -> FastAPI:
    """The FastAPI app serving `engine` under `model_name`; `tokenizer` renders text prompts and token strings."""
    app = FastAPI(title="rlloom-rollout", version="1")
    created = int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = _validation_message(exc)
        return _error(400, message, field)

    @app.exception_handler(ValueError)
    async def _bad_value(_: Request, exc: ValueError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(Exception)
    async def _engine_failed(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"{type(exc).__name__}: {exc}")

    def check_model(name: str) -> JSONResponse | None:
        if name != model_name:
            return _error(404, f"model `{name}` is not served here; use `{model_name}`", "model")
        return None

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": model_name, "object": "model", "created": created, "owned_by": "rlloom"}
        window = getattr(engine, "context_window", None)
        if window:
            entry["max_model_len"] = window  # vLLM's field: clients cap prompts by it
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatCompletionBody) -> JSONResponse | dict[str, Any]:
        if (bad := check_model(body.model)) is not None:
            return bad
        sampling = body.sampling(True, default_max_tokens)
        completions = await engine.agenerate(GenerationRequest(messages=body.messages, sampling=sampling))
        choices = []
        for c in completions:
            choice: dict[str, Any] = {
                "index": c.sample_index,
                "message": {"role": "assistant", "content": c.text},
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
                "token_ids": c.token_ids,
                "logprobs": None,
            }
            if body.logprobs and c.logprobs is not None:
                tokens = _tokens_text(tokenizer, c.token_ids)
                choice["logprobs"] = {
                    "content": [
                        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, c.logprobs, strict=True)
                    ]
                }
            choices.append(choice)
        return _envelope("chat.completion", body.model, completions, choices)

    @app.post("/v1/completions", response_model=None)
    async def complete(body: CompletionBody) -> JSONResponse | dict[str, Any]:
        if (bad := check_model(body.model)) is not None:
            return bad
        sampling = body.sampling(True, default_max_tokens)
        requests = [_prompt_request(p, sampling, tokenizer) for p in body.prompts()]
        results = await asyncio.gather(*(engine.agenerate(r) for r in requests))
        choices, flat = [], []
        for prompt_index, completions in enumerate(results):
            for c in completions:
                choice: dict[str, Any] = {
                    "index": prompt_index * body.n + c.sample_index,
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                    "token_ids": c.token_ids,
                    "prompt_token_ids": c.prompt_ids,
                    "logprobs": None,
                }
                if body.logprobs is not None and c.logprobs is not None:
                    choice["logprobs"] = {
                        "tokens": _tokens_text(tokenizer, c.token_ids),
                        "token_logprobs": c.logprobs,
                        "top_logprobs": None,
                        "text_offset": None,
                    }
                choices.append(choice)
                flat.append(c)
        return _envelope("text_completion", body.model, flat, choices)

    @app.post("/v1/update_weights", response_model=None)
    async def update_weights(request: Request) -> JSONResponse | dict[str, Any]:
        """Body: raw safetensors bytes (Content-Type application/octet-stream) or JSON {"path": ...}."""
        started = time.perf_counter()
        if request.headers.get("content-type", "").startswith("application/json"):
            target = WeightsFromPath.model_validate(await request.json())
            try:
                tensors = read_safetensors(target.path)
            except FileNotFoundError as exc:
                return _error(400, str(exc), "path")
        else:
            from safetensors.torch import load as load_safetensors

            payload = await request.body()
            if not payload:
                raise ValueError("update_weights: empty body; send safetensors bytes or JSON {'path': ...}")
            try:
                tensors = load_safetensors(payload)
            except Exception as exc:
                raise ValueError(f"update_weights: body is not a safetensors payload ({exc})") from exc
        try:
            await run_in_threadpool(engine.update_weights, tensors)
        except (KeyError, ValueError) as exc:  # names or shapes that do not fit the served model
            return _error(400, str(exc).strip("'\""))
        return {"updated": len(tensors), "seconds": round(time.perf_counter() - started, 4)}

    return app


def _prompt_request(prompt: str | list[int], sampling: SamplingParams, tokenizer: Any) -> GenerationRequest:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("`prompt` is text but this server has no tokenizer; send token ids")
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError("`prompt` tokenized to nothing")
        return GenerationRequest(prompt_ids=ids, sampling=sampling)
    return GenerationRequest(prompt_ids=prompt, sampling=sampling)


def _envelope(kind: str, model: str, completions: list[Completion], choices: list[dict[str, Any]]) -> dict[str, Any]:
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
