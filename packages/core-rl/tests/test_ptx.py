"""PPO-ptx (InstructGPT's pretraining mix, `algorithm.ptx`): the update's gradient is the
policy gradient plus ptx_coef times the LM NLL gradient computed independently; ptx_coef=0 leaves the update as it
was; the ptx rows cycle epoch by epoch and a resumed run draws the rows an uninterrupted one would; bad configs and
rows are refused, naming the key or file:line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_run import SamplingEngine, digit_reward, run, sum_rows, tiny_config

from rlloom.core_rl.config.keys import ConfigError
from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.config.schema import ActorConfig, AlgorithmConfig, ModelConfig, PtxConfig
from rlloom.core_rl.contracts.batch import TrajectoryBatch
from rlloom.core_rl.contracts.trajectory import Trajectory
from rlloom.core_rl.data.loader import PromptLoader
from rlloom.core_rl.data.ptx import ptx_trajectory, read_ptx_rows
from rlloom.core_rl.data.rows import DataError
from rlloom.core_rl.run.checkpoint import load_trainer_state
from rlloom.core_rl.tiny import char_tokenizer
from rlloom.core_rl.trainer import Trainer
from rlloom.core_rl.workers import actor as actor_module
from rlloom.core_rl.workers.actor import PolicyActor, load_causal_lm

CPU = torch.device("cpu")
PTX_TEXTS = ["1+1=2", "2+2=4 ok", "3+4=7", "9+0=9 done", "5+5=10"]


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def policy_batch(vocab: int) -> TrajectoryBatch:
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for i, (p, r) in enumerate([(4, 6), (3, 3), (5, 5), (2, 4)]):
        ids = torch.randint(10, vocab, (p + r,), generator=gen).tolist()
        trajs.append(Trajectory(prompt_ids=ids[:p], response_ids=ids[p:], loss_mask=[1] * r, group_id=str(i // 2)))
    batch = TrajectoryBatch.from_trajectories(trajs, pad_token_id=3)
    batch["advantages"] = torch.randn(batch.loss_mask.shape, generator=gen) * batch.loss_mask
    return batch


def ptx_batch_of(texts: list[str]) -> TrajectoryBatch:
    tok = char_tokenizer()
    trajs = [ptx_trajectory(tok, {"text": t}, max_length=64) for t in texts]
    return TrajectoryBatch.from_trajectories(trajs, pad_token_id=int(tok.pad_token_id))


def make_actor(model_dir: Path, ptx_coef: float) -> PolicyActor:
    model = load_causal_lm(ModelConfig(path=str(model_dir)), str(model_dir), CPU)
    ptx = PtxConfig(coef=ptx_coef, files=["rows.jsonl"]) if ptx_coef > 0 else None  # the actor reads only coef
    algo = AlgorithmConfig(ptx=ptx, policy_loss={"agg_mode": "token-mean"})
    # one optimizer step over the whole batch, micro-batched by a small token budget
    cfg = ActorConfig(lr=1e-2, ppo_epochs=1, mini_batch_size=4, shuffle=False, max_tokens_per_micro_batch=24)
    return PolicyActor(
        model, actor=cfg, algorithm=algo, total_steps=10, mini_batch_rows=4, max_response_length=6, device=CPU
    )


def captured_gradient(
    actor: PolicyActor, batch: TrajectoryBatch, monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> dict[str, torch.Tensor]:
    """The gradients the update hands to the optimizer step (which is replaced by a recorder)."""
    seen: dict[str, torch.Tensor] = {}

    def record(params: Any, optimizer: torch.optim.Optimizer, grad_clip: float | None) -> torch.Tensor:
        for name, p in actor.model.named_parameters():
            seen[name] = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        optimizer.zero_grad(set_to_none=True)
        return torch.tensor(0.0)

    monkeypatch.setattr(actor_module, "clipped_optimizer_step", record)
    actor.update_policy(batch, **kwargs)
    return seen


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step:UserWarning")  # a recorder replaces the step
def test_gradient_is_policy_gradient_plus_coef_times_lm_nll_gradient(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coef = 0.3
    ptx = ptx_batch_of(PTX_TEXTS[:3])
    with_ptx = make_actor(tiny_model_dir, coef)
    batch = policy_batch(with_ptx.model.config.vocab_size)
    combined = captured_gradient(with_ptx, batch, monkeypatch, ptx_batch=lambda: ptx)
    policy_only = captured_gradient(make_actor(tiny_model_dir, 0.0), batch, monkeypatch)

    # the NLL gradient, independently: transformers' own labels loss on each text, token-weighted over the batch
    model = load_causal_lm(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU)
    model.train()
    tok = char_tokenizer()
    ids = [[*tok(t)["input_ids"], tok.eos_token_id] for t in PTX_TEXTS[:3]]
    total = sum(len(x) - 1 for x in ids)  # every token but the first is predicted
    nll = sum(model(input_ids=torch.tensor([x]), labels=torch.tensor([x])).loss * (len(x) - 1) / total for x in ids)
    nll.backward()  # type: ignore[union-attr]
    for name, p in model.named_parameters():
        expected = policy_only[name] + coef * p.grad
        torch.testing.assert_close(combined[name], expected, rtol=1e-4, atol=1e-6)
    assert any(float(p.grad.abs().sum()) > 0 for p in model.parameters())  # type: ignore[union-attr]


def test_ptx_loss_metric_is_the_batch_nll(tiny_model_dir: Path) -> None:
    actor = make_actor(tiny_model_dir, 0.5)
    ptx = ptx_batch_of(PTX_TEXTS)
    model = load_causal_lm(ModelConfig(path=str(tiny_model_dir)), str(tiny_model_dir), CPU)
    tok = char_tokenizer()
    ids = [[*tok(t)["input_ids"], tok.eos_token_id] for t in PTX_TEXTS]
    total = sum(len(x) - 1 for x in ids)
    with torch.no_grad():
        expected = sum(
            float(model(input_ids=torch.tensor([x]), labels=torch.tensor([x])).loss) * (len(x) - 1) for x in ids
        )
    metrics = actor.update_policy(policy_batch(actor.model.config.vocab_size), ptx_batch=lambda: ptx)
    assert metrics["actor/ptx_loss"] == pytest.approx(expected / total, rel=1e-5)


def test_ptx_coef_zero_draws_nothing_and_updates_bitwise_as_before(tiny_model_dir: Path) -> None:
    drawn: list[int] = []

    def supplier() -> TrajectoryBatch:
        drawn.append(1)
        return ptx_batch_of(PTX_TEXTS)

    plain, given = make_actor(tiny_model_dir, 0.0), make_actor(tiny_model_dir, 0.0)
    batch = policy_batch(plain.model.config.vocab_size)
    metrics_plain = plain.update_policy(batch)
    metrics_given = given.update_policy(batch, ptx_batch=supplier)
    assert drawn == [] and "actor/ptx_loss" not in metrics_given
    assert metrics_plain == metrics_given
    for (name, a), (_, b) in zip(plain.model.named_parameters(), given.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_trainer_without_ptx_builds_no_loader_and_saves_none(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "plain"
    metrics = run(tiny_model_dir, out, ["trainer.total_steps=1", "actor.warmup_steps=0"])
    assert not any(k.startswith("actor/ptx") for k in metrics)
    assert load_trainer_state(out / "checkpoints" / "step_1")["ptx_loader"] is None


def test_ptx_rows_cycle_through_every_row_each_epoch() -> None:
    rows = [{"text": t} for t in PTX_TEXTS]
    loader = PromptLoader(rows, 2, shuffle=True, seed=3, source="algorithm.ptx.files")
    epochs: dict[int, list[int]] = {}
    for _ in range(9):  # 5 rows in batches of 2: [2, 2, 1] per epoch, three epochs
        epoch = loader.epoch if not loader.epoch_finished else loader.epoch + 1
        epochs.setdefault(epoch, []).extend(loader.next_batch_ids())
    assert sorted(epochs) == [0, 1, 2]
    assert all(sorted(ids) == list(range(5)) for ids in epochs.values())
    assert epochs[0] != epochs[1]  # reshuffled each epoch (OpenRLHF's itertools.cycle replays the first order)


def ptx_overrides(ptx_file: Path) -> list[str]:
    return [f"algorithm.ptx={{coef: 0.1, files: [{ptx_file}], batch_size: 2}}"]


def test_ptx_run_logs_the_loss_and_resumes_where_it_left_off(tiny_model_dir: Path, tmp_path: Path) -> None:
    ptx_file = write_rows(tmp_path / "ptx.jsonl", [{"text": t} for t in PTX_TEXTS])
    steps = ["trainer.total_steps=3", "trainer.save_every=1"]
    uninterrupted = tmp_path / "uninterrupted"
    run(tiny_model_dir, uninterrupted, [*steps, *ptx_overrides(ptx_file)])
    # tiny_grpo.yaml: 4 prompts x 4 samples in mini-batches of 3 prompts, 2 epochs → 4 optimizer steps per training
    # step, each drawing one ptx batch; 5 rows in batches of 2 are 3 draws an epoch ([2, 2, 1]), so after 2 steps
    # (8 draws) the loader is in epoch 2 with its first 2 batches (4 rows) served
    state = load_trainer_state(uninterrupted / "checkpoints" / "step_2")["ptx_loader"]
    assert (state["epoch"], state["position"], state["num_rows"]) == (2, 4, 5)
    lines = [json.loads(x) for x in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    assert all(m["actor/ptx_loss"] > 0 for m in lines)

    resumed = tmp_path / "resumed"
    run(tiny_model_dir, resumed, ["trainer.total_steps=2", "trainer.save_every=1", *ptx_overrides(ptx_file)])
    run(tiny_model_dir, resumed, [*steps, *ptx_overrides(ptx_file)])
    again = [json.loads(x) for x in (resumed / "metrics.jsonl").read_text().splitlines()]
    keep = lambda m: {k: v for k, v in m.items() if not k.startswith(("timing/", "perf/"))}  # noqa: E731
    assert [keep(m) for m in again] == [keep(m) for m in lines]
    final = [load_trainer_state(d / "checkpoints" / "step_3")["ptx_loader"] for d in (uninterrupted, resumed)]
    assert final[0] == final[1]


# ---- rows and configs ------------------------------------------------------------------------------------------


def test_ptx_trajectory_text_and_pair_rows() -> None:
    tok = char_tokenizer()
    text = ptx_trajectory(tok, {"text": "12+3"}, max_length=64)
    ids = [*tok("12+3")["input_ids"], tok.eos_token_id]
    assert text.prompt_ids + text.response_ids == ids and text.loss_mask == [1] * (len(ids) - 1)
    cut = ptx_trajectory(tok, {"text": "12+3"}, max_length=3)
    assert cut.prompt_ids + cut.response_ids == ids[:3]  # no EOS: the text goes on past the cut
    pair = ptx_trajectory(tok, {"prompt": "1+1=", "response": "2"}, max_length=64)
    from rlloom.core_rl.contracts.generation import GenerationRequest
    from rlloom.core_rl.contracts.prompts import render_prompt

    prompt = render_prompt(tok, GenerationRequest(messages=[{"role": "user", "content": "1+1="}]))
    assert pair.prompt_ids == prompt
    assert pair.response_ids == [*tok("2", add_special_tokens=False)["input_ids"], tok.eos_token_id]
    with pytest.raises(DataError, match="leaving no room for the response"):
        ptx_trajectory(tok, {"prompt": "1+1=", "response": "2"}, max_length=len(prompt))


def test_bad_ptx_rows_are_named_by_file_and_line(tmp_path: Path) -> None:
    good = write_rows(
        tmp_path / "good.jsonl", [{"text": "a"}, {"prompt": [{"role": "user", "content": "q"}], "response": "r"}]
    )
    assert len(read_ptx_rows([str(good), str(good)])) == 4
    bad = write_rows(tmp_path / "bad.jsonl", [{"text": "a"}, {"prompt": "q"}])
    with pytest.raises(DataError, match=r"bad.jsonl:2: the row has neither `text` nor `prompt` and `response`"):
        read_ptx_rows([str(bad)])
    with pytest.raises(DataError, match="algorithm.ptx.files: .*missing.jsonl does not exist"):
        read_ptx_rows([str(tmp_path / "missing.jsonl")])


def config_error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.path=/m", *overrides])
    return str(info.value)


def test_ptx_configs_are_checked_at_load() -> None:
    assert config_error(["algorithm.ptx={coef: 0.05}"]).startswith("algorithm.ptx.files: missing")
    assert config_error(["algorithm.ptx={coef: 0.05, files: []}"]).startswith("algorithm.ptx.files: list should have")
    assert config_error(["algorithm.ptx={coef: -1, files: [p.jsonl]}"]).startswith(
        "algorithm.ptx.coef: input should be greater than 0"
    )
    sharded = ["algorithm.ptx={coef: 0.05, files: [p.jsonl]}", "distributed.num_ranks=2"]
    assert config_error(sharded).startswith("algorithm.ptx: PPO-ptx runs in the in-process actor only")
    ok = load_config(None, ["model.path=/m", "algorithm.ptx={coef: 0.05, files: [p.jsonl]}"])
    assert ok.algorithm.ptx is not None
    assert (ok.algorithm.ptx.coef, ok.algorithm.ptx.batch_size, ok.algorithm.ptx.max_length) == (0.05, 8, 1024)
    # the flat keys of earlier configs: the coefficient without rows, or rows without it, name what is missing
    assert config_error(["algorithm.ptx_coef=0.05"]).startswith("algorithm.ptx.files: missing")
    assert config_error(["data.ptx_files=[p.jsonl]"]).startswith(
        "data.ptx_files: ['p.jsonl'] is a setting of algorithm.ptx, which is off"
    )
    assert config_error(["data.ptx_batch_size=4"]).startswith("data.ptx_batch_size: 4 is a setting of algorithm.ptx")


def test_trainer_refuses_missing_ptx_files_before_loading_a_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tiny_config(tiny_model_dir, tmp_path / "out", ptx_overrides(tmp_path / "nowhere.jsonl"))
    with pytest.raises(DataError, match="nowhere.jsonl does not exist"):
        Trainer(config, engine=SamplingEngine(tiny_model_dir), reward_fn=digit_reward, train_data=sum_rows(8))
