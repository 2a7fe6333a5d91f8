"""The rollout engine of a training command, chosen by `rollout.engine` (the apps' `--engine`): one builder for
every app, so `train.py` only calls it and closes what it built.

Whatever it builds goes to the Trainer's one `engine=`. `hf` hands it a factory that builds an `HFEngine` on the
actor's own module (today's default: no weight copy, no transfer). `vllm` starts vLLM on `model.path` in the
compute dtype `model.dtype`, the weights the actor starts from, and hands it the engine itself: the trainer pushes
the actor's weights into it at the start of `fit()` (a resumed run's checkpoint weights, before the first rollout)
and after every update, with `sleep`/`wake_up` around the update (the engine's `SleepMode`) where the platform has
vLLM's sleep mode. Multi-turn agents get `VLLMAsyncEngine`, so a conversation rejoins the running batch as soon as
its tool call returns.

With `distributed.num_ranks` > 1 and `distributed.rollout_on_ranks` (the default), `vllm` hands the Trainer a
`VLLMReplicas` provider instead (core-rl's `ReplicaFactory`): it is pickled to every rank process, which starts its
own vLLM replica beside its shard (seed `trainer.seed` + rank) and loads it from its own shards at every sync
(core-rl's `rank_engines`).

`vllm_server` samples from a vLLM OpenAI server started apart (`rollout.vllm_server.url`, `VLLMServerEngine`),
with the same weight pushes over HTTP; nothing is started here and closing leaves the server running.

`vllm_options` is the extension point for what a model family needs beyond text (a vision-language app passes the
`VLLMEngineConfig` fields its images need); the config's own vLLM settings are `rollout.vllm`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.contracts.engines import Closable, EngineSource

if TYPE_CHECKING:
    from torch import nn

    from rlloom.core_rl.contracts.engines import RolloutEngine
    from rlloom.rollout.hf.engine import HFEngineConfig
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

logger = logging.getLogger(__name__)


@dataclass
class TrainingEngine:
    """What the Trainer samples from, as its `engine=` takes it: a ready engine (vLLM, with weights of its own) or
    a provider of one (HF built on the actor's module, vLLM replicas built on each rank). `close()` (or `with`)
    shuts down every engine built, vLLM's process included."""

    engine: EngineSource
    built: list[Any] = field(default_factory=list)

    def trainer_kwargs(self) -> dict[str, Any]:
        """`engine=`, as `train(...)` / `Trainer(...)` take it."""
        return {"engine": self.engine}

    def close(self) -> None:
        while self.built:
            engine = self.built.pop()
            if isinstance(engine, Closable):
                engine.close()

    def __enter__(self) -> TrainingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def vllm_engine_config(config: RLConfig, vllm_options: Mapping[str, Any] | None = None) -> VLLMEngineConfig:
    """`rollout.vllm` as `VLLMEngineConfig`: the model and tokenizer the actor loads, its compute dtype (unless
    `rollout.vllm.dtype` names another), the run's seed and weight-bucket size; `vllm_options` adds or replaces
    fields (e.g. a vision model's)."""
    from rlloom.rollout.vllm.engine import VLLMEngineConfig

    model, vllm = config.model, config.rollout.vllm
    fields: dict[str, Any] = {
        "model": model.path,
        "tokenizer": model.tokenizer_path or model.path,
        "dtype": vllm.dtype or model.dtype,
        "max_num_seqs": vllm.max_num_seqs,
        "tensor_parallel_size": vllm.tensor_parallel_size,
        "gpu_memory_utilization": vllm.gpu_memory_utilization,
        "max_model_len": vllm.max_model_len,
        "enable_prefix_caching": vllm.enable_prefix_caching,
        "enable_sleep_mode": vllm.enable_sleep_mode,
        "enforce_eager": vllm.enforce_eager,
        "seed": config.trainer.seed,
        "weight_bucket_bytes": config.distributed.weight_bucket_bytes,
        "sync_timeout_s": vllm.sync_timeout_s,
        "cpu_kvcache_space_gib": vllm.cpu_kvcache_space_gib,
        "logprobs_mode": logprobs_mode(config),
        **inflight_kv_asked(config),
        **(vllm_options or {}),
    }
    return VLLMEngineConfig(**fields)


@dataclass(frozen=True)
class VLLMReplicas:
    """The Trainer's `engine=` for vLLM on every rank (`distributed.rollout_on_ranks`, core-rl's `ReplicaFactory`): it
    travels pickled to each rank process and starts a replica there on `config.model` (`VLLMAsyncEngine` for
    multi-turn agents). Each replica samples with seed `config.seed` + rank, so replicas draw different streams
    for unseeded requests; a request's own seed decides its samples on whichever replica it lands."""

    config: VLLMEngineConfig
    multi_turn: bool = False

    def replica_config(self, rank: int) -> VLLMEngineConfig:
        """The config rank `rank`'s replica starts with: its own seed, and vLLM in processes of its own. In the
        rank's process (`in_process`), vLLM would take the trainer's torch.distributed world for its own and draw
        unseeded samples from the rank's torch generator, which every rank seeds alike: tried on 2 gloo ranks, it
        trained, but both replicas sampled the same unseeded streams."""
        return self.config.model_copy(update={"seed": self.config.seed + rank, "in_process": False})

    def build_replica(self, rank: int) -> RolloutEngine:
        config = self.replica_config(rank)
        engine: Any
        if self.multi_turn:
            from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine

            engine = VLLMAsyncEngine(config)
        else:
            from rlloom.rollout.vllm.engine import VLLMEngine

            engine = VLLMEngine(config)
        logger.info(
            "rank %d: vLLM replica (%s) from %s, seed %d", rank, type(engine).__name__, config.model, config.seed
        )
        return engine  # type: ignore[no-any-return]

    def __call__(self, module: nn.Module) -> RolloutEngine:
        """As a plain `EngineFactory` (one engine, on the driver): the module is not used, vLLM loads its own."""
        return self.build_replica(0)


def replicas_on_ranks(config: RLConfig) -> bool:
    """Whether the Trainer will host the rollout engine on its ranks: several ranks, `rollout_on_ranks`."""
    dcfg = config.distributed
    return dcfg.rollout_placement == "colocated" and dcfg.num_ranks > 1 and dcfg.rollout_on_ranks


def replicas_apart(config: RLConfig) -> bool:
    """Whether each replica starts in a process of the Trainer's choosing (a rank, or a generator actor of
    `distributed.rollout_placement=separate`), so the engine must be a factory that travels there, not an engine."""
    return replicas_on_ranks(config) or config.distributed.rollout_placement == "separate"


def check_on_ranks(config: RLConfig) -> None:
    """Refuse, in one line, the engines that cannot be replicated onto the ranks or the generator actors."""
    if not replicas_apart(config):
        return
    if config.distributed.rollout_placement == "separate":
        if config.rollout.engine == "vllm_server":
            raise ValueError(
                "rollout.engine=vllm_server with distributed.rollout_placement=separate: a server started apart "
                "already is its own generator; set distributed.rollout_placement=colocated (the server samples, "
                "synced through the driver) or rollout.engine=vllm (a vLLM replica on each generator actor)"
            )
        return
    ranks = config.distributed.num_ranks
    if config.rollout.engine == "vllm_server":
        raise ValueError(
            f"rollout.engine=vllm_server with distributed.rollout_on_ranks=true ({ranks} ranks): a server started "
            "apart cannot have a replica on every rank; set distributed.rollout_on_ranks=false (the server samples, "
            "synced through the driver) or rollout.engine=vllm (a vLLM replica on every rank)"
        )
    if config.rollout.engine == "vllm" and config.rollout.vllm.tensor_parallel_size > 1:
        raise ValueError(
            f"rollout.vllm.tensor_parallel_size={config.rollout.vllm.tensor_parallel_size} with "
            "distributed.rollout_on_ranks=true: each rank's replica runs on that rank's own GPU; set "
            "rollout.vllm.tensor_parallel_size=1, or distributed.rollout_on_ranks=false for one engine on the driver"
        )


def replica_memory_share(config: RLConfig) -> float:
    """`rollout.vllm.gpu_memory_utilization` for one rank's replica: the configured share of the rank's GPU, scaled
    by `distributed.gpus_per_rank` when ranks share a GPU (vLLM counts the whole device's memory)."""
    share, gpus = config.rollout.vllm.gpu_memory_utilization, config.distributed.gpus_per_rank
    return share * gpus if gpus is not None and 0.0 < gpus < 1.0 else share


def vllm_server_engine(config: RLConfig) -> Any:
    """`rollout.vllm_server` as a `VLLMServerEngine`: the server's model name is the configured one, else the one
    model it lists (else model.path's folder name); weight buckets as `distributed.weight_bucket_mb` says."""
    from rlloom.rollout.policy_spec import served_model_name
    from rlloom.rollout.vllm.server_engine import VLLMServerConfig, VLLMServerEngine

    server = config.rollout.vllm_server
    assert server.url is not None  # RolloutConfig refuses vllm_server without a url
    base = server.url.rstrip("/")
    base = base if base.endswith("/v1") else f"{base}/v1"
    name = server.served_model or served_model_name(base, Path(config.model.path).name)
    engine_config = VLLMServerConfig(
        base_url=base,
        model=name,
        api_key=server.api_key,
        weight_bucket_bytes=config.distributed.weight_bucket_bytes,
        sync_timeout_s=server.sync_timeout_s,
    ).model_copy(update=inflight_kv_asked(config))
    logger.info("rollouts on the vLLM server %s (%s), synced from the actor after every update", base, name)
    return VLLMServerEngine(engine_config)


def logprobs_mode(config: RLConfig) -> Literal["processed_logprobs", "raw_logprobs"]:
    """Which of vLLM's log-probs equal the trainer's, log_softmax(logits / temperature) over the whole vocabulary.

    vLLM's processed log-probs come after temperature but also after top-p/top-k/min-p truncation, renormalised
    over the kept tokens (Search-R1's top_p 0.95 puts every one log(0.95) = 0.05 above the trainer's); its raw
    log-probs come before both. At temperature 1 raw is exact whatever the truncation; otherwise processed is,
    when nothing is truncated, and the remaining case is logged once (the mismatch/* metrics will show it)."""
    rollout = config.rollout
    if rollout.temperature == 1.0:
        return "raw_logprobs"
    if rollout.top_p < 1.0 or rollout.top_k > 0 or rollout.min_p > 0.0:
        logger.warning(
            "rollout.temperature=%g with top_p/top_k/min_p truncation: vLLM's log-probs are renormalised over the "
            "kept tokens, so they sit above the trainer's by the kept mass's log (see mismatch/*); TIS "
            "(algorithm.tis) reads them as they are",
            rollout.temperature,
        )
    return "processed_logprobs"


def check_training_engine(config: RLConfig, vllm_options: Mapping[str, Any] | None = None) -> None:
    """Before any data or model loads: with `rollout.engine=vllm`, vLLM must be installed at a verified version
    and run the model (vLLM's CPU attention refuses some head sizes). Raises `ImportError` / `ValueError` with
    one line naming the fix; the apps print it as `--engine vllm: ...`."""
    check_on_ranks(config)
    if config.rollout.engine != "vllm":
        return
    from rlloom.rollout.vllm.engine import prepare_platform

    prepare_platform(vllm_engine_config(config, vllm_options))


def engine_problem(config: RLConfig, vllm_options: Mapping[str, Any] | None = None) -> str | None:
    """`check_training_engine`'s refusal as the one line an app's CLI prints (None: the engine can start). A
    `model.path` that is no folder is left to the app's own message; vLLM's presence is checked all the same."""
    if config.rollout.engine == "vllm_server":
        try:
            check_on_ranks(config)
        except ValueError as err:
            return f"--engine vllm_server (rollout.engine): {err}"
    if config.rollout.engine != "vllm":
        return None
    try:
        if Path(config.model.path).is_dir():
            check_training_engine(config, vllm_options)
        else:
            from rlloom.rollout.vllm.engine import _import_vllm

            _import_vllm()
    except (ImportError, ValueError) as err:
        return f"--engine vllm (rollout.engine): {err}"
    return None


def build_training_engine(
    config: RLConfig,
    tokenizer: Any,
    *,
    multi_turn: bool = False,
    hf_config: HFEngineConfig | None = None,
    vllm_options: Mapping[str, Any] | None = None,
) -> TrainingEngine:
    """The engine `rollout.engine` names. `tokenizer` (or a vision model's processor) is the trainer's, for HF;
    vLLM loads its own from the same folder, checked against it by the trainer. `multi_turn`: agents, whose
    requests come one conversation turn at a time (vLLM: `VLLMAsyncEngine`). `hf_config`: the HF engine's
    settings (e.g. an agent's prefix cache)."""
    if config.rollout.engine == "vllm_server":
        check_on_ranks(config)
        server = vllm_server_engine(config)
        return TrainingEngine(engine=server, built=[server])
    if config.rollout.engine == "vllm":
        check_training_engine(config, vllm_options)
        engine_config = vllm_engine_config(config, vllm_options)
        if replicas_apart(config):
            share = replica_memory_share(config) if replicas_on_ranks(config) else engine_config.gpu_memory_utilization
            replicas = VLLMReplicas(engine_config.model_copy(update={"gpu_memory_utilization": share}), multi_turn)
            if replicas_on_ranks(config):
                where = f"each of the {config.distributed.num_ranks} ranks, loaded from its rank's shards"
            else:
                where = f"each of {config.distributed.rollout_replicas} generator actors, loaded from the driver's copy"
            logger.info(
                "rollouts on a vLLM replica on %s after every update, from %s in %s",
                where,
                config.model.path,
                config.model.dtype,
            )
            return TrainingEngine(engine=replicas)
        engine: Any
        if multi_turn:
            from rlloom.rollout.vllm.async_engine import VLLMAsyncEngine

            engine = VLLMAsyncEngine(engine_config)
        else:
            from rlloom.rollout.vllm.engine import VLLMEngine

            engine = VLLMEngine(engine_config)
        logger.info(
            "rollouts on vLLM (%s) from %s in %s, synced from the actor after every update",
            type(engine).__name__,
            config.model.path,
            config.model.dtype,
        )
        return TrainingEngine(engine=engine, built=[engine])

    from rlloom.rollout.hf.engine import HFEngine

    built: list[Any] = []

    settings = hf_engine_config(config, hf_config)

    def engine_on(module: nn.Module) -> RolloutEngine:
        built.append(HFEngine(module, tokenizer, settings))
        return built[-1]  # type: ignore[no-any-return]

    return TrainingEngine(engine=engine_on, built=built)


def inflight_kv_asked(config: RLConfig) -> dict[str, Literal["keep", "reprefill"]]:
    """`{"inflight_kv": ...}` as an async run's `trainer.streaming.partial_rollout` asks of an engine that updates in
    flight (keep_kv: keep, reprefill: reprefill); empty otherwise (the engine's own default). A YAML run reaches
    the engine's setting this way, and the trainer's check that the engine does what the key asks then passes."""
    streaming = config.trainer.streaming
    if config.trainer.mode != "async" or streaming is None or streaming.partial_rollout == "off":
        return {}
    return {"inflight_kv": "keep" if streaming.partial_rollout == "keep_kv" else "reprefill"}


def hf_engine_config(config: RLConfig, hf_config: HFEngineConfig | None) -> HFEngineConfig:
    """`hf_config` (the defaults when None) with `inflight_kv` as `inflight_kv_asked` says, unless `hf_config` sets
    it itself (the trainer then refuses a mismatch, naming both)."""
    from rlloom.rollout.hf.engine import HFEngineConfig

    settings = hf_config if hf_config is not None else HFEngineConfig()
    if "inflight_kv" in settings.model_fields_set:
        return settings
    return settings.model_copy(update=inflight_kv_asked(config))


__all__ = [
    "TrainingEngine",
    "VLLMReplicas",
    "build_training_engine",
    "check_training_engine",
    "engine_problem",
    "hf_engine_config",
    "inflight_kv_asked",
    "logprobs_mode",
    "replica_memory_share",
    "replicas_apart",
    "replicas_on_ranks",
    "vllm_engine_config",
    "vllm_server_engine",
]
