"""One memory budget, one CPU budget and one network namespace per run (issue 39).

Memory that no process's resident set shows (System V shared memory touched and detached, message queues, memfd
files kept open, tmpfs files under /tmp and /dev/shm, socket and netlink buffers, pipe buffers) is counted against
the run's budget or cannot be made at all; a run's processes share one CPU budget however many there are;
concurrent runs cannot reach each other. Each hostile program has an honest twin that must pass, so a zero means
the trick failed, not that the task broke.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlloom.rewards.code import Limits, check_asserts, execute, isolation, meters

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(os.geteuid() != 0, reason="strong isolation needs root (CI runs as root)"),
]
TESTS = ["assert square(3) == 9", "assert square(-4) == 16"]
SQUARE = "\ndef square(x):\n    return x * x\n"
BUDGET = Limits(timeout=20, memory_mb=256)


@pytest.fixture(autouse=True)
def _no_leftovers(sandbox_processes: Callable[..., list[str]]) -> Iterator[None]:
    yield
    assert sandbox_processes() == [], "a sandboxed process outlived its run"


def _code(body: str) -> str:
    return textwrap.dedent(body) + SQUARE


# --- memory no resident set shows ------------------------------------------------------------------------------

LIBC = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
def segment(size):
    sid = libc.shmget(0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if sid < 0:
        return ctypes.get_errno()
    addr = libc.shmat(sid, None, 0)
    ctypes.memset(addr, 1, size)
    libc.shmdt(ctypes.c_void_p(addr))  # detached: in no process's resident set any more
    return 0
"""

HOSTILE_MEMORY = {
    "System V shared memory touched, then detached": LIBC
    + """
held = 0
for _ in range(12):  # 1.5 GiB under a 256 MiB budget
    if segment(128 << 20):
        break
    held += 128
print("held", held, "MiB", flush=True)
""",
    "tmpfs files in /tmp and /dev/shm beside a large resident set": """
block = bytearray(200 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
for i in range(4):  # 4 x 15 MiB of files: each under the file-size cap, together over the run's budget
    with open(("/dev/shm/f%d" if i % 2 else "/tmp/f%d") % i, "wb") as f:
        f.write(b"x" * (15 << 20))
import time
time.sleep(1)
""",
}

HOSTILE_MEMORY["socket buffers in flight"] = """
import socket
held = []
for _ in range(28):  # 8 MiB and more in flight per socket, in the kernel, in no resident set
    a, b = socket.socketpair()
    for end in (a, b):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
        end.setblocking(False)
        try:
            while True:
                end.send(b"x" * 65536)
        except OSError:
            pass
    held.append((a, b))
import time
time.sleep(1)
print("held", len(held) * 16, "MiB or more", flush=True)
"""

HOSTILE_MEMORY["netlink messages queued to its own sockets"] = """
import os, socket
os.fork()  # two processes, each under its descriptor limit
held = []
for _ in range(25):  # about 8 MiB queued per socket pair, in the kernel
    a = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)  # NETLINK_USERSOCK
    b = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)
    a.bind((0, 0))
    b.bind((0, 0))
    b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
    a.setblocking(False)
    try:
        while True:
            a.sendto(b"x" * 60000, b.getsockname())
    except OSError:
        pass
    held += [a, b]
import time
time.sleep(1)
print("held", len(held) * 4, "MiB or more", flush=True)
"""

HONEST_MEMORY = {
    "a message waiting in a socket pair": """
import socket
a, b = socket.socketpair()
a.sendall(b"x" * 100_000)
""",
    "a small System V segment": LIBC + "assert segment(8 << 20) == 0\n",
    "a resident set and files that fit together": """
block = bytearray(150 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
with open("/dev/shm/f", "wb") as f:
    f.write(b"x" * (15 << 20))
with open("/tmp/g", "wb") as f:
    f.write(b"x" * (15 << 20))
""",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_MEMORY))
def test_memory_outside_resident_sets_counts_against_the_budget(name: str) -> None:
    result = check_asserts(_code(HOSTILE_MEMORY[name]), TESTS, limits=BUDGET)
    assert (result.status, result.score) == ("memory", 0.0), result
    assert "held" not in result.stdout  # stopped at the budget, before it held what it wanted


@pytest.mark.parametrize("name", sorted(HONEST_MEMORY))
def test_memory_outside_resident_sets_within_the_budget_passes(name: str) -> None:
    result = check_asserts(_code(HONEST_MEMORY[name]), TESTS, limits=BUDGET)
    assert (result.status, result.score) == ("passed", 1.0), result


def test_memfd_and_message_queues_cannot_be_made() -> None:
    """memfd pages and System V / POSIX message queues are in no resident set: they are refused outright."""
    code = LIBC + textwrap.dedent(
        """
        import os
        try:
            os.memfd_create("hold")
            print("memfd made")
        except OSError as e:
            print("memfd", e.errno)
        print("msgget", libc.msgget(0, 0o1000 | 0o600), ctypes.get_errno())
        """
    )
    assert isolation().memfd_blocked  # the start-up probe verified it from inside a sandbox
    result = execute(code, limits=BUDGET)
    assert result.status == "ok", result
    lines = result.stdout.split("\n")
    assert lines[0] == f"memfd {errno.ENOSYS}"
    assert lines[1].split()[1] == "-1"  # no queue
    hostile = "import os\nfds = []\nfor _ in range(100):\n    fd = os.memfd_create('m')\n"
    hostile += "    os.write(fd, b'x' * (15 << 20))\n    fds.append(fd)\n"
    assert check_asserts(hostile + SQUARE, TESTS, limits=BUDGET).score == 0.0  # the run fails at the first one


def test_what_the_budget_cannot_count_is_refused_and_the_rest_still_works() -> None:
    """Socket families whose buffers no count sees (AF_ALG, AF_PACKET ...) and io_uring (whose operations would
    bypass the filter) are refused; Unix, IP and netlink sockets, which honest programs use, still work."""
    code = LIBC + textwrap.dedent(
        """
        import socket
        made = []
        for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, 17, 38, 40):
            try:
                socket.socket(family, socket.SOCK_RAW if family == socket.AF_NETLINK else socket.SOCK_DGRAM).close()
                made.append(int(family))
            except OSError as e:
                made.append(-e.errno)
        print(made)
        print(libc.syscall(425, 8, ctypes.create_string_buffer(120)), ctypes.get_errno())  # io_uring_setup
        """
    )
    result = execute(code, limits=BUDGET)
    assert result.status == "ok", result
    families, uring = result.stdout.splitlines()
    no_family = -errno.EAFNOSUPPORT
    assert families == str([1, 2, 10, 16, no_family, no_family, no_family])
    assert uring == f"-1 {errno.ENOSYS}"


def test_system_v_shared_memory_is_capped_at_the_budget_in_the_runs_own_namespace() -> None:
    """The run's IPC namespace allows shared memory up to its budget; nothing of it outlives the run."""
    code = LIBC + "print(segment(300 << 20), segment(64 << 20))\n"
    result = execute(code, limits=BUDGET)
    assert result.status == "ok" and result.stdout.split() == [str(errno.EINVAL), "0"], result
    before = Path("/proc/sysvipc/shm").read_text()
    assert execute(LIBC + "segment(1 << 20)\n", limits=BUDGET).status == "ok"
    assert Path("/proc/sysvipc/shm").read_text() == before  # the segment was the run's, gone with it


PIPES = """
import os, time
for _ in range(14):  # 14 small processes (sleep), each holding 60 full pipes: 52 MiB in the kernel, in no RSS
    held = []
    for _ in range(60):
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            while True:
                os.write(w, b"x" * 65536)
        except BlockingIOError:
            pass
        os.close(w)  # the data stays while the read end is open
        held.append(r)
    if os.fork() == 0:
        for r in held:
            os.set_inheritable(r, True)
        os.execv("/bin/sleep", ["sleep", "3"])
    for r in held:
        os.close(r)
time.sleep(3)
print("held", 14 * 60 * 64 // 1024, "MiB", flush=True)
"""


def test_pipe_buffers_count_against_the_budget() -> None:
    """Full pipes held by small processes: 52 MiB of pipe buffers beside about 35 MiB of resident sets stop a
    run under a 64 MiB budget (resident sets alone would let it finish); under a budget that holds both, the same
    program finishes, so the stop is the pipes' count, not a broken program."""
    stopped = execute(PIPES, limits=Limits(timeout=20, memory_mb=64))
    assert (stopped.status, stopped.stdout) == ("memory", ""), stopped
    fits = execute(PIPES, limits=Limits(timeout=20, memory_mb=192))
    assert (fits.status, fits.stdout) == ("ok", "held 52 MiB\n"), fits


def test_the_pipe_count_is_each_pipe_once_at_its_capacity() -> None:
    """`meters.pipe_memory` on this process and a forked child: a 64 KiB pipe read through three descriptors in two
    processes and a pipe enlarged to 1 MiB add 64 KiB + 1 MiB, once each, whatever they hold."""
    base = meters.pipe_memory([os.getpid()], 1024)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    extra = os.dup(r1)
    fcntl.fcntl(w2, 1031, 1 << 20)  # F_SETPIPE_SZ (this process is not sandboxed)
    os.write(w2, b"x" * 100_000)
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        assert meters.pipe_memory([os.getpid(), child], 1024) == base + (64 << 10) + (1 << 20)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        for fd in (r1, w1, r2, w2, extra):
            os.close(fd)
    assert meters.pipe_memory([os.getpid()], 1024) == base


def test_a_few_pipes_within_the_budget_pass() -> None:
    """The honest twin: pipes written and read back within one process, under the smallest budget."""
    code = _code(
        """
        import os
        pipes = [os.pipe() for _ in range(8)]
        for i, (r, w) in enumerate(pipes):
            os.write(w, bytes([i]) * 40_000)
        assert [len(os.read(r, 65536)) for r, _ in pipes] == [40_000] * 8
        """
    )
    result = check_asserts(code, TESTS, limits=Limits(timeout=20, memory_mb=64))
    assert (result.status, result.score) == ("passed", 1.0), result


def test_pipes_cannot_grow_past_their_default_capacity() -> None:
    """F_SETPIPE_SZ past 64 KiB is refused (EPERM, as the kernel answers past pipe-max-size): a pipe passed over a
    Unix socket and closed is in no descriptor table the count reads, so each must stay small. Shrinking works."""
    code = textwrap.dedent(
        """
        import fcntl, os
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
            print("grew")
        except OSError as e:
            print("refused", e.errno)
        print(fcntl.fcntl(w, 1031, 4096), fcntl.fcntl(w, 1031, 65536), fcntl.fcntl(w, 1032))
        """
    )
    result = execute(code, limits=BUDGET)
    assert (result.status, result.stdout) == ("ok", f"refused {errno.EPERM}\n4096 65536 65536\n"), result


OWN_TABLES = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
clone3, unshare, clone = {"x86_64": (435, 272, 56), "aarch64": (435, 97, 220)}[platform.machine()]
def call(*args):
    return libc.syscall(*args), ctypes.get_errno()
print(*call(clone3, None, 88))  # its flags sit in memory a filter cannot read
print(*call(unshare, 0x400))  # CLONE_FILES: a descriptor table of its own
print(*call(clone, 0x10000 | 0x800 | 0x100, None, None, None, None))  # a thread without CLONE_FILES
"""
HONEST_THREADS = """
import os, subprocess, threading
out = []
threads = [threading.Thread(target=lambda i=i: out.append(i * i)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
print(sorted(out), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(subprocess.run(["/bin/echo", "hi"], capture_output=True, check=True).stdout.decode(), end="")
"""


def test_no_descriptor_table_the_pipe_count_cannot_read() -> None:
    """The count reads each process's descriptor table; a thread with a table of its own would hide pipes from
    it. clone3 is ENOSYS (the C library falls back to clone), unshare EPERM, a thread without CLONE_FILES EINVAL."""
    result = execute(OWN_TABLES, limits=BUDGET)
    expected = f"-1 {errno.ENOSYS}\n-1 {errno.EPERM}\n-1 {errno.EINVAL}\n"
    assert (result.status, result.stdout) == ("ok", expected), result


def test_threads_forks_and_subprocesses_still_work() -> None:
    result = execute(HONEST_THREADS, limits=BUDGET)
    assert (result.status, result.stdout) == ("ok", "[0, 1, 4, 9] 7\nhi\n"), result


# --- CPU: one budget for all of a run's processes --------------------------------------------------------------

BURNERS = """
import os
for _ in range(7):
    if os.fork() == 0:
        while True:
            pass
while True:
    pass
"""


def test_processes_of_a_run_share_one_cpu_budget() -> None:
    """Eight busy processes spend the run's one CPU budget together (the run stops with SIGXCPU, as an rlimit
    would stop one process), not eight budgets, whatever the kernel's autogroup setting."""
    result = execute(BURNERS, limits=Limits(timeout=30, cpu_seconds=1))
    assert (result.status, result.exit_code) == ("timeout", -signal.SIGXCPU), result
    assert result.duration < 25, result


def test_a_run_within_its_cpu_budget_is_not_stopped() -> None:
    code = "import os\nif os.fork() == 0:\n    sum(range(10**6))\n    os._exit(0)\nos.wait()\nprint(sum(range(10**6)))"
    result = execute(code, limits=Limits(timeout=30, cpu_seconds=2))
    assert (result.status, result.stdout) == ("ok", "499999500000\n"), result


# --- network: each run its own namespace -----------------------------------------------------------------------

LISTENER = """
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\\0rlloom-batch-peer")
s.listen(1)
s.settimeout(4)
try:
    c, _ = s.accept()
    print("got", c.recv(10))
except OSError as e:
    print("alone", type(e).__name__)
"""
CALLER = """
import socket, time
end = time.monotonic() + 4
while time.monotonic() < end:
    try:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect("\\0rlloom-batch-peer")
        c.send(b"hi")
        print("reached a peer")
        break
    except OSError:
        time.sleep(0.05)
else:
    print("alone")
"""


def test_concurrent_runs_cannot_reach_each_other() -> None:
    """Two runs of one batch at the same time: an abstract Unix socket one listens on is not the other's to reach
    (a network namespace shared by all runs would connect them)."""
    out: dict[str, str] = {}

    def run(key: str, code: str) -> None:
        out[key] = execute(code, timeout=10).stdout

    threads = [
        threading.Thread(target=run, args=(key, code)) for key, code in (("listener", LISTENER), ("caller", CALLER))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert out == {"listener": "alone TimeoutError\n", "caller": "alone\n"}


def test_processes_of_one_run_can_talk_to_each_other() -> None:
    code = (
        "import os, socket, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ns.bind('\\0rlloom-own-peer')\ns.listen(1)\n"
        "if os.fork() == 0:\n    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    c.connect('\\0rlloom-own-peer')\n    c.send(b'hi')\n    os._exit(0)\n"
        "conn, _ = s.accept()\nprint(conn.recv(10))\nos.wait()\n"
    )
    result = execute(code, timeout=10)
    assert (result.status, result.stdout) == ("ok", "b'hi'\n"), result
