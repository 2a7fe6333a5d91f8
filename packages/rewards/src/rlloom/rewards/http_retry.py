"""One POST with retries, shared by the HTTP scorers (the LLM judge, the remote reward server).

Timeouts, connection errors, 429 and 5xx are retried after `backoff * 2**(attempt - 1)` seconds (at most
`max_backoff`); with `honour_retry_after`, a server's `Retry-After` (seconds or an HTTP date, at most
`max_backoff`) sets the wait instead. Any other reply is returned for the caller to judge: what a 4xx or a
malformed body means is the caller's protocol, not this loop's.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
from datetime import UTC, datetime
from typing import Any

import httpx


class RetriesExhaustedError(Exception):
    """Every attempt timed out, failed to connect or got 429/5xx; `last` says how the last one failed."""

    def __init__(self, attempts: int, last: str) -> None:
        super().__init__(f"no reply after {attempts} attempt(s); last: {last}")
        self.attempts, self.last = attempts, last


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date), else None."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


async def post_with_retries(
    client: httpx.AsyncClient,
    url: str,
    *,
    max_retries: int,
    backoff: float,
    timeout: float,
    stats: dict[str, int],
    max_backoff: float = math.inf,
    honour_retry_after: bool = False,
    **request: Any,
) -> httpx.Response:
    """POST `request` (httpx's `json=` / `content=`) to `url` until a reply that is not 429/5xx; counts
    `stats["requests"]` and `stats["retries"]`; raises `RetriesExhaustedError` after `max_retries + 1` attempts."""
    last = "no attempt made"
    delay = 0.0
    for attempt in range(max_retries + 1):
        if attempt:
            stats["retries"] += 1
            await asyncio.sleep(delay)
        delay = min(max_backoff, backoff * 2**attempt)
        stats["requests"] += 1
        try:
            response = await client.post(url, **request)
        except httpx.TimeoutException:
            last = f"timed out after {timeout:g} s"
            continue
        except httpx.TransportError as exc:
            last = f"connection error: {type(exc).__name__}: {exc}"
            continue
        if response.status_code == 429 or response.status_code >= 500:
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            wait = retry_after_seconds(response.headers.get("Retry-After")) if honour_retry_after else None
            if wait is not None:
                delay = min(max_backoff, wait)
            continue
        return response
    raise RetriesExhaustedError(max_retries + 1, last)
