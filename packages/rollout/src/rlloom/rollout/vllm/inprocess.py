"""vLLM's engine core and worker inside the calling process (`VLLMEngineConfig.in_process`), as TRL's colocate mode.

By default vLLM 0.32 runs its engine core in a process of its own (and on CPU its worker in a third), which costs
every start the import of vLLM in each process and every weight sync an encode/decode of each bucket. In-process,
`LLM(distributed_executor_backend="external_launcher")` with `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps both here:
`collective_rpc` becomes a plain method call, so a bucket's tensors reach the model's `load_weights` as they are.

What the start changes in this process, and what `in_process_start` does about it:
- vLLM's worker needs a torch.distributed world (its TP/PP groups are carved out of it), and external_launcher
  takes the caller's: an existing process group is used as it is (e.g. a training rank's), never replaced; with
  none, a world of size 1 is created (gloo, a free localhost port) and destroyed again when the last in-process
  engine closes. A caller that wants its own process group must create it before the engine.
- `VLLM_ENABLE_V1_MULTIPROCESSING`, `RANK`, `LOCAL_RANK` are set for the start only (vLLM writes the first one for
  good and caches its environment), so an engine started later, e.g. `VLLMAsyncEngine`, still gets processes.
- vLLM's CPU worker reseeds torch/numpy/random and replaces `torch.set_num_threads` with a no-op; both are put
  back, so the caller's random streams and thread setting are its own (vLLM's unseeded sampling then draws from
  this process's torch generator).
"""

from __future__ import annotations

import gc
import os
import random
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

_ENV_KEYS = ("VLLM_ENABLE_V1_MULTIPROCESSING", "RANK", "LOCAL_RANK")


@dataclass
class _Engines:
    """This process's in-process engines: vLLM's parallel groups are module globals shared by all of them."""

    live: int = 0  # started and not closed
    own_world: bool = False  # the torch.distributed world was created here (destroyed with the last engine)
    lock: threading.Lock = field(default_factory=threading.Lock)


_ENGINES = _Engines()


def resolve_in_process(in_process: bool | None, tensor_parallel_size: int) -> bool:
    """None (auto): in-process for one worker (tensor_parallel_size 1); TP > 1 runs vLLM's own worker processes.
    True with TP > 1 needs one process per TP rank (a launcher such as torchrun) that already joined a world."""
    if in_process is None:
        return tensor_parallel_size == 1
    if in_process and tensor_parallel_size > 1:
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if world % tensor_parallel_size:
            raise ValueError(
                f"in_process=True with tensor_parallel_size={tensor_parallel_size}: each TP rank must be its own "
                f"process in an initialised torch.distributed world (this one has {world}); launch one process "
                "per rank (torchrun) or set in_process=False to let vLLM start its workers"
            )
    return in_process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_world() -> None:
    if torch.distributed.is_initialized():
        return
    address = f"tcp://127.0.0.1:{_free_port()}"
    torch.distributed.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    _ENGINES.own_world = True


@contextmanager
def _scoped_process_state() -> Iterator[None]:
    """Put back the environment, vLLM's environment cache, torch.set_num_threads and the random generators."""
    from vllm import envs

    saved_env = {key: os.environ.get(key) for key in _ENV_KEYS}
    set_num_threads = torch.set_num_threads
    rng = (random.getstate(), torch.get_rng_state())
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    np_rng = _numpy_state()
    envs.disable_envs_cache()  # read the variables set below, not values cached by an earlier start
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        envs.disable_envs_cache()  # the engine core cached VLLM_ENABLE_V1_MULTIPROCESSING=0 for the whole process
        torch.set_num_threads = set_num_threads  # type: ignore[assignment]
        random.setstate(rng[0])
        torch.set_rng_state(rng[1])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        if np_rng is not None:
            sys.modules["numpy"].random.set_state(np_rng)


def _numpy_state() -> Any:
    """numpy's global generator state if the caller has imported numpy (else it has no state to keep)."""
    numpy = sys.modules.get("numpy")
    return None if numpy is None else numpy.random.get_state()


def _unscannable(value: Any) -> bool:
    """Whether vLLM's kernel rebinding would fail on this module-level value: it reads `vars(value).get(...)` for
    every value with a `__dict__`, and some values' `__dict__` is no mapping (llvmlite's `binding.ffi.lib`, whose
    `__getattr__` wraps any name as a C function; loaded once numba is imported)."""
    try:
        return hasattr(value, "__dict__") and not callable(getattr(vars(value), "get", None))
    except Exception:  # vars() or the attribute lookup raising would fail vLLM's scan the same way
        return True


@contextmanager
def _modules_hidden_from_kernel_rebinding() -> Iterator[None]:
    """vLLM 0.32's worker start (`triton_utils.dispatcher._rebind_kernels`) scans every module in `sys.modules` and
    fails on a value `_unscannable` names: a trainer that imported numba (directly or through a library) could then
    not start an in-process engine. Such modules hold no Triton kernels, so they leave `sys.modules` for the start
    and come back after it."""
    hidden = {
        name: module
        for name, module in list(sys.modules.items())
        if isinstance(getattr(module, "__dict__", None), dict) and any(map(_unscannable, list(vars(module).values())))
    }
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


@contextmanager
def in_process_start() -> Iterator[dict[str, Any]]:
    """Around `vllm.LLM(...)`: a torch.distributed world, the variables external_launcher reads, and this process's
    state put back afterwards. Yields the extra `LLM` arguments. Pair every successful start with `release`."""
    with _ENGINES.lock:
        _ensure_world()
        rank = torch.distributed.get_rank()
        try:
            with _scoped_process_state(), _modules_hidden_from_kernel_rebinding():
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
                os.environ.setdefault("RANK", str(rank))
                os.environ.setdefault("LOCAL_RANK", str(rank))  # vLLM's own fallback without a launcher
                yield {"distributed_executor_backend": "external_launcher"}
        except BaseException:
            _release_world_if_unused()
            raise
        _ENGINES.live += 1


def release() -> None:
    """After an in-process engine's shutdown: free what vLLM's cycles hold (its start froze the GC heap), and with
    the last engine gone, vLLM's parallel groups and a world created here."""
    with _ENGINES.lock:
        _ENGINES.live = max(_ENGINES.live - 1, 0)
        gc.unfreeze()
        gc.collect()
        _release_world_if_unused()


def _release_world_if_unused() -> None:
    if _ENGINES.live:
        return
    from vllm.distributed import parallel_state

    parallel_state.destroy_model_parallel()
    if _ENGINES.own_world:
        parallel_state.destroy_distributed_environment()  # vLLM's world group, then the default group made here
        _ENGINES.own_world = False
    elif parallel_state._WORLD is not None:  # the caller's default group stays; only vLLM's subgroups go
        parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
