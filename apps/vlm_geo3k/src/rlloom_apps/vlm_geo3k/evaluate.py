"""`vlm-geo3k eval`: sample n answers per Geometry3K problem from a VLM, score them, report avg@n, pass@k and maj@k.

Wiring only: each row becomes an image request through `rlloom.multimodal.row_request` (the same pixel budget,
image-pad expansion and M-RoPE positions as training), the engine comes from `rlloom.rollout.policy_spec`, and
sampling, scoring, metrics and output files are `rlloom.rewards.eval_runner`'s. Rows of `geometry3k` are scored
by answer accuracy (the math checker on the boxed answer), not by EasyR1's training reward, which also pays for
format; maj@k votes by mathematical equivalence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlloom.core_rl.contracts import GenerationRequest
from rlloom.multimodal import QwenVLProcessing, VisionTokenIds, row_request
from rlloom.rewards.eval_runner import EvalSettings, RequestFor
from rlloom.rollout import eval_sampling


def vision_request(settings: EvalSettings, tokenizer: Any, processing: QwenVLProcessing) -> RequestFor:
    """Row i's prompt with its images, sampled with seed + i."""
    tokens = VisionTokenIds.from_tokenizer(tokenizer)

    def request_for(index: int, row: Mapping[str, Any]) -> GenerationRequest:
        return row_request(dict(row), eval_sampling(settings, index), tokenizer, processing, tokens)

    return request_for


__all__ = ["vision_request"]
