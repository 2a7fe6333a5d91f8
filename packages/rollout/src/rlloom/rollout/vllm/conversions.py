"""Between rlloom's types and vLLM's: our `SamplingParams` as vLLM's keyword arguments, vLLM's outputs as
`Completion`s. Shared by the offline engine, its in-process stream and the async engine (a module of its own so
`stream` and `engine` need not import each other)."""

from __future__ import annotations

from typing import Any

from rlloom.core_rl.contracts.generation import Completion, FinishReason, GenerationRequest, SamplingParams


def completion_of(
    request: GenerationRequest, prompt_ids: list[int], out: Any, latency: float, version: int = 0
) -> Completion:
    """One vLLM `CompletionOutput` as a `Completion`, every token labelled policy `version`; the sampled token's
    logprob is picked from each step."""
    token_ids = [int(t) for t in out.token_ids]
    logprobs = None
    if request.sampling.logprobs and out.logprobs is not None:
        logprobs = [float(step[t].logprob) for step, t in zip(out.logprobs, token_ids, strict=True)]
    reason: FinishReason = out.finish_reason if out.finish_reason in ("stop", "length") else "abort"
    return Completion(
        request_id=request.request_id,
        prompt_ids=list(prompt_ids),
        token_ids=token_ids,
        text=out.text,
        finish_reason=reason,
        logprobs=logprobs,
        stop_reason=out.stop_reason,
        sample_index=int(out.index),
        timing={"latency_s": latency},
        policy_versions=[version] * len(token_ids),
    )


def span_versions(out: Any, fallback: int) -> list[int]:
    """Each output token's policy version from vLLM's own labels: the engine core stamps every step's outputs with
    the weight version it was set to (`AsyncLLM.update_weight_version`, only while paused) and the final
    `CompletionOutput.weight_versions` gives the spans; `fallback` for tokens without a numeric label."""
    versions = [fallback] * len(out.token_ids)
    for span in getattr(out, "weight_versions", None) or []:
        label = str(span.version)
        if label.lstrip("-").isdigit():
            for i in range(max(0, span.start), min(span.end, len(versions))):
                versions[i] = int(label)
    return versions


def vllm_sampling_kwargs(
    p: SamplingParams, *, skip_special_tokens: bool = True, logit_bias: dict[int, float] | None = None
) -> dict[str, Any]:
    """Our `SamplingParams` as keyword arguments of `vllm.SamplingParams` (same names, vLLM's conventions);
    `logit_bias`: a VLM's banned vision tokens (`ImagePatchLayout.logit_bias`)."""
    return {
        "n": p.n,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,  # vLLM: -1 disables
        "min_p": p.min_p,
        "max_tokens": p.max_tokens,
        "stop": list(p.stop) or None,
        "stop_token_ids": list(p.stop_token_ids) or None,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "ignore_eos": p.ignore_eos,
        "seed": p.seed,
        "logprobs": 0 if p.logprobs else None,  # 0: only the sampled token's logprob
        "detokenize": True,
        "skip_special_tokens": skip_special_tokens,
        "logit_bias": logit_bias,
    }


__all__ = ["completion_of", "span_versions", "vllm_sampling_kwargs"]
