"""Engine calls of the generator's groups: `engine.generate`'s signature served by `engine.agenerate` on the
generator's event loop, so groups started one at a time share the engine's continuous batch (an HF engine's
`generate` decodes each call as a batch of its own, one call at a time) while each group's collect call blocks
only its own worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from rlloom.core_rl.contracts.engines import RolloutEngine
from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import Row, generation_request
from rlloom.core_rl.phases.collection import CollectFn, trajectories_from_completions


class LoopGenerate:
    """Callable like `engine.generate`, from any thread but the loop's; `loop` is set when the generator starts."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        if self.loop is None:
            raise RuntimeError("LoopGenerate: the generator's event loop has not started")

        async def gather() -> list[list[Completion]]:
            return list(await asyncio.gather(*(self.engine.agenerate(r) for r in requests)))

        return asyncio.run_coroutine_threadsafe(gather(), self.loop).result()


def streamed_collector(generate: LoopGenerate, chat_template_kwargs: Mapping[str, Any] | None = None) -> CollectFn:
    """The single-turn collector (`phases.collection.single_turn_collector`) on `generate`."""

    def collect(rows: Sequence[Row], sampling: SamplingParams, prefix: str) -> list[Trajectory]:
        requests = [generation_request(row, sampling, chat_template_kwargs) for row in rows]
        return trajectories_from_completions(rows, requests, generate(requests), prefix)

    return collect


__all__ = ["LoopGenerate", "streamed_collector"]
