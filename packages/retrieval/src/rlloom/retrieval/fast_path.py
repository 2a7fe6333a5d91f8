"""A pure-ASGI shortcut for the query routes: POST /retrieve and /search skip FastAPI's routing layers.

At a few hundred microseconds of backend time per query, the framework's per-request layers (exception
wrappers, exit stacks, dependency solving, routing) cost as much as the search itself. The shortcut still sits
inside Starlette's ServerErrorMiddleware, so an unexpected exception answers 500 and the server lives on; every
other route (health, stats, docs) goes through FastAPI unchanged, and the same handlers back the FastAPI routes, so
/docs describes exactly what the shortcut serves. A body larger than `max_body_bytes` is answered 413 as soon as its
declared length or the bytes received pass the limit: it is never buffered whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

QueryHandler = Callable[[bytes], Awaitable[Response]]
TooLargeResponse = Callable[[], Response]


class QueryFastPath:
    """ASGI middleware: answer `routes` (POST only) directly from the raw body; pass everything else on."""

    def __init__(
        self, app: ASGIApp, routes: Mapping[str, QueryHandler], max_body_bytes: int, too_large: TooLargeResponse
    ) -> None:
        self.app = app
        self.routes = dict(routes)
        self.max_body_bytes, self.too_large = max_body_bytes, too_large

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self.too_large()(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # the client left before sending its body: nobody to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:  # chunked upload with no declared length: stop reading here
                await self.too_large()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        response = await handler(b"".join(chunks))
        await response(scope, receive, send)
