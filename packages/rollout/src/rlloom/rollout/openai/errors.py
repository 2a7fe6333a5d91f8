"""OpenAI-shaped errors for the rollout server: every failure answers `{"error": {message, type, param, code}}`.

Clients (the `openai` package, agent tooling) read `error.message` and `error.param`, so a 400 names the field
and says how to fix it, and even FastAPI's own 404/405 come back in that shape. An unexpected exception is
answered by a middleware as a 500 and not re-raised: Starlette's catch-all exception handler re-raises after
responding, which makes uvicorn print a traceback and drop the keep-alive connection under the client's next
request.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlloom.rollout.openai.schema import FieldError

logger = logging.getLogger("rlloom.rollout.openai.server")

ROUTES = "/v1/models, /v1/chat/completions, /v1/completions, /v1/update_weights and /health"


class TooLargeError(Exception):
    """A request body over the server's byte limit (answered 413 before it is buffered whole)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the request body is {size} bytes or more, over this server's limit of {limit}; send less, or restart "
            "the server with a larger --max-update-bytes"
        )


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error body with `status`."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": message, "type": kind, "param": param, "code": code}
    return JSONResponse(status_code=status, content={"error": error})


def _field_path(loc: Sequence[Any]) -> str:
    """("body", "messages", 0, "content") -> "messages[0].content"."""
    path = ""
    for part in loc:
        if part == "body" and not path:
            continue
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _one_error(err: Mapping[str, Any]) -> tuple[str, str | None]:
    """(message, param) for one pydantic error, without pydantic's "Value error, " prefix or docs URL."""
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return str(cause), cause.field
    kind, field = err.get("type"), _field_path(err.get("loc", ()))
    if kind == "json_invalid":
        return f"the request body is not valid JSON ({cause or 'decode error'}); send a JSON object", None
    if not field:
        if kind == "missing":
            return "the request body is missing; send a JSON object", None
        return f"the request body: {err.get('msg', 'invalid')}; send a JSON object", None
    if kind == "extra_forbidden":
        return f"`{field}`: not a field this server accepts; remove it", field
    if kind == "missing":
        return f"`{field}`: required", field
    return f"`{field}`: {cause if cause is not None else err.get('msg', 'invalid')}", field


def validation_message(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """All errors in one message, and the first one's field as the `param`."""
    pairs = [_one_error(e) for e in errors] or [("invalid request", None)]
    return "; ".join(dict.fromkeys(m for m, _ in pairs)), pairs[0][1]


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """FastAPI's routing errors (unknown path, wrong method) in OpenAI's shape."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        return error_response(404, f"no route {where}; this server serves {ROUTES}", code="not_found")
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("allow", (exc.headers or {}).get("Allow", "another method"))
        return error_response(405, f"{where} is not allowed; use {allowed}", code="method_not_allowed")
    return error_response(exc.status_code, f"{where}: {exc.detail}")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every failure of `app` in OpenAI's error shape (400 bad request, 404/405 routing, 500 engine)."""

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, *validation_message(exc.errors()))

    @app.exception_handler(ValueError)
    async def _bad_value(_: Request, exc: ValueError) -> JSONResponse:
        if isinstance(exc, ValidationError):
            return error_response(400, *validation_message(exc.errors()))
        return error_response(400, str(exc), exc.field if isinstance(exc, FieldError) else None)

    @app.exception_handler(TooLargeError)
    async def _too_large(_: Request, exc: TooLargeError) -> JSONResponse:
        return error_response(413, str(exc), code="payload_too_large")

    @app.exception_handler(StarletteHTTPException)
    async def _routing(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _http_error(request, exc)

    @app.middleware("http")
    async def _engine_failures(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        try:
            return await call_next(request)
        except Exception as exc:  # answered here, not re-raised: the connection stays open for the next request
            logger.error("%s %s failed: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
            return error_response(500, f"the engine failed on this request: {type(exc).__name__}: {exc}")
