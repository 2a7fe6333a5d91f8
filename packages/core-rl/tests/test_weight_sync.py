"""Weight sync in buckets: the grouping rule, and which path an actor takes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
import torch

from rlloom.core_rl.workers.weight_sync import bucket_names, sync_weights


def test_bucket_names_hand_computed() -> None:
    sizes = {"a": 400, "b": 500, "c": 200, "d": 2000, "e": 100}
    # a+b = 900 <= 1000; +c would be 1100 -> new bucket; c+d too big -> d alone (over budget by itself); e
    assert bucket_names(sizes, 1000) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert bucket_names(sizes, 10_000) == [["a", "b", "c", "d", "e"]]
    assert bucket_names({}, 10) == []
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        bucket_names(sizes, 0)


class RecordingEngine:
    def __init__(self) -> None:
        self.pushes: list[dict[str, torch.Tensor]] = []

    def generate(self, requests: object) -> list[object]:
        return []

    async def agenerate(self, request: object) -> list[object]:
        return []

    def update_weights(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        self.pushes.append(dict(named_tensors))


class WholeActor:
    def named_weights(self) -> dict[str, torch.Tensor]:
        return {"w": torch.ones(2), "b": torch.zeros(1)}


class BucketActor(WholeActor):
    def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        weights = self.named_weights()
        sizes = {k: v.numel() * v.element_size() for k, v in weights.items()}
        for names in bucket_names(sizes, bucket_bytes):
            yield {n: weights[n] for n in names}


def test_sync_weights_pushes_whole_or_bucketed() -> None:
    engine = RecordingEngine()
    assert sync_weights(WholeActor(), engine, bucket_bytes=4) == 1  # type: ignore[arg-type]
    assert list(engine.pushes[0]) == ["w", "b"]
    engine = RecordingEngine()
    assert sync_weights(BucketActor(), engine, bucket_bytes=4) == 2  # type: ignore[arg-type]
    assert [list(p) for p in engine.pushes] == [["w"], ["b"]]  # w is 8 bytes, over the 4-byte budget alone
