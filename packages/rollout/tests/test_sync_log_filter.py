"""A weight sync logs one line, not one per tensor: the filter holds back exactly vLLM 0.32's two expected
per-tensor messages (copied from vllm/model_executor/models/utils.py and model_loader/reload/layerwise.py) and lets
every other record through, a real layer failing to load included."""

from __future__ import annotations

import logging

import pytest

from rlloom.rollout.vllm.worker import SyncLogFilter

CAST = "Attempted to load weight %s with dtype %s into parameter with dtype %s"  # vLLM's format string


def test_casts_and_rotary_lines_become_one_summary_and_real_failures_pass(caplog: pytest.LogCaptureFixture) -> None:
    utils = logging.getLogger("vllm.model_executor.models.utils")
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    logs = SyncLogFilter().attach()
    with caplog.at_level(logging.DEBUG):
        for i in range(150):
            utils.warning(CAST, f"model.layers.{i}.mlp.up_proj.weight", "torch.float32", "torch.bfloat16")
        utils.warning(CAST, "lm_head.weight", "torch.float16", "torch.bfloat16")
        for _ in range(30):
            layerwise.warning("%s: Failed to load weights", "RotaryEmbedding")
        layerwise.warning("%s: Failed to load weights", "QKVParallelLinear")  # a real problem: stays visible
        utils.warning("some other vLLM warning")
    logs.detach()
    shown = [record.getMessage() for record in caplog.records]
    assert shown == ["QKVParallelLinear: Failed to load weights", "some other vLLM warning"]
    assert logs.casts == {("float32", "bfloat16"): 150, ("float16", "bfloat16"): 1}
    summary = logs.summary(272)
    assert summary.startswith("rlloom weight sync: 272 tensors loaded in ")
    assert summary.endswith("(1 cast float16 -> bfloat16, 150 cast float32 -> bfloat16); 30 rotary caches kept "
                            "(computed, not loaded)")  # fmt: skip
    with caplog.at_level(logging.DEBUG):  # detached: vLLM's lines pass again outside a sync
        utils.warning(CAST, "x", "torch.float32", "torch.bfloat16")
    assert caplog.records[-1].getMessage().startswith("Attempted to load weight x")
