"""`rollout.engine` and `rollout.vllm`: which engine generates the training rollouts, and how vLLM is started.

`hf` samples from the actor's own module (no copy, no weight transfer); `vllm` starts vLLM on `model.path` next to
the actor (colocated: it shares the GPU, hence half its memory by default) and the trainer pushes the actor's
weights into it after every update; `vllm_server` does the same with a vLLM server started apart (`url`). Only
what a user tunes is here; the engine itself is `rlloom.rollout`'s (`training_engine.build_training_engine`), so
core-rl needs no vLLM (its own module, so config.py stays small).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlloom.core_rl.config.section import Section

RolloutEngineName = Literal["hf", "vllm", "vllm_server"]
VLLMDtype = Literal["auto", "bfloat16", "float16", "float32"]


class VLLMRolloutConfig(Section):
    """vLLM's own settings, named as vLLM names them (veRL's `actor_rollout_ref.rollout.*` map onto them)."""

    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Share of the GPU's memory vLLM takes (weights + KV cache); the rest is the actor's, so keep "
        "it about 0.5 when colocated (veRL's gpu_memory_utilization).",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="GPUs one vLLM engine spans (veRL's tensor_model_parallel_size)."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        description="Longest prompt + response vLLM plans its KV cache for; None = the model's "
        "max_position_embeddings (lower it to fit a long-context model's cache in memory).",
    )
    dtype: VLLMDtype | None = Field(
        default=None,
        description="The weights' dtype inside vLLM; None = model.dtype, the actor's compute dtype. 'auto' is "
        "what TRL's colocate mode gets: vLLM downcasts a float32 checkpoint to bfloat16 (veRL's rollout.dtype "
        "defaults to bfloat16). A lower precision than the actor's widens the rollout/actor log-prob gap.",
    )
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="Sequences vLLM decodes in one step at most; None = vLLM's default."
    )
    enforce_eager: bool = Field(
        default=False, description="Skip CUDA-graph capture and compilation: slower decoding, faster start."
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="Reuse the KV cache of shared prompt prefixes (a GRPO group's n samples, an agent's turns).",
    )
    enable_sleep_mode: bool | None = Field(
        default=None,
        description="Free vLLM's GPU memory while the actor updates (sleep/wake_up); None = where the platform "
        "has sleep mode (CUDA, not CPU).",
    )
    cpu_kvcache_space_gib: int | None = Field(
        default=None,
        ge=1,
        description="vLLM on CPU only: KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE, unless set in the environment).",
    )
    sync_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        description="Deadline of each weight-push call into vLLM; past it the run stops naming the step and bucket.",
    )


class VLLMServerRolloutConfig(Section):
    """A vLLM OpenAI server started apart from the run (`rollout.engine=vllm_server`): the trainer samples from
    it over HTTP and pushes the actor's weights into it after every update. Start it as `rlloom.rollout`'s
    `vllm_server` module documents (dev mode and rlloom's worker extension are required)."""

    url: str | None = Field(
        default=None, description="The server's OpenAI base URL, e.g. http://10.0.0.5:8000/v1 (required for it)."
    )
    served_model: str | None = Field(
        default=None, description="The model name the server serves; None = the one model it lists."
    )
    api_key: str | None = Field(default=None, description="Sent as a Bearer token (vllm serve --api-key).")
    sync_timeout_s: float = Field(
        default=300.0,
        gt=0.0,
        description="Deadline of each weight-push request; past it the run stops naming the step and bucket.",
    )


__all__ = ["RolloutEngineName", "VLLMRolloutConfig", "VLLMServerRolloutConfig"]
