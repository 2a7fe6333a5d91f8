"""Joining a cluster made by `ray start`, as on several machines: paths, working folder, authentication, GPUs,
and Ray start-up retries.

The end-to-end test starts a real `ray start --head` on 127.0.0.1 in one folder (with its own temp folder and
auth token, so it touches nothing of the user's) and trains 2 steps on 2 ranks from a driver in another folder
that names its model and output folder relatively. Rank processes run in the head's folder, so without absolute
paths and the driver's folder in their runtime_env they could not find the model; with token authentication on
the head (Ray 2.52+ turns it on when a token exists), joining by explicit address needs `RAY_AUTH_MODE=token`.
The cluster is stopped through the process group of the `ray start` process the test started, never `ray stop`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlloom.core_rl.config.schema import RLConfig
from rlloom.core_rl.distributed import cluster
from rlloom.core_rl.distributed.ray_start import GCS_WAIT_ENV, RETRY_GCS_WAIT_S, start_ray

pytestmark = [pytest.mark.slow, pytest.mark.ray]

TESTS = Path(__file__).parent


# ---------------------------------------------------------------- driver-side decisions, no Ray needed
def test_paths_that_exist_here_become_absolute_and_hub_ids_stay(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    assert cluster.local_path("model") == str(tmp_path / "model")
    assert cluster.local_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # not here: a hub id, left alone
    assert cluster.local_path(None) is None
    cfg = RLConfig.model_validate({"model": {"path": "model", "tokenizer_path": "model"}, "critic": {"path": "x/y"}})
    fixed = cluster.with_absolute_paths(cfg)
    assert (fixed.model.path, fixed.model.tokenizer_path) == (str(tmp_path / "model"), str(tmp_path / "model"))
    assert fixed.critic.path == "x/y" and cfg.model.path == "model"  # the caller's config is unchanged
    assert cluster.missing_paths({"a": str(tmp_path / "model"), "b": str(tmp_path / "gone"), "hub": "Qwen/Q"}) == [
        f"b={tmp_path / 'gone'}"
    ]


def test_ranks_get_the_drivers_folder_and_keep_the_users_runtime_env(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    env = cluster.rank_runtime_env({"env_vars": {"HF_HUB_OFFLINE": "1"}, "pip": ["x"]})
    assert env == {"env_vars": {cluster.DRIVER_CWD_ENV: str(tmp_path), "HF_HUB_OFFLINE": "1"}, "pip": ["x"]}
    assert cluster.rank_runtime_env(None) == {"env_vars": {cluster.DRIVER_CWD_ENV: str(tmp_path)}}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv(cluster.DRIVER_CWD_ENV, str(tmp_path))
    assert cluster.enter_driver_folder() == str(tmp_path) and Path.cwd() == tmp_path
    monkeypatch.setenv(cluster.DRIVER_CWD_ENV, str(tmp_path / "not-on-this-node"))
    assert cluster.enter_driver_folder() is None and Path.cwd() == tmp_path


def test_gpus_per_rank_come_from_the_cluster_not_the_driver() -> None:
    gpu_cluster, cpu_cluster = {"CPU": 16.0, "GPU": 16.0}, {"CPU": 16.0}
    assert cluster.gpus_per_rank(None, "auto", gpu_cluster) == 1.0  # a CPU head node driving GPU workers
    assert cluster.gpus_per_rank(None, "auto", cpu_cluster) == 0.0
    assert cluster.gpus_per_rank(None, "cpu", gpu_cluster) == 0.0
    assert cluster.gpus_per_rank(0.5, "auto", cpu_cluster) == 0.5  # configured: used as given
    with pytest.raises(ValueError, match=r"trainer.device='cuda' but the Ray cluster has no GPU.*ray start"):
        cluster.gpus_per_rank(None, "cuda", cpu_cluster)


# ---------------------------------------------------------------- start-up retry (issue 26), a stand-in ray.init
class FlakyInit:
    """Fails its first `failures` calls like a slow local start, then answers; records the GCS wait it saw."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or Exception("The current node timed out during startup.")
        self.gcs_waits: list[str | None] = []

    def __call__(self, **kwargs: Any) -> str:
        self.gcs_waits.append(os.environ.get(GCS_WAIT_ENV))
        if len(self.gcs_waits) <= self.failures:
            raise self.error
        return "started"


def test_a_slow_ray_start_is_retried_once_with_a_longer_wait(monkeypatch: Any) -> None:
    pytest.importorskip("ray")
    monkeypatch.delenv(GCS_WAIT_ENV, raising=False)
    flaky = FlakyInit(failures=1)
    assert start_ray(None, init=flaky, num_cpus=1) == "started"
    assert flaky.gcs_waits == [None, str(RETRY_GCS_WAIT_S)]
    assert GCS_WAIT_ENV not in os.environ  # restored


def test_two_failed_starts_raise_a_clear_error_and_bad_arguments_are_not_retried(monkeypatch: Any) -> None:
    pytest.importorskip("ray")
    flaky = FlakyInit(failures=2)
    with pytest.raises(RuntimeError, match=r"could not start or join a local Ray node in two attempts.*busy machine"):
        start_ray(None, init=flaky)
    assert len(flaky.gcs_waits) == 2
    wrong = FlakyInit(failures=5, error=TypeError("unexpected keyword"))
    with pytest.raises(TypeError):
        start_ray(None, init=wrong)
    assert len(wrong.gcs_waits) == 1
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # as after start_ray turned it on; nothing to change here
    denied = FlakyInit(failures=5, error=Exception("Token authentication is enabled but no token was found"))
    with pytest.raises(RuntimeError, match=r"token authentication.*RAY_AUTH_MODE=token"):
        start_ray("10.0.0.1:6379", init=denied)
    assert len(denied.gcs_waits) == 1


# ---------------------------------------------------------------- a real `ray start --head` cluster
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"`ray start` exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f"`ray start` did not listen on {port} within {timeout_s}s:\n{log.read_text()[-3000:]}")


def processes_using(folder: str) -> list[int]:
    """PIDs of this user's processes whose command line or environment names `folder` (the head's temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if folder.encode() in text:
            found.append(int(entry.name))
    return found


def stop_head(process: subprocess.Popen[bytes], temp_dir: str) -> None:
    """End the `ray start` process group this test made, then any straggler that still names its temp dir."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=20)
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + 20
    while (left := processes_using(temp_dir)) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


@pytest.fixture
def head_node(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A `ray start --head` cluster on 127.0.0.1 run from its own folder: (address, env for processes joining)."""
    ray_exe = Path(sys.executable).with_name("ray")
    if not ray_exe.exists():
        pytest.skip("the `ray` command is not installed next to this Python")
    temp_dir = tempfile.mkdtemp(prefix="rlx", dir="/tmp")  # Unix socket paths under it must stay short
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(16))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env |= {"RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
    head_folder = tmp_path / "head"
    head_folder.mkdir()
    port = free_port()
    log = tmp_path / "head.log"
    command = [str(ray_exe), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
               "--num-gpus=0", f"--temp-dir={temp_dir}", "--include-dashboard=false", "--block"]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=head_folder, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        wait_for_port(port, process, log, timeout_s=180)
        yield f"127.0.0.1:{port}", env
    finally:
        stop_head(process, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not processes_using(temp_dir), "Ray processes of the test cluster outlived it"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_steps_on_a_ray_start_cluster_from_another_folder(
    tiny_model_dir: Path, tmp_path: Path, head_node: tuple[str, dict[str, str]]
) -> None:
    pytest.importorskip("ray")
    address, env = head_node
    driver = tmp_path / "driver"
    shutil.copytree(tiny_model_dir, driver / "model")
    overrides = ["trainer.total_steps=2", "trainer.save_every=2", "distributed.num_ranks=2",
                 "distributed.cpus_per_rank=0.5", "distributed.timeout_s=400",
                 f"distributed.ray_address={address}"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(TESTS / "tiny_run.py"), "model", "out", *overrides],
        check=False,
        cwd=driver,
        env=env,  # RAY_AUTH_MODE unset, as a user who ran `ray start` and then the trainer would have it
        capture_output=True,
        text=True,
        timeout=700,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = (driver / "out" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    # the ranks wrote the checkpoint's shards into the driver's folder, though they run in the head's
    assert (driver / "out" / "checkpoints" / "step_2" / "sharded" / "actor" / "config.json").is_file()
    assert list((driver / "out" / "checkpoints" / "step_2" / "sharded" / "actor").glob("*.distcp"))
    assert not any((tmp_path / "head").iterdir())


def test_a_rank_whose_node_lacks_the_model_folder_names_node_and_path(tmp_path: Path) -> None:
    """Checked before loading: without it, transformers took the missing folder for a hub id."""
    pytest.importorskip("ray")
    from rlloom.core_rl.distributed.ray_group import RankWorker

    cfg = RLConfig.model_validate({"model": {"path": str(tmp_path)}})
    gone = str(tmp_path / "checkpoints" / "step_4")
    with pytest.raises(FileNotFoundError, match=rf"rank 1 on node .*: weights={gone} not found on this node"):
        RankWorker._check_node(1, cfg, weights=gone, critic=None, resume=None, use_gpu=False)
    RankWorker._check_node(1, cfg, weights=str(tmp_path), critic=None, resume=None, use_gpu=False)  # all here
    RankWorker._check_node(1, cfg, weights="Qwen/Qwen2.5-0.5B", critic=None, resume=None, use_gpu=False)  # hub id
