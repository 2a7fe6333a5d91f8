"""Connection hygiene for the uvicorn server: a cap on open connections and a deadline on every request head.

uvicorn arms its keep-alive timer only after a response, and cancels it on any byte received, so a client that
connects and sends nothing, or half a request line, holds a socket (a file descriptor) for good; a thousand of
them exhausted a 1,024-descriptor process and locked even /health out. `GuardedHttpToolsProtocol` closes a
connection whose request head is not complete `timeout_keep_alive` seconds after it opened or after the head's
first bytes. Stalled bodies are the job of the body deadline in `fast_path.QueryFastPath`, and `limit_concurrency`
(uvicorn's own) answers 503 and closes once `max_connections` are open.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus a timer that closes a connection stuck before its request head ends.

    The timer runs from the moment a connection opens, and from the first bytes of a later request whose head
    does not arrive whole, until that head is complete. A request whose head comes in one read arms nothing (a
    timer costs about as much as the rest of the request's handling here); silence between requests is left to
    uvicorn's own keep-alive timer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._awaiting_head = True

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # uvicorn cancels its keep-alive timer here, on any byte
        if self._awaiting_head and self._head_timer is None and not self.transport.is_closing():
            self._arm_head_timer()

    def on_message_begin(self) -> None:
        self._awaiting_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if not self.pipeline:  # otherwise the next request's head is already in
            self._awaiting_head = True
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def default_max_connections() -> int:
    """Half the process's open-file limit (the rest is left to index files, logs and the listening socket)."""
    try:
        import resource
    except ImportError:  # not POSIX: no limit to read
        return 1024
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 4096
    return max(16, soft // 2)
