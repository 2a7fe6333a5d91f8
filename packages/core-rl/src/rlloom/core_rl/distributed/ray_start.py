"""Starting or joining Ray for the rank workers: one retry with longer waits, token authentication, clear errors.

Ray's own start-up waits are short for a busy machine (a local node gets 30 s to register, a joining process
about 20 s to reach the GCS), and a start that ran out of time usually succeeds at the second try; the retry
lengthens the GCS wait to `RETRY_GCS_WAIT_S`. Ray 2.52+ clusters started by `ray start` use token
authentication when a token exists (`~/.ray/auth_token`, `RAY_AUTH_TOKEN`, `RAY_AUTH_TOKEN_PATH`), but
`ray.init(address=<host:port>)` turns it on only for `address="auto"`: joining by explicit address then fails.
`start_ray` turns it on whenever a token is available and `RAY_AUTH_MODE` is not set, as `auto` does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
"""Ray's setting (an environment variable) for how long a starting or joining process waits for the GCS."""
RETRY_GCS_WAIT_S = 120
"""`GCS_WAIT_ENV` for the second attempt (Ray's default wait is about 20 s)."""

AUTH_HINT = (
    "the Ray cluster uses token authentication: make the head node's token available here (copy its "
    "~/.ray/auth_token, or set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) and set RAY_AUTH_MODE=token"
)


def enable_token_auth_if_available(address: str | None) -> bool:
    """For an explicit cluster address, turn on Ray's token authentication when a token is available and
    RAY_AUTH_MODE is unset (what Ray itself does for `address="auto"`). Returns whether token mode is on."""
    if address in (None, "auto") or "RAY_AUTH_MODE" in os.environ:
        return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    try:  # Ray >= 2.52; older Ray has no token authentication to turn on
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:
        return False
    return bool(maybe_enable_token_auth_if_token_available(warn_if_disabled=False))


def start_ray(address: str | None = None, *, init: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
    """`ray.init(address=address, **kwargs)`, tried twice: a failed start is shut down and retried once with a
    longer GCS wait; a second failure raises a RuntimeError naming the address, both errors and what to check.
    Errors that a retry cannot fix (bad arguments, authentication) are raised at once."""
    import ray

    do_init = init or ray.init
    enable_token_auth_if_available(address)
    where = f"the Ray cluster at {address!r}" if address else "a local Ray node"
    try:
        return do_init(address=address, **kwargs)
    except (TypeError, ValueError):
        raise
    except Exception as first:
        _raise_if_auth(first, where)
        logger.warning("starting %s failed (%s); retrying once with longer waits", where, _short(first))
        ray.shutdown()
        previous = os.environ.get(GCS_WAIT_ENV)
        os.environ[GCS_WAIT_ENV] = str(RETRY_GCS_WAIT_S)
        try:
            return do_init(address=address, **kwargs)
        except Exception as second:
            _raise_if_auth(second, where)
            ray.shutdown()
            raise RuntimeError(
                f"could not start or join {where} in two attempts (first: {_short(first)}; second: "
                f"{_short(second)}). On a busy machine Ray's processes may be too slow to register: retry when the "
                "load is lower. With distributed.ray_address set, check that `ray start` runs there and that "
                "the address and port are reachable"
            ) from second
        finally:
            if previous is None:
                os.environ.pop(GCS_WAIT_ENV, None)
            else:
                os.environ[GCS_WAIT_ENV] = previous


def _raise_if_auth(err: Exception, where: str) -> None:
    if type(err).__name__ == "AuthenticationError" or "authentication" in str(err).lower():
        raise RuntimeError(f"could not join {where}: {AUTH_HINT} ({_short(err)})") from err


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


__all__ = ["AUTH_HINT", "RETRY_GCS_WAIT_S", "enable_token_auth_if_available", "start_ray"]
