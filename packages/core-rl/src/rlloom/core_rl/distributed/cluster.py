"""What the driver settles for its ranks before they start on a (possibly multi-node) Ray cluster.

Rank processes on a cluster made with `ray start` run in the folder that command ran in, not the driver's, so
every local path the driver hands them is made absolute here, and the driver's working folder travels in the
ranks' runtime_env (`DRIVER_CWD_ENV`) so they can work from it where the node has it (a shared filesystem).
Whether ranks get GPUs is decided from the cluster's resources, not from the driver's own devices: a CPU head
node driving GPU workers must still put the ranks on GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DRIVER_CWD_ENV = "RLLOOM_DRIVER_CWD"
"""Environment variable that carries the driver's working folder to the rank processes."""


def local_path(path: str | None) -> str | None:
    """`path` made absolute when it names something on the driver's filesystem; anything else (a hub id like
    `Qwen/Qwen2.5-0.5B`, None) unchanged."""
    if path is None or not Path(path).expanduser().exists():
        return path
    return str(Path(path).expanduser().absolute())


def with_absolute_paths(cfg: Any) -> Any:
    """A copy of the run config whose model, tokenizer and critic paths are absolute where they exist here."""
    model = cfg.model.model_copy(
        update={"path": local_path(cfg.model.path), "tokenizer_path": local_path(cfg.model.tokenizer_path)}
    )
    critic = cfg.critic.model_copy(update={"path": local_path(cfg.critic.path)})
    return cfg.model_copy(update={"model": model, "critic": critic})


def rank_runtime_env(user_env: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ranks' Ray runtime_env: the user's (`distributed.runtime_env`), with the driver's working folder added
    to its env_vars (a user value of the same name wins)."""
    env = dict(user_env or {})
    env_vars = {DRIVER_CWD_ENV: os.getcwd(), **dict(env.get("env_vars") or {})}
    env["env_vars"] = env_vars
    return env


def enter_driver_folder() -> str | None:
    """In a rank process: work from the driver's folder when this node has it; returns the folder entered."""
    folder = os.environ.get(DRIVER_CWD_ENV)
    if folder and Path(folder).is_dir():
        os.chdir(folder)
        return folder
    return None


def gpus_per_rank(configured: float | None, device: str, cluster: Mapping[str, float]) -> float:
    """GPUs to reserve per rank: `distributed.gpus_per_rank` when set; else 0 for `trainer.device=cpu`, 1 when
    the cluster has GPUs, and for `trainer.device=cuda...` on a cluster without any, an error."""
    if configured is not None:
        return configured
    if device == "cpu":
        return 0.0
    if float(cluster.get("GPU", 0.0)) > 0:
        return 1.0
    if device.startswith("cuda"):
        raise ValueError(
            f"trainer.device={device!r} but the Ray cluster has no GPU; start the worker nodes with their GPUs "
            "(`ray start --num-gpus=N`), or set trainer.device=cpu"
        )
    return 0.0


def missing_paths(paths: Mapping[str, str | None]) -> list[str]:
    """`name=path` for each absolute path that does not exist in this process (a rank's node)."""
    return [
        f"{name}={path}"
        for name, path in paths.items()
        if path is not None and Path(path).is_absolute() and not Path(path).exists()
    ]


def check_node(
    who: str, node: str, paths: Mapping[str, str | None], *, use_gpu: bool, needs: str, gpu_key: str
) -> None:
    """Fail with the node and the fix, before loading, when this node lacks a path or a GPU the driver counted on
    (a rank's or a generator actor's start: without it, a missing model folder sent transformers to the hub)."""
    import torch

    missing = missing_paths(paths)
    if missing:
        raise FileNotFoundError(
            f"{who} on node {node}: {', '.join(missing)} not found on this node. Every node needs {needs} at the same "
            "path as the driver: a shared filesystem, or a copy there"
        )
    if use_gpu and not torch.cuda.is_available():
        raise RuntimeError(
            f"{who} on node {node} was given a GPU by Ray but torch sees none (torch.version.cuda="
            f"{torch.version.cuda}); install a CUDA build of torch on that node or set {gpu_key}=0"
        )


__all__ = [
    "DRIVER_CWD_ENV",
    "check_node",
    "enter_driver_folder",
    "gpus_per_rank",
    "local_path",
    "missing_paths",
    "rank_runtime_env",
    "with_absolute_paths",
]
