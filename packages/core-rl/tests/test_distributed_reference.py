"""The sharded reference of a LoRA run is the adapter-free base model, as the in-process `ReferencePolicy`.

With LoRA the reference shares the actor's sharded model; its log-probs must come with the adapter switched off,
or the KL to the reference measures the policy against itself. Checked on a one-rank gloo group in this process
(FSDP2 sharding needs a process group; no Ray), against a plain forward of the base model.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_workers import random_batch
from transformers import AutoModelForCausalLM

from rlloom.core_rl.config.schema import ModelConfig
from rlloom.core_rl.distributed.fsdp import shard_model
from rlloom.core_rl.distributed.ranks import RankContext, ShardedReference
from rlloom.core_rl.workers.actor import load_causal_lm

CPU = torch.device("cpu")


@pytest.fixture
def one_rank_group() -> Iterator[RankContext]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield RankContext(0, 1, CPU)
    finally:
        dist.destroy_process_group()


def test_sharded_lora_reference_gives_the_base_models_logprobs(
    tiny_model_dir: Path, one_rank_group: RankContext
) -> None:
    pytest.importorskip("peft")
    model = load_causal_lm(ModelConfig(path=str(tiny_model_dir), lora_rank=4, lora_alpha=8), str(tiny_model_dir), CPU)
    with torch.no_grad():  # a trained adapter (peft starts lora_B at zero, which would hide the bug)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(generator=torch.Generator().manual_seed(1))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = random_batch(base.config.vocab_size)
    reference = ShardedReference(
        shard_model(model), one_rank_group, max_tokens=1000, packed=False, device=CPU, bf16=False
    )
    rows, logprobs, _ = reference.rank_logprobs(batch, temperature=0.7)
    assert rows == list(range(batch.batch_size))
    for i in range(batch.batch_size):
        plen, rlen = int(batch["prompt_lengths"][i]), int(batch["response_lengths"][i])
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].unsqueeze(0)
        with torch.no_grad():
            logits = base(input_ids=ids).logits[0, plen - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, plen:, None]).squeeze(-1)
        torch.testing.assert_close(logprobs[i, :rlen], expected, rtol=1e-5, atol=1e-5)
    # the adapter is back on afterwards: the actor sharing the model still trains the policy
    assert not model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters
