"""Containment: hostile programs run through `execute` stay inside the sandbox and leave nothing behind."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlloom.rewards.code import execute, isolation
from rlloom.rewards.code.containment import WeakIsolationError
from rlloom.rewards.code.probe import Isolation, _found

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]


@pytest.fixture(autouse=True)
def _no_leftovers(sandbox_processes: Callable[..., list[str]]) -> Iterator[None]:
    yield
    assert sandbox_processes(anywhere=True) == []  # nowhere on the machine: this file runs alone (noxfile.py)


HONEST = "print(sum(range(10)))"


def _honest_still_works() -> None:
    result = execute(HONEST, timeout=5)
    assert (result.status, result.stdout) == ("ok", "45\n")


def test_isolation_is_strong_and_verified() -> None:
    found = isolation()
    assert found.mode == "namespaces"
    assert found.strong and found.no_network and found.read_only_root
    assert found.unprivileged and found.own_pid_namespace and found.minimal_root


def test_plain_program_output_stdin_and_exit_code() -> None:
    result = execute("import sys\nx = sys.stdin.read()\nprint(x.upper(), end='')\nsys.exit(3)", stdin="abc")
    assert (result.status, result.exit_code, result.stdout) == ("error", 3, "ABC")
    result = execute("raise ValueError('boom')")
    assert result.status == "error" and result.exit_code == 1 and "ValueError: boom" in result.stderr


def test_stdin_closed_unless_given() -> None:
    result = execute("input()")
    assert result.status == "error" and "EOFError" in result.stderr


def test_infinite_loop_times_out_within_margin() -> None:
    start = time.monotonic()
    result = execute("while True:\n    pass", timeout=1.0)
    assert result.status == "timeout"
    assert time.monotonic() - start < 4.0  # timeout + a small margin, on a shared machine
    _honest_still_works()


def test_sleeping_program_is_killed_at_wall_clock() -> None:
    result = execute("import time\ntime.sleep(60)", timeout=1.0)
    assert result.status == "timeout" and result.duration < 4.0


def test_fork_bomb_is_contained() -> None:
    code = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(500):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    result = execute(code, timeout=10)
    assert result.status == "ok"
    assert int(result.stdout) < 16  # RLIMIT_NPROC (16 by default) binds: the uid is unprivileged
    _honest_still_works()


def test_endless_fork_loop_times_out_and_dies_whole() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = execute(code, timeout=1.5)
    assert result.status == "timeout"
    _honest_still_works()


def test_memory_bomb_hits_the_cap() -> None:
    assert execute("x = bytearray(1 << 34)", memory_mb=256).status == "memory"
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))"
    assert execute(grow, memory_mb=256, timeout=10).status == "memory"
    _honest_still_works()


def test_output_flood_is_capped() -> None:
    result = execute("while True:\n    print('x' * 4096)", timeout=10)
    assert result.status == "output_limit"
    assert len(result.stdout) <= 1 << 20
    assert execute("import sys\nwhile True:\n    sys.stderr.write('y' * 4096)", timeout=10).status == "output_limit"


def test_one_big_stderr_write_is_capped_within_the_timeout() -> None:
    # the rest of a single 1 MiB write stays in the pipe after the cap; the run must still end at once, not
    # hang on the full pipe until the 5 s fallback kill
    start = time.monotonic()
    result = execute("import sys\nsys.stderr.write('e' * (1 << 20))", timeout=2)
    assert (result.status, result.exit_code) == ("output_limit", -9)
    assert time.monotonic() - start < 2
    assert len(result.stderr) == (1 << 20) // 4
    _honest_still_works()


def test_huge_file_hits_the_file_size_limit() -> None:
    result = execute("f = open('big', 'wb')\nwhile True:\n    f.write(b'0' * (1 << 20))", timeout=10)
    assert result.status == "output_limit"


@pytest.mark.parametrize("target", ["/tmp", "/var/tmp", "/dev/shm", "/root", str(Path.home()), "/work", "/etc"])
def test_writes_outside_the_work_dir_never_reach_the_host(target: str) -> None:
    name = f"rlloom-escape-{uuid.uuid4().hex}"
    code = f"import os\ntry:\n    open(os.path.join({target!r}, {name!r}), 'w').write('x')\n    print('wrote')\nexcept OSError as e:\n    print(type(e).__name__)"  # noqa: E501
    result = execute(code)
    assert result.status == "ok"
    assert not Path(target, name).exists()


def test_host_files_are_not_there_at_all() -> None:
    """Home directories, the repository and data sets (with their answers) are absent, not just read-only."""
    data = Path(__file__).parent / "data" / "code_mbpp_test.jsonl.gz"
    code = f"import os\nprint(os.path.exists({str(data)!r}), os.path.exists('/home'), os.path.exists('/work'))"
    result = execute(code)
    assert result.stdout.split() == ["False", "False", "False"]
    top = execute("import os\nprint(sorted(os.listdir('/')))").stdout
    assert "'home'" not in top and "'var'" not in top and "'tmp'" in top


def test_work_dir_is_private_writable_and_gone_afterwards() -> None:
    code = "import os\nopen('a.txt', 'w').write('hi')\nprint(os.getcwd(), open('a.txt').read(), os.listdir('.'))"
    first = execute(code)
    assert first.status == "ok" and "hi" in first.stdout
    second = execute("import os\nprint(sorted(os.listdir('.')))")
    assert second.stdout.strip() == "['solution.py']"  # only its own program: nothing left from the last run


def test_home_is_the_work_dir() -> None:
    code = "import os\nopen(os.path.expanduser('~/f'), 'w').write('x')\nprint(os.listdir(os.environ['HOME']))"
    result = execute(code)
    assert result.status == "ok" and "'f'" in result.stdout


def test_no_network_not_even_loopback() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3.0)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        "import socket\n"
        f"for host in ('127.0.0.1', '1.1.1.1', 'example.com'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port} if host == '127.0.0.1' else 80), timeout=1).close()\n"
        "        print(host, 'connected')\n"
        "    except OSError as e:\n"
        "        print(host, 'blocked', type(e).__name__)\n"
    )
    result = execute(code, timeout=10)
    thread.join()
    server.close()
    assert result.status == "ok"
    assert "connected" not in result.stdout and result.stdout.count("blocked") == 3
    assert accepted == []


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLLOOM_TEST_API_KEY", secret)
    code = (
        "import os\n"
        "print(dict(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try:\n"
        "            print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError as e:\n"
        "            print(e)\n"
    )
    result = execute(code)
    assert result.status == "ok"
    assert secret not in result.stdout and "RLLOOM_TEST_API_KEY" not in result.stdout


def test_cannot_see_or_signal_host_processes() -> None:
    me = os.getpid()
    code = (
        "import os, signal\n"
        "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "print(os.getppid())\n"
        f"for pid in ({me}, os.getppid(), -1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as e:\n"
        "        print(pid, type(e).__name__)\n"
    )
    result = execute(code)
    lines = result.stdout.splitlines()
    assert lines[0] == "[1, 2]"  # alone in its PID namespace with the supervisor (1, another uid)
    assert lines[1] == "1"  # its parent is that supervisor; the scoring process is invisible
    assert lines[2] == f"{me} ProcessLookupError" and lines[3] == "1 PermissionError"
    _honest_still_works()  # and we are alive


def test_daemon_grandchildren_and_threads_do_not_outlive_the_run() -> None:
    marker = f"{uuid.uuid4().int % 10_000}.{uuid.uuid4().int % 10_000}"
    code = (
        "import os, subprocess, threading, time\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(100)\n"
        "    os._exit(0)\n"
        "threading.Thread(target=time.sleep, args=(100,), daemon=True).start()\n"
        "print('bye')\n"
    )
    start = time.monotonic()
    result = execute(code, timeout=5)
    assert result.status == "ok" and result.stdout == "bye\n"
    assert time.monotonic() - start < 4.0  # not held up by the 100 s sleepers
    time.sleep(0.2)
    cmdlines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                cmdlines.append((entry / "cmdline").read_bytes())
    assert not any(marker.encode() in c for c in cmdlines)


def test_setuid_binaries_cannot_regain_root() -> None:
    """no_new_privs is set and every mount is nosuid, so `su`, `sudo` or `passwd` cannot raise privileges."""
    code = (
        "status = open('/proc/self/status').read()\n"
        "print([line for line in status.splitlines() if line.startswith('NoNewPrivs')][0].split()[1])\n"
        "mounts = [line.split() for line in open('/proc/self/mountinfo')]\n"
        "print(all('nosuid' in m[5].split(',') for m in mounts if m[4] in ('/', '/usr', '/usr/bin', '/bin')))\n"
    )
    result = execute(code)
    assert result.stdout.split() == ["1", "True"]


def test_weak_isolation_refused_unless_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    strong = isolation()
    weak = strong.model_copy(update={"mode": "rlimits", "strong": False, "reason": "pretend: no namespaces"})
    monkeypatch.setitem(_found, "active", weak)
    with pytest.raises(WeakIsolationError, match="allow_weak_isolation=True"):
        execute(HONEST)
    result = execute(HONEST, allow_weak_isolation=True)
    assert (result.status, result.stdout) == ("ok", "45\n")
    assert isinstance(isolation(), Isolation) and not isolation().strong


def test_runs_die_with_a_killed_scoring_process(sandbox_processes: Callable[..., list[str]]) -> None:
    scorer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from rlloom.rewards.code import execute\nexecute('import time\\ntime.sleep(60)', timeout=90)",
        ]
    )
    deadline = time.monotonic() + 20
    while not sandbox_processes(anywhere=True):
        assert time.monotonic() < deadline, "the sandboxed program never started"
        time.sleep(0.05)
    scorer.kill()
    scorer.wait()
    deadline = time.monotonic() + 10
    while sandbox_processes(anywhere=True):
        assert time.monotonic() < deadline, f"left behind: {sandbox_processes(anywhere=True)}"
        time.sleep(0.05)
