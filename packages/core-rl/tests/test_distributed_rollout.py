"""A rollout engine on every rank (gloo on CPU), checked against one engine on the in-process actor's module.

The expectation is independent of the ranks: `SeededEngine` samples each request's n samples from generators
seeded by the request's seed, so the same weights give the same tokens whichever replica a request lands on.
Before and after a PPO update (the ranks loading their replicas from their own shards), the two ranks' replicas
must return what one engine on the single-process `PolicyActor`'s module returns, and both must have worked.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from test_workers import random_batch
from tiny_run import SamplingEngine, digit_reward, sum_rows, tiny_config
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlloom.core_rl.contracts.generation import Completion, GenerationRequest, SamplingParams
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm
from rlloom.core_rl.workers.settings import actor_settings
from rlloom.core_rl.workers.tokenizer_loading import load_pretrained_tokenizer
from rlloom.core_rl.workers.weight_sync import EngineWeights

ray = pytest.importorskip("ray")
import tiny_run  # noqa: E402

from rlloom.core_rl.distributed.rank_engines import RankEngines  # noqa: E402
from rlloom.core_rl.distributed.ray_group import RayActorGroup  # noqa: E402
from rlloom.core_rl.distributed.ray_start import start_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.ray]
CPU = torch.device("cpu")
TESTS = Path(__file__).resolve().parent
SHIP_TESTS = {"env_vars": {"PYTHONPATH": str(TESTS)}}  # the ranks unpickle SeededEngine from this folder


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    # The engine factory below travels to the rank processes by value: neither this file nor tiny_run is importable
    # there (tests/ is on this process's sys.path only, and the installed-wheel session runs from a temp folder).
    ray.cloudpickle.register_pickle_by_value(tiny_run)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    start_ray(None, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class SeededEngine(SamplingEngine):
    """Samples token by token from the module it is given, sample k of a seeded request from a generator seeded
    with (seed, k): the tokens depend on the weights and the seed only, not on the batch or the process."""

    def __init__(self, module: nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        self.model = module.eval()
        self.tokenizer = tokenizer
        self.weight_updates = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        return [[self._sample(r, k) for k in range(r.sampling.n)] for r in requests]

    def _sample(self, request: GenerationRequest, k: int) -> Completion:
        params = request.sampling
        gen = torch.Generator().manual_seed(params.seed * 1000 + k) if params.seed is not None else None
        prompt = self._prompt_ids(request)
        ids, logprobs = list(prompt), []
        with torch.no_grad():
            for _ in range(params.max_tokens):
                logits = self.model(torch.tensor([ids])).logits[0, -1].float() / params.temperature
                probs = torch.softmax(logits, -1)
                token = int(torch.multinomial(probs, 1, generator=gen))
                ids.append(token)
                logprobs.append(float(torch.log(probs[token])))
                if token == self.tokenizer.eos_token_id:
                    break
        tokens = ids[len(prompt) :]
        return Completion(
            request_id=request.request_id,
            prompt_ids=prompt,
            token_ids=tokens,
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            finish_reason="stop" if tokens[-1] == self.tokenizer.eos_token_id else "length",
            logprobs=logprobs,
            sample_index=k,
        )


def seeded_factory(tokenizer: PreTrainedTokenizerBase):  # type: ignore[no-untyped-def]
    return lambda module: SeededEngine(module, tokenizer)


def requests(count: int, vocab: int) -> list[GenerationRequest]:
    gen = torch.Generator().manual_seed(3)
    return [
        GenerationRequest(
            prompt_ids=torch.randint(10, vocab, (3 + i,), generator=gen).tolist(),
            sampling=SamplingParams(n=2, temperature=1.0, max_tokens=5, seed=i),
        )
        for i in range(count)
    ]


def assert_same_samples(got: list[list[Completion]], expected: list[list[Completion]]) -> None:
    for got_samples, expected_samples in zip(got, expected, strict=True):
        for a, b in zip(got_samples, expected_samples, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_each_rank_hosts_a_replica_that_samples_as_one_process_before_and_after_an_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """engine= a factory, with 2 ranks: the trainer's engine is a replica on each rank (the default), which sample as
    one engine on the in-process actor's module does, before and after an update; then the trainer trains on them."""
    tokenizer = load_pretrained_tokenizer(tiny_model_dir)
    overrides = ["trainer.total_steps=2", "algorithm.kl.use_loss=false", "actor.warmup_steps=0", "actor.lr=1e-2",
                 "distributed.num_ranks=2", "distributed.cpus_per_rank=0.5", "distributed.timeout_s=300",
                 f"distributed.runtime_env={SHIP_TESTS}"]  # fmt: skip
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", overrides)
    trainer = Trainer(cfg, engine=seeded_factory(tokenizer), reward_fn=digit_reward, train_data=sum_rows(8))
    engines, group = trainer.engine, trainer.parts.actor
    assert isinstance(engines, RankEngines) and isinstance(group, RayActorGroup)
    single = PolicyActor(load_causal_lm(cfg.model, str(tiny_model_dir), CPU), **actor_settings(cfg, 2, CPU))
    local = SeededEngine(single.model, tokenizer)  # the in-process engine: on the actor's own module
    vocab = single.model.config.vocab_size
    asked = requests(6, vocab)
    before = local.generate(asked)
    assert_same_samples(engines.generate(asked), before)
    served = engines.requests_served()
    assert sum(served) == 6 and min(served) >= 2, served  # spread by load: both replicas generated

    batch = random_batch(vocab)
    old, _ = single.compute_logprobs(batch, temperature=1.0)
    batch["old_logprobs"] = old
    single.update_policy(batch)
    group.update_policy(batch)
    # the trainer's sync: each rank gathers its shards a bucket at a time into its own replica
    weights = EngineWeights(group, engines, bucket_bytes=4096, step=0)
    weights.actor_step = 1
    weights.refresh()
    assert weights.engine_step == 1 and engines.sync_from_ranks(4096) > 3  # several buckets
    after = local.generate(asked)
    assert any(a[0].logprobs != b[0].logprobs for a, b in zip(after, before, strict=True))  # the policy moved
    assert_same_samples(engines.generate(asked), after)

    # agent turns (agenerate) go to the replica with the least pending work: concurrent ones to both
    async def turns() -> list[list[Completion]]:
        return list(await asyncio.gather(*(engines.agenerate(r) for r in asked[:4])))

    assert_same_samples(asyncio.run(turns()), after[:4])
    served_now = engines.requests_served()
    assert all(now - then >= 2 for now, then in zip(served_now, served, strict=True)), (served, served_now)

    # the trainer rolls out on both replicas and syncs them after each update
    trainer.fit()
    assert all(now > then for now, then in zip(engines.requests_served(), served_now, strict=True))
    assert trainer.weights.engine_step == 2
    group.close()
