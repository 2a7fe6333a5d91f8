"""A pure-ASGI shortcut for the query routes: POST /retrieve and /search skip FastAPI's routing layers.

At a few hundred microseconds of backend time per query, the framework's per-request layers (exception
wrappers, exit stacks, dependency solving, routing) cost as much as the search itself. The shortcut still sits
inside Starlette's ServerErrorMiddleware, so an unexpected exception answers 500 and the server lives on; every
other route (health, stats, docs) goes through FastAPI unchanged, and the same handlers back the FastAPI routes, so
/docs describes exactly what the shortcut serves. A body larger than `max_body_bytes` is answered 413 as soon as its
declared length or the bytes received pass the limit: it is never buffered whole. A body still incomplete
`body_timeout_s` after the request head is answered 408 with `Connection: close`, so a stalled client does not
hold its socket and its buffered bytes for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from rlloom.retrieval.deadlines import Deadlines

QueryHandler = Callable[[bytes], Awaitable[Response]]
ErrorResponse = Callable[[], Response]


class _DisconnectedError(Exception):
    """The client left before sending its whole body: nobody to answer."""


class _TooLargeError(Exception):
    """More bytes arrived than `max_body_bytes`."""


class QueryFastPath:
    """ASGI middleware: answer `routes` (POST only) directly from the raw body; pass everything else on."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: Mapping[str, QueryHandler],
        max_body_bytes: int,
        too_large: ErrorResponse,
        body_timeout_s: float,
        timed_out: ErrorResponse,
    ) -> None:
        self.app = app
        self.routes = dict(routes)
        self.max_body_bytes, self.too_large = max_body_bytes, too_large
        self.body_deadlines, self.timed_out = Deadlines(body_timeout_s), timed_out

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self.too_large()(scope, receive, send)
            return
        watched = self.body_deadlines.watch()
        refusal: ErrorResponse | None = None
        try:
            body = await self._read_body(receive)
        except asyncio.CancelledError:
            if not self.body_deadlines.expired(watched):  # a shutdown, not our deadline: let it through
                raise
            if watched is not None:
                watched.uncancel()
            refusal = self.timed_out
        except _DisconnectedError:
            return
        except _TooLargeError:  # chunked upload with no declared length: stop reading here
            refusal = self.too_large
        finally:
            self.body_deadlines.release(watched)
        if refusal is not None:
            await refusal()(scope, receive, send)
            return
        response = await handler(body)
        await response(scope, receive, send)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _DisconnectedError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _TooLargeError
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
