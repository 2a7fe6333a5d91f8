"""`InflightOpenAIEngine`: `OpenAIEngine` for rlloom's own server (`rlloom-rollout serve`) over an engine that takes
weights in flight (HFEngine), so `trainer.mode=async` pushes weights while the server's requests run.

core-rl's `InflightWeightUpdate` over the server's endpoints: `pause_generation` is `POST /v1/pause_generation`
(answers once every running request stopped at a token boundary; requests sent meanwhile wait on the server),
the trainer pushes through `POST /v1/update_weights` (`OpenAIEngine.update_weights`), and
`resume_generation(v)` is `POST /v1/resume_generation {"policy_version": v}`. The server labels each token with
the version that sampled it (the choices' `policy_versions`), so a response spanning a push is labelled exactly.
A plain `OpenAIEngine` is not `InflightWeightUpdate`: third-party servers have none of these endpoints.
"""

from __future__ import annotations

from typing import Any

import httpx

from rlloom.rollout.openai.engine import OpenAIEngine, OpenAIEngineError, _server_message

NOT_RLLOOM = "only `rlloom-rollout serve` has it (for a vLLM server use VLLMServerEngine)"


class InflightOpenAIEngine(OpenAIEngine):
    """An `OpenAIEngine` that also implements `InflightWeightUpdate` against rlloom's server."""

    _keeps_kv: bool | None = None

    @property
    def keeps_kv_cache(self) -> bool:
        """Whether the served engine keeps paused requests' KV cache (`GET /v1/inflight`, asked once). False when
        the server cannot be asked or its engine cannot update in flight (a push then fails naming why); never
        raises, since `isinstance(..., InflightWeightUpdate)` reads it on Python 3.11."""
        if self._keeps_kv is None:
            try:
                answer = self._control("GET", "/inflight")
            except OpenAIEngineError:
                return False
            self._keeps_kv = bool(answer.get("inflight")) and bool(answer.get("keeps_kv_cache"))
        return self._keeps_kv

    def pause_generation(self) -> None:
        """Stop the server's running requests at a token boundary; returns once they all stopped."""
        self._control("POST", "/pause_generation")

    def resume_generation(self, policy_version: int) -> None:
        """Let them continue under the weights pushed meanwhile, tokens from now on labelled `policy_version`."""
        self._control("POST", "/resume_generation", {"policy_version": policy_version})

    def _control(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = self.config.base_url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        try:
            with httpx.Client(timeout=max(self.config.timeout_s, 600.0)) as client:
                r = client.request(method, url, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise OpenAIEngineError(f"{method} {url} failed ({type(exc).__name__}: {exc}); is the server up?") from exc
        if r.status_code == 404:
            raise OpenAIEngineError(f"{url} does not exist: {NOT_RLLOOM}")
        if r.status_code >= 400:
            raise OpenAIEngineError(f"{method} {url} refused ({r.status_code}): {_server_message(r)}")
        answer: dict[str, Any] = r.json()
        return answer


__all__ = ["InflightOpenAIEngine"]
