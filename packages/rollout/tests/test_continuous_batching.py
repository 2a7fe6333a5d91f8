"""Continuous batching: rows that join a running decode behave exactly as if decoded alone.

References are independent of the joining machinery: the same request decoded in a batch of its own, and a
plain fp32 forward pass over prompt + completion for the logprobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rlloom.core_rl.contracts.generation import GenerationRequest, SamplingParams
from rlloom.core_rl.tiny import tiny_qwen2
from rlloom.rollout.hf.decoding import DecodeSettings, RunningBatch, SampleRow, decode
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig


@pytest.fixture
def sharp(tok: Any, peaked_state: Any) -> torch.nn.Module:
    """A tiny model with sharp next-token distributions, so greedy choices are far from ties."""
    m = tiny_qwen2(tok, seed=5)
    m.load_state_dict(peaked_state(tok, seed=5), strict=False)
    m.eval()
    return m


@pytest.fixture
def settings(tok: Any) -> DecodeSettings:
    return DecodeSettings(pad_token_id=tok.pad_token_id, max_positions=1024)


def _row(index: int, prompt: list[int], sample: int = 0, **params: Any) -> SampleRow:
    sampling = SamplingParams(ignore_eos=True, **params)
    return SampleRow(index, sample, list(prompt), sampling, frozenset())


def _alone(model: torch.nn.Module, prompt: list[int], settings: DecodeSettings, **params: Any) -> SampleRow:
    row = _row(0, prompt, **params)
    decode(model, [row], settings)
    return row


class _JoinAt:
    """An admission source that hands over `rows` once it has been polled `after` times."""

    def __init__(self, rows: list[SampleRow], after: int) -> None:
        self.rows, self.after, self.polls = rows, after, 0

    def __call__(self, room: int) -> list[SampleRow]:
        self.polls += 1
        if self.polls <= self.after or not self.rows:
            return []
        out, self.rows = self.rows[:room], self.rows[room:]
        return out


def _forward_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("joiner_text", ["a joining prompt that is much longer than the running ones", "hi"])
def test_greedy_row_joining_mid_decode_matches_decoding_alone(
    sharp: torch.nn.Module, settings: DecodeSettings, encode: Any, joiner_text: str
) -> None:
    running = [_row(0, encode("running one"), temperature=0.0, max_tokens=30, logprobs=True)]
    running.append(_row(1, encode("second running row"), temperature=0.0, max_tokens=12, logprobs=True))
    joiner = _row(2, encode(joiner_text), temperature=0.0, max_tokens=20, logprobs=True)
    stats = decode(sharp, running, settings, admit=_JoinAt([joiner], after=6))
    assert stats.joins == 1 and stats.peak_rows == 3
    for row in [*running, joiner]:
        alone = _alone(sharp, row.prompt_ids, settings, temperature=0.0, max_tokens=row.params.max_tokens)
        assert row.token_ids == alone.token_ids
        ref = _forward_logprobs(sharp, row.prompt_ids, row.token_ids, 1.0)
        assert torch.max(torch.abs(ref - torch.tensor(row.logprobs))).item() < 1e-4


def test_seeded_row_joining_mid_decode_samples_as_alone(
    model: torch.nn.Module, settings: DecodeSettings, encode: Any
) -> None:
    sharp = model  # a fresh, near-uniform model: sampling really draws from many tokens
    params = {"temperature": 0.9, "seed": 17, "max_tokens": 25, "logprobs": True}
    running = [_row(0, encode(f"row {i} is running") + [7] * i, **params | {"seed": i}) for i in range(3)]
    joiners = [_row(3, encode("late"), sample=s, **params) for s in range(2)]
    stats = decode(sharp, running, settings, admit=_JoinAt(joiners, after=9))
    assert stats.joins == 1
    for s, row in enumerate(joiners):
        alone = _row(0, encode("late"), sample=s, **params)
        decode(sharp, [alone], settings)
        assert row.token_ids == alone.token_ids
        ref = _forward_logprobs(sharp, row.prompt_ids, row.token_ids, 0.9)
        assert torch.max(torch.abs(ref - torch.tensor(row.logprobs))).item() < 1e-4
    assert joiners[0].token_ids != joiners[1].token_ids  # two samples, two streams


def test_admission_respects_the_row_budget_and_drains(
    sharp: torch.nn.Module, settings: DecodeSettings, encode: Any
) -> None:
    budget = DecodeSettings(pad_token_id=settings.pad_token_id, max_positions=1024, max_rows=3)
    waiting = [_row(i, encode(f"queued {i}"), temperature=0.0, max_tokens=4 + 3 * i) for i in range(8)]
    rooms: list[int] = []

    def admit(room: int) -> list[SampleRow]:
        rooms.append(room)
        out = waiting[:room]
        del waiting[:room]
        return out

    stats = decode(sharp, [], budget, admit=admit)
    assert not waiting and stats.peak_rows == 3 and max(rooms) <= 3
    assert stats.joins >= 1  # rows joined while others were still running


def test_finished_long_prompt_is_trimmed_from_the_left(
    sharp: torch.nn.Module, settings: DecodeSettings, encode: Any
) -> None:
    long_row = _row(0, encode("x" * 40), temperature=0.0, max_tokens=2)
    short_row = _row(1, encode("short"), temperature=0.0, max_tokens=10)
    with torch.inference_mode():
        batch = RunningBatch.prefill(sharp, [long_row, short_row], settings)
        assert batch.mask.shape[1] == 40
        for _ in range(2):
            batch.sample(settings, None)
            batch.compact()
            batch.advance(sharp, settings)
        assert long_row.finish_reason == "length"
        batch.sample(settings, None)
        batch.compact()
        # only the short row is left: its prompt plus the tokens fed so far, no padding columns
        assert batch.size == 1 and batch.mask.shape[1] == len(encode("short")) + 2
        assert int(batch.mask.sum()) == batch.mask.numel()
        assert batch.cache.get_seq_length() == batch.mask.shape[1]


@pytest.fixture
def small_engine(model: torch.nn.Module, tok: Any) -> Iterator[HFEngine]:
    """A fresh (near-uniform) model, so seeded samples really differ, and room for only 4 rows."""
    eng = HFEngine(model, tok, HFEngineConfig(max_batch_rows=4, gather_s=0.0))
    yield eng
    eng.close()


def _req(prompt: list[int], **sampling: Any) -> GenerationRequest:
    return GenerationRequest(prompt_ids=prompt, sampling=SamplingParams(ignore_eos=True, **sampling))


def test_callers_arriving_at_different_times_get_their_own_results(
    small_engine: HFEngine, model: torch.nn.Module, tok: Any, encode: Any
) -> None:
    rng = random.Random(0)
    reqs = [
        _req(
            encode(f"caller {i} " + "z" * rng.randint(0, 30)),
            n=rng.choice([1, 2, 3]),
            seed=i,
            temperature=rng.choice([0.0, 0.7, 1.0]),
            max_tokens=rng.randint(3, 40),
            logprobs=True,
        )
        for i in range(14)
    ]
    delays = [rng.uniform(0.0, 0.15) for _ in reqs]

    async def call(r: GenerationRequest, delay: float) -> Any:
        await asyncio.sleep(delay)
        return await small_engine.agenerate(r)

    async def run_all() -> list[Any]:
        return await asyncio.gather(*(call(r, d) for r, d in zip(reqs, delays, strict=True)))

    got = asyncio.run(run_all())
    assert small_engine.joins > 0  # some callers really joined a running batch
    assert 1 < small_engine.peak_batch_rows <= 4
    reference = HFEngine(model, tok, HFEngineConfig(max_batch_rows=64))
    for r, completions in zip(reqs, got, strict=True):
        [alone] = reference.generate([r])
        assert [c.sample_index for c in completions] == list(range(r.sampling.n))
        assert [c.token_ids for c in completions] == [c.token_ids for c in alone]
        for c in completions:
            assert c.logprobs == pytest.approx(alone[completions.index(c)].logprobs, abs=1e-4)


def test_generate_refills_the_batch_and_splits_large_n(small_engine: HFEngine, encode: Any) -> None:
    reqs = [_req(encode(f"p{i}"), seed=i, max_tokens=3 + 5 * (i % 3)) for i in range(6)]
    reqs.append(_req(encode("group"), n=6, seed=99, max_tokens=8))  # more samples than max_batch_rows
    out = small_engine.generate(reqs)
    assert small_engine.peak_batch_rows == 4
    for r, completions in zip(reqs, out, strict=True):
        alone = HFEngine(small_engine.model, small_engine.tokenizer).generate([r])[0]
        assert [c.token_ids for c in completions] == [c.token_ids for c in alone]
    assert len({tuple(c.token_ids) for c in out[-1]}) == 6


def test_a_request_that_breaks_its_prefill_fails_alone(
    small_engine: HFEngine, model: torch.nn.Module, encode: Any
) -> None:
    poison = encode("~")[0]

    def fault(_module: Any, args: tuple[Any, ...]) -> None:
        if args[0].shape[1] > 1 and bool((args[0] == poison).any()):  # a prefill holding the poison token
            raise RuntimeError("injected fault for the poisoned prompt")

    long_req = _req(encode("long running"), seed=1, max_tokens=600)  # ~0.5 s: outlives the others
    bad = _req(encode("bad ~ prompt"), max_tokens=5)
    later = _req(encode("after the bad one"), seed=2, max_tokens=10)

    async def run() -> list[Any]:
        first = asyncio.ensure_future(small_engine.agenerate(long_req))
        await asyncio.sleep(0.05)  # the long request is decoding: the others join it
        rest = await asyncio.gather(small_engine.agenerate(bad), small_engine.agenerate(later), return_exceptions=True)
        return [await first, *rest]

    hook = model.model.embed_tokens.register_forward_pre_hook(fault)
    try:
        got_long, got_bad, got_later = asyncio.run(run())
    finally:
        hook.remove()
    assert isinstance(got_bad, RuntimeError) and "injected" in str(got_bad)
    assert small_engine.joins >= 1
    for r, got in [(long_req, got_long), (later, got_later)]:
        assert got[0].token_ids == small_engine.generate([r])[0][0].token_ids


def test_out_of_vocabulary_prompt_id_is_rejected_with_the_field(small_engine: HFEngine) -> None:
    with pytest.raises(ValueError, match=r"prompt_ids holds token id 100000, outside the model's vocabulary"):
        asyncio.run(small_engine.agenerate(_req([5, 100000], max_tokens=2)))
    with pytest.raises(ValueError, match="vocabulary"):
        small_engine.generate([_req([5, 6], max_tokens=2), _req([-1], max_tokens=2)])


def test_multimodal_requests_decode_in_their_own_batch(small_engine: HFEngine, encode: Any) -> None:
    """Extra forward inputs are per request, so such requests never join; results match the text path."""
    text = [_req(encode(f"text {i}"), seed=i, max_tokens=12) for i in range(3)]
    extra = {"output_hidden_states": False}  # a forward kwarg every causal LM accepts; stands in for pixels
    mm = [dataclasses.replace(r, multimodal=extra) for r in text]

    async def run() -> list[Any]:
        return await asyncio.gather(*(small_engine.agenerate(r) for r in [*text, *mm]))

    got = asyncio.run(run())
    assert [g[0].token_ids for g in got[:3]] == [g[0].token_ids for g in got[3:]]
    runs_before = small_engine.batches_run
    small_engine.generate(mm)
    assert small_engine.batches_run - runs_before == 3  # one decode per multimodal request


def test_rows_taking_finished_rows_places_decode_as_alone(
    model: torch.nn.Module, settings: DecodeSettings, encode: Any
) -> None:
    """Rows finish at different steps and waiting ones take their place (the finished rows are dropped in the
    same cache rewrite that joins the newcomers): every row samples exactly what it samples alone."""

    def make(i: int, max_tokens: int | None = None) -> SampleRow:
        budget = max_tokens if max_tokens is not None else 2 + 3 * (i % 4)
        prompt = encode("p" * (3 + 7 * (i % 3)) + f" {i}")
        return _row(i, prompt, temperature=1.0, seed=i, max_tokens=budget, logprobs=True)

    waiting = [make(i) for i in range(9)]
    done = list(waiting)
    three_rows = DecodeSettings(pad_token_id=settings.pad_token_id, max_positions=1024, max_rows=3)
    stats = decode(model, [], three_rows, admit=lambda room: [waiting.pop(0) for _ in range(min(room, len(waiting)))])
    assert not waiting and stats.joins >= 3 and stats.peak_rows == 3
    assert 0 < stats.filled_in_place < stats.joins  # both ways of joining were taken
    for row in done:
        alone = make(row.request_index)
        decode(model, [alone], settings)
        assert row.token_ids == alone.token_ids
        reference = _forward_logprobs(model, row.prompt_ids, row.token_ids, 1.0)
        assert row.logprobs == pytest.approx(reference.tolist(), abs=1e-4)


def test_cancelled_caller_frees_its_row_and_a_queued_one_is_never_prefilled(
    model: torch.nn.Module, tok: Any, encode: Any
) -> None:
    """A caller cancelled mid-decode (asyncio.wait_for, a failed sibling in a TaskGroup) ends its rows at the next
    step: with one row of room, the request behind it runs next instead of waiting out its 1000 tokens. A request
    cancelled while still queued is dropped without a prefill."""
    eng = HFEngine(model, tok, HFEngineConfig(max_batch_rows=1, gather_s=0.0))
    long = GenerationRequest(prompt_ids=encode("abc"), sampling=SamplingParams(max_tokens=1000, ignore_eos=True))
    queued = GenerationRequest(prompt_ids=encode("queued"), sampling=SamplingParams(max_tokens=5, ignore_eos=True))
    short = GenerationRequest(prompt_ids=encode("xy"), sampling=SamplingParams(max_tokens=3, ignore_eos=True))

    async def main() -> list[Any]:
        running = asyncio.create_task(eng.agenerate(long))
        while eng.decode_stats.steps < 2:  # `long` holds the only row
            await asyncio.sleep(0.001)
        waiting = asyncio.create_task(eng.agenerate(queued))
        await asyncio.sleep(0)  # queued behind `long`
        waiting.cancel()
        running.cancel()
        for task in (running, waiting):
            with pytest.raises(asyncio.CancelledError):
                await task
        return await eng.agenerate(short)

    try:
        steps_before = eng.decode_stats.steps
        out = asyncio.run(main())
    finally:
        eng.close()
    assert [len(c.token_ids) for c in out] == [3] and out[0].finish_reason == "length"
    # `long` ran a few steps at most past its cancel, then `short` its 3; `long` alone would have taken 999
    assert eng.decode_stats.steps - steps_before < 500
    # prefills: `long` (3 tokens) and `short` (2); never `queued` (6)
    assert eng.decode_stats.prefill_tokens == 3 + 2


def test_cancelled_multimodal_caller_is_never_decoded_or_stops_at_once(
    model: torch.nn.Module, tok: Any, encode: Any
) -> None:
    """Multimodal requests decode alone, outside the continuous batch; a caller that gave up must not hold the
    engine either: cancelled while queued, it is never prefilled; cancelled while decoding, its rows end at the
    next step instead of running out their 1000 tokens."""
    eng = HFEngine(model, tok, HFEngineConfig(max_batch_rows=1, gather_s=0.0))
    extra = {"output_hidden_states": False}  # a forward kwarg every causal LM accepts; stands in for pixels
    long = SamplingParams(max_tokens=1000, ignore_eos=True)
    text = GenerationRequest(prompt_ids=encode("abc"), sampling=long)
    queued = GenerationRequest(prompt_ids=encode("queued"), sampling=long, multimodal=extra)
    image = GenerationRequest(prompt_ids=encode("pic"), sampling=long, multimodal=extra)
    short = GenerationRequest(prompt_ids=encode("xy"), sampling=SamplingParams(max_tokens=3, ignore_eos=True))

    async def cancel_after_two_steps(request: GenerationRequest, queue: GenerationRequest | None = None) -> None:
        start = eng.decode_stats.steps
        running = asyncio.create_task(eng.agenerate(request))
        while eng.decode_stats.steps < start + 2:
            await asyncio.sleep(0.001)
        waiting = asyncio.create_task(eng.agenerate(queue)) if queue is not None else None
        await asyncio.sleep(0)
        for task in (running, waiting):
            if task is not None:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    async def main() -> list[Any]:
        await cancel_after_two_steps(text, queue=queued)  # the multimodal request waits behind `text`
        await cancel_after_two_steps(image)  # the multimodal request itself is decoding
        return await eng.agenerate(short)

    try:
        out = asyncio.run(main())
    finally:
        eng.close()
    assert [len(c.token_ids) for c in out] == [3]
    # prefills: `text` (3 tokens), `image` (3) and `short` (2); never `queued` (6)
    assert eng.decode_stats.prefill_tokens == 3 + 3 + 2
    # each cancelled request ran a few steps past its cancel, then `short` its 3; either alone would take 999
    assert eng.decode_stats.steps < 500


@pytest.mark.parametrize("joiner", [None, "a waiting prompt far wider than the abandoned row's columns"])
def test_a_batch_whose_every_row_is_abandoned_starts_afresh(
    model: torch.nn.Module, settings: DecodeSettings, encode: Any, joiner: str | None
) -> None:
    """The only running row's caller goes (an agent's sole conversation timed out): the loop must not compact the
    batch to nothing (an IndexError ended the run), nor join a wider newcomer onto an empty batch (its caller got
    that IndexError); the newcomer then decodes exactly as alone."""
    gone = _row(0, encode("abc"), max_tokens=50)
    later = [_row(1, encode(joiner), max_tokens=4, temperature=0.0)] if joiner is not None else []
    admit = iter([[gone], [], later])  # `later` arrives at the step `gone` is abandoned

    decode(
        model,
        [],
        settings,
        admit=lambda room: next(admit, []),
        abandoned=lambda row: row is gone and len(row.token_ids) >= 2,
    )
    assert (gone.finish_reason, len(gone.token_ids)) == ("abort", 2)
    if joiner is not None:
        alone = _alone(model, encode(joiner), settings, max_tokens=4, temperature=0.0)
        assert (later[0].finish_reason, later[0].token_ids) == ("length", alone.token_ids)
