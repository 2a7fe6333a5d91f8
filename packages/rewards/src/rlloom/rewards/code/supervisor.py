# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
# ruff: noqa: SIM105  (contextlib costs start-up time in every sandbox; try/except/pass does the same)
"""The harness inside the sandbox: seal the run, then start the candidate in a process of its own.

Run by `sandboxed.py` (which the parent starts under `python -I -S -B`; this module arrives compiled, with its
siblings `wire` and `channel`, and imports nothing else outside the standard library). In namespaces mode this is
the first process of a fresh PID namespace. Before any untrusted byte runs it joins the empty network namespace,
chroots into a minimal read-only root (system dirs, a /dev with only null, zero, full, random and urandom, so no
host pseudo-terminal can be taken, /proc, the stdlib and a private size-capped tmpfs at /tmp) and sets resource
limits. Then it forks:

- the candidate process drops to a random unprivileged uid, forbids privilege gain and runs the solution
  (the whole program for stdin/stdout tasks; for tests, it loads the solution and answers calls, see `channel.py`);
- this process, the supervisor, drops to another unprivileged uid and re-arms its parent-death signal (which the
  candidate, under another uid, cannot touch). It alone reads the tests (TESTS_FD, opened only after the fork,
  so they never exist in the candidate's memory), runs them in a fresh namespace, and alone holds RESULT_FD.

Test outcomes go to RESULT_FD as `NONCE INDEX P|F reason` lines, then `NONCE END COUNT`; how the candidate
process ended goes as `NONCE EXIT CODE`, a blown memory budget as `NONCE MEMORY`, a spent CPU budget as `NONCE
CPU`. The candidate has no descriptor to that pipe, so it cannot forge a record. The supervisor keeps one memory
budget and one CPU budget for the whole run: every 20 ms (an interval timer) it sums, over every process in the
run (all of the PID namespace; in weak mode itself and its descendants, as a child subreaper), the resident
memory and the CPU time (with that of exited children), adds the memory no process's resident set shows (the
run's pipe buffers; its System V shared memory segments, attached or not; its tmpfs, which also holds /dev/shm
and POSIX shared memory; what its Unix and netlink sockets hold in flight: see `meters`), and ends the run when
either sum passes its budget. memfd files, which no count could see, cannot be made at all (a seccomp filter
answers memfd_create with ENOSYS); pipes cannot grow past their default 64 KiB; the run's IPC namespace caps
System V shared memory at the budget and allows no message queues. When the supervisor ends, for any reason,
the kernel kills every process in its PID namespace.
"""

import _signal
import marshal
import os
import resource
import select
import sys

try:  # as part of the rlloom package (type checks)
    from . import channel, meters, wire
except ImportError:  # inside the sandbox, where `sandboxed.py` loaded its siblings as top-level modules
    import channel  # type: ignore[no-redef]
    import meters  # type: ignore[no-redef]
    import wire  # type: ignore[no-redef]

SETUP_FAILED = 121  # exit code meaning "the sandbox could not be sealed"; the parent reports a sandbox error
PAGE = os.sysconf("SC_PAGE_SIZE")
DEV_NODES = ("null", "zero", "full", "random", "urandom")


def _libc_caller():
    """A minimal libc call helper on `_ctypes` alone (the full ctypes package costs ~6 ms of start-up)."""
    import _ctypes

    class c_long(_ctypes._SimpleCData):  # noqa: N801
        _type_ = "l"

    handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]

    def call(name, *args):
        class Fn(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = c_long

        fn = Fn(_ctypes.dlsym(handle, name))
        converted = [c_long(a) if isinstance(a, int) else a for a in args]
        _ctypes.set_errno(0)
        result = fn(*converted)
        if result == -1:
            err = _ctypes.get_errno()
            raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")
        return result

    return call


EXPOSED = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")  # plus /dev, /proc, /tmp
SITE = "/site"  # where the host's scientific packages (numpy, scipy ...) appear, read-only
_BIND, _REC, _REMOUNT, _RDONLY, _NOSUID, _NODEV = 4096, 16384, 32, 1, 2, 4


def _seal_filesystem(call, uid, tmpfs_mb, stdlib, site):
    """Chroot into a minimal read-only root: system dirs, a minimal /dev, /proc, the stdlib, the host's scientific
    packages (numpy ...) under /site, a private /tmp.

    Everything else on the host (home directories, the repository, data sets with their answers) is not there at
    all. The host tree is first made read-only and nosuid (mount_setattr, recursive), so every bind inherits that.
    """
    fds = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in stdlib}
    site_fds = [(os.open(source, os.O_PATH), target) for source, target in site]
    attr = (_RDONLY | _NOSUID).to_bytes(8, "little") + bytes(24)  # struct mount_attr: attr_set
    call("syscall", 442, -100, b"/", 0x8000, attr, 32)  # SYS_mount_setattr(AT_FDCWD, "/", AT_RECURSIVE, ...)
    root = "/tmp"  # any existing directory serves as the mount point of the new root
    call("mount", b"tmpfs", root.encode(), b"tmpfs", _NOSUID | _NODEV, b"size=1m,mode=0755")

    def bind(source, target):
        call("mount", source.encode(), target.encode(), None, _BIND | _REC, None)
        call("mount", None, target.encode(), None, _REMOUNT | _BIND | _RDONLY | _NOSUID, None)

    for top in EXPOSED:
        if os.path.islink(top):
            os.symlink(os.readlink(top), root + top)
        elif os.path.isdir(top):
            os.mkdir(root + top)
            bind(top, root + top)
    os.mkdir(root + "/proc")
    call("mount", b"/proc", (root + "/proc").encode(), None, _BIND | _REC, None)
    _minimal_dev(call, root + "/dev")
    for path, fd in fds.items():
        if not os.path.isdir(root + path):
            os.makedirs(root + path, 0o755)
            bind(f"/proc/self/fd/{fd}", root + path)
        os.close(fd)
    for fd, target in site_fds:  # a package directory, its bundled libraries (numpy.libs), or a one-file module
        os.makedirs(os.path.dirname(root + target), 0o755, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(root + target)
        else:
            open(root + target, "w").close()
        bind(f"/proc/self/fd/{fd}", root + target)
        os.close(fd)
    os.mkdir(root + "/tmp")
    options = f"size={tmpfs_mb}m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}".encode()
    call("mount", b"tmpfs", (root + "/tmp").encode(), b"tmpfs", _NOSUID | _NODEV, options)
    call("mount", None, root.encode(), None, _REMOUNT | _RDONLY | _NOSUID | _NODEV, None)
    os.chroot(root)


def _minimal_dev(call, dev):
    """A tmpfs /dev holding only harmless nodes (no ptmx, tty, kmsg or disks) and the usual links."""
    os.mkdir(dev)
    call("mount", b"tmpfs", dev.encode(), b"tmpfs", _NOSUID, b"size=64k,nr_inodes=64,mode=0755")
    for node in DEV_NODES:
        open(f"{dev}/{node}", "w").close()
        call("mount", f"/dev/{node}".encode(), f"{dev}/{node}".encode(), None, _BIND, None)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("shm", "/tmp")):  # fmt: skip
        os.symlink(target, f"{dev}/{name}")
    call("mount", None, dev.encode(), None, _REMOUNT | _RDONLY | _NOSUID, b"size=64k,nr_inodes=64,mode=0755")


def _limit_ipc(budget):
    """The run's own IPC namespace (`unshare --ipc`): System V shared memory capped at the run's budget, a few
    segments at most, no message queues (kernel memory no count sees). Its sysctls are the namespace's own."""
    pages = max(1, budget // PAGE)
    for name, value in (("shmmax", budget), ("shmall", pages), ("shmmni", 16), ("msgmni", 0)):
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write(str(value))


def _seal_root(cfg):
    """Network, filesystem and limits: what the supervisor and the candidate share. Returns the libc caller."""
    call = _libc_caller()
    if cfg["mode"] == "namespaces":  # `unshare` gave the run its own network namespace: no interface is up
        _limit_ipc(cfg["budget_mb"] << 20)
        _seal_filesystem(call, cfg["uid"], cfg["tmpfs_mb"], cfg["stdlib"], cfg["site"])
        if cfg["site"]:
            sys.path.append(SITE)
    else:
        call("prctl", 36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: the candidate's orphans stay ours to count and kill
    os.chdir(cfg["workdir"])
    for name, value in cfg["limits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    return call


def _become(call, uid, cfg, *, trace=False):
    """Drop to `uid` (as root; weak mode as a user keeps its uid), forbid privilege gain, die with our parent.
    `trace` (the supervisor): keep CAP_SYS_PTRACE alone, which `meters.pipe_memory` needs to read the run's pipes
    (its PID namespace confines it to the run's own processes)."""
    if os.geteuid() == 0 and (cfg["mode"] == "namespaces" or not cfg["stdlib_hidden"]):
        if trace:
            call("prctl", 8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS: the uid change keeps the permitted set
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        if trace:  # capset(_LINUX_CAPABILITY_VERSION_3): effective = permitted = CAP_SYS_PTRACE, nothing else
            ptrace = (1 << 19).to_bytes(4, "little")
            call("capset", (0x20080522).to_bytes(4, "little") + bytes(4), ptrace + ptrace + bytes(16))
    call("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    call("prctl", 1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL (a uid change clears it, so set it after)
    _deny_memfd(call)


# per architecture: audit arch; memfd_create, memfd_secret, bpf, io_uring_setup/enter/register, clone3 (refused);
# socket, socketpair (family checked); fcntl (F_SETPIPE_SZ checked), clone (flags checked), unshare (refused);
# whether x32 syscall numbers exist (they would bypass the number checks)
_SECCOMP_ARCH = {
    "x86_64": (0xC000003E, (319, 447, 321, 425, 426, 427, 435), (41, 53), (72, 56, 272), True),
    "aarch64": (0xC00000B7, (279, 447, 280, 425, 426, 427, 435), (198, 199), (25, 220, 97), False),
}
_SOCKET_FAMILIES = (1, 2, 10, 16)  # AF_UNIX, AF_INET, AF_INET6 (no interface is up), AF_NETLINK: all counted


def _deny_memfd(call):
    """A seccomp filter, inherited by every process the run starts (no_new_privs is already set). Refused with
    ENOSYS: memfd_create and memfd_secret (a memfd's pages are in no process's resident set, so the run's budget
    could not count them), bpf maps, io_uring (whose operations would not pass this filter), every syscall of a
    foreign ABI (32-bit int 0x80 on x86_64, x32). Refused with EAFNOSUPPORT: sockets of any family but Unix,
    IP (no interface is up) and netlink, whose buffers the budget counts (AF_ALG, for one, would hold megabytes
    per socket uncounted). Refused with EPERM (what the kernel answers above pipe-max-size): F_SETPIPE_SZ past a
    pipe's default capacity, so a pipe no descriptor table shows (passed over a Unix socket, then closed) holds
    64 KiB at most, a bound the kernel's in-flight descriptor limit multiplies (see `meters.pipe_memory`).
    Descriptor tables the pipe count could not read: unshare (EPERM) and a thread without its process's table
    (clone with CLONE_THREAD but not CLONE_FILES: EINVAL; clone3, whose flags a filter cannot read: ENOSYS, so
    the C library falls back to clone)."""
    import _ctypes

    arch = _SECCOMP_ARCH.get(os.uname().machine)
    if arch is None:
        return
    audit, refused, sockets, (fcntl, clone, unshare), x32 = arch
    steps = [("ld", 4), ("jeq", audit, None, "enosys"), ("ld", 0)]  # seccomp_data.arch, then .nr
    steps += [("jge", 0x40000000, "enosys", None)] if x32 else []
    steps += [("jeq", number, "enosys", None) for number in refused]
    steps += [("jeq", number, "family", None) for number in sockets]
    steps += [("jeq", fcntl, "fcntl", None), ("jeq", clone, "clone", None), ("jeq", unshare, "eperm", None)]
    steps += [("ret", 0x7FFF0000), ("family", 0), ("ld", 16)]  # SECCOMP_RET_ALLOW; args[0], low 32 bits
    steps += [("jeq", family, "allow", None) for family in _SOCKET_FAMILIES]
    steps += [("ret", 0x00050000 | 97), ("fcntl", 0), ("ld", 24), ("jeq", 1031, None, "allow")]  # F_SETPIPE_SZ
    steps += [("ld", 32), ("jgt", meters.PIPE_DEFAULT, "eperm", "allow")]
    # a thread (CLONE_THREAD) must share its parent's descriptor table (CLONE_FILES), which the pipe count reads
    steps += [("clone", 0), ("ld", 16), ("jset", 0x10000, None, "allow"), ("jset", 0x400, "allow", None)]
    steps += [("ret", 0x00050000 | 22), ("eperm", 0), ("ret", 0x00050000 | 1), ("allow", 0)]
    steps += [("ret", 0x7FFF0000), ("enosys", 0), ("ret", 0x00050000 | 38)]
    labels: dict = {}
    code: list = []
    for step in steps:
        if step[0] in ("family", "fcntl", "clone", "eperm", "allow", "enosys"):
            labels[step[0]] = len(code)
        else:
            code.append(step)
    opcodes = {"ld": 0x20, "jeq": 0x15, "jgt": 0x25, "jge": 0x35, "jset": 0x45, "ret": 0x06}
    program = b""
    for i, (op, k, *jumps) in enumerate(code):
        jt, jf = (labels[t] - i - 1 if t else 0 for t in jumps) if jumps else (0, 0)
        program += opcodes[op].to_bytes(2, "little") + bytes((jt, jf)) + k.to_bytes(4, "little")

    class c_char(_ctypes._SimpleCData):  # noqa: N801
        _type_ = "c"

    class Buffer(_ctypes.Array):
        _type_ = c_char
        _length_ = len(program)

    buffer = Buffer.from_buffer_copy(program)
    fprog = len(code).to_bytes(2, "little") + bytes(6) + _ctypes.addressof(buffer).to_bytes(8, "little")
    call("prctl", 22, 2, fprog, 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER


def _run_script(source):
    """Run the program as `__main__` from solution.py in the work dir; an uncaught exception exits with 1."""
    with open("solution.py", "w") as f:
        f.write(source)
    sys.argv[:] = ["solution.py"]
    module = type(sys)("__main__")
    module.__file__ = "solution.py"
    sys.modules["__main__"] = module
    exec(compile(source, "solution.py", "exec", dont_inherit=True), module.__dict__)


def _candidate(cfg, ready_w, req_r, rep_w):
    """The candidate process: seal its identity, say so, then run the solution. Never returns for test jobs."""
    _become(cfg["call"], cfg["uid"], cfg)
    os.write(ready_w, b"R")
    os.close(ready_w)
    cfg["started"] = True
    if cfg["kind"] == "script":
        os.close(req_r)
        os.close(rep_w)
        _run_script(cfg["code"])  # returns (or raises) into the interpreter's own exit path
        return
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(cfg["code"], "solution.py", "exec", dont_inherit=True), namespace)
        missing = [name for name in cfg["required"] if name not in namespace]
        status = f"solution does not define {missing[0]!r}" if missing else ""
    except BaseException as exc:
        status = "solution failed to load: " + _describe(exc)
    try:
        shadowed = [name for name in cfg["shadowed"] if name in namespace]
        wire.send(rep_w, ["loaded", status, shadowed, _exception_classes(namespace, cfg["names"] + shadowed)])
    except (OSError, ValueError, TypeError, wire.UnencodableError):
        os._exit(0)
    channel.serve(namespace, req_r, rep_w)
    os._exit(0)


def _exception_classes(namespace, names):
    """[name, class lineage] for each of `names` that the solution defines as an exception class: the tests get a
    stand-in class of their own for it (see `Channel.stand_in`), so `except TheSolutionsError` works."""
    found = []
    for name in names:
        value = namespace.get(name)
        try:
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append([name, [f"{c.__module__}.{c.__qualname__}" for c in value.__mro__][:16]])
        except BaseException:
            continue
    return found


class _Watch:
    """The supervisor's view of the run: the candidate's pid, the memory budget, and how to end everything."""

    def __init__(self, pid, cfg, emit):
        self.pid, self.emit = pid, emit
        self.budget = cfg["budget_mb"] << 20
        self.cpu_ticks = cfg["cpu_budget"] * os.sysconf("SC_CLK_TCK")
        self.ns = cfg["mode"] == "namespaces"
        self.max_fds = cfg["limits"]["RLIMIT_NOFILE"]
        self.checking = False

    def pids(self):
        if self.ns:  # this /proc shows the run's PID namespace only
            return [int(p) for p in os.listdir("/proc") if p.isdigit()]
        found, todo = [os.getpid()], [os.getpid()]
        while todo:
            pid = todo.pop()
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        kids = [int(k) for k in f.read().split()]
                    found += kids
                    todo += kids
            except (OSError, ValueError):
                continue
        return found

    def check(self):
        """End the run when its memory (the resident sets of all its processes, its pipes, System V shared memory,
        sockets and tmpfs: see `meters`) or its CPU time (all its processes, live, exited or zombie) passes the
        budget. A check the timer starts while one is still running (a loaded host) is skipped."""
        if self.checking:
            return
        self.checking = True
        try:
            self._check()
        finally:
            self.checking = False

    def _check(self):
        resident = ticks = 0
        pids = self.pids()
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                resident += int(fields[21]) * PAGE  # rss; utime, stime, cutime, cstime:
                ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            except (OSError, ValueError, IndexError):
                continue
        shared, tmpfs = meters.pipe_memory(pids, self.max_fds), 0
        if self.ns:  # the run's own IPC and network namespaces: what they hold is the run's
            shared += meters.sysv_shm() + meters.unix_socket_memory() + meters.netlink_memory()
            try:
                st = os.statvfs("/tmp")
                tmpfs = (st.f_blocks - st.f_bfree) * st.f_frsize
            except OSError:
                pass
        total = resident + shared + tmpfs
        if total > self.budget:
            self.emit(f"MEMORY {total >> 20} {resident >> 20} {shared >> 20} {tmpfs >> 20}")
            self.end()
        if ticks > self.cpu_ticks:
            self.emit(f"CPU {ticks}")
            self.end()

    def end(self):
        if not self.ns:  # no PID namespace to take them down: kill what we can see
            for pid in self.pids()[1:]:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
        os._exit(0)

    def exit_code(self, block):
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status) if pid else None

    def start(self):
        """Check the budget every 20 ms from now on, whatever the supervisor is doing (waiting or running tests).
        `_signal`, not `signal`: the latter imports `enum`, a few ms at every start."""
        _signal.signal(_signal.SIGALRM, lambda signum, frame: self.check())
        _signal.setitimer(_signal.ITIMER_REAL, 0.02, 0.02)

    def wait(self):
        """Wait for the candidate process to end (the timer keeps checking memory); report how it ended."""
        self.emit(f"EXIT {self.exit_code(True)}")


def _describe(exc):
    """`Type: message`, short."""
    try:
        return f"{type(exc).__name__}: {exc}"[:200]
    except BaseException:
        return "exception (unprintable)"


IDENTITY = (
    " (an identity test, `is`, is never true across the sandbox boundary: the tests get copies of the solution's "
    "values; refused, as sharing objects would let a solution decide its own comparisons)"
)


def _run_tests(units, cfg, calls, report, exceptions):
    """Run each unit in a fresh namespace whose only links to the solution are the names the tests read from it:
    `Remote` objects, and stand-in classes for its exception classes. The modules the tests use without importing
    them (MBPP's `math`, `sys`) are the real ones, imported here, never the solution's."""
    ns = {"__name__": "__test__", "__builtins__": __builtins__}
    for kind, code in units:
        if kind == "helper":  # trusted code shipped with the task (HumanEval's prompt): defines what tests use
            try:
                exec(code, ns)
            except Exception:
                pass
    for name in cfg["imports"]:
        if name not in ns:
            try:
                ns[name] = __import__(name)
            except Exception:
                pass
    for name, lineage in sorted(exceptions, key=lambda e: len(e[1]) if type(e[1]) is list else 0):  # bases first
        valid = type(name) is str and type(lineage) is list and lineage and type(lineage[0]) is str
        if valid and name in cfg["names"] and name not in ns:
            ns[name] = calls.stand_in(name, lineage)
    for name in cfg["names"]:
        if name not in ns:
            ns[name] = calls.remote(["n", name], name)
    for name, target in cfg["bind"]:
        ns[name] = calls.remote(["n", target], target)
    for index, (kind, code) in enumerate(units):
        if kind == "helper":
            continue
        try:
            exec(code, ns)
        except wire.CandidateGoneError:
            raise
        except BaseException as exc:
            reason = _describe(exc)
            if type(exc) is AssertionError and code.co_filename.endswith(" (is)"):
                reason += IDENTITY
            if kind == "setup":
                for later in range(index, len(units)):
                    if units[later][0] == "test":
                        report(later, False, "setup failed: " + reason)
                return
            report(index, False, reason)
        else:
            if kind == "test":
                report(index, True, "")


def _supervise_tests(cfg, tests_fd, watch, *, req_w, rep_r, report, emit):
    with os.fdopen(tests_fd, "rb") as f:
        units = marshal.loads(f.read())
    tests = [i for i in range(len(units)) if units[i][0] == "test"]
    try:
        loaded = wire.receive(rep_r)
        if type(loaded) is not list or len(loaded) != 4 or loaded[0] != "loaded" or type(loaded[1]) is not str:
            raise wire.ProtocolError("bad load notice")
        if type(loaded[2]) is not list or type(loaded[3]) is not list:
            raise wire.ProtocolError("bad load notice")
        cfg["names"] += [name for name in cfg["shadowed"] if name in loaded[2]]  # only names the tests call alone
        if loaded[1]:
            for index in tests:
                report(index, False, loaded[1][:200])
        else:
            exceptions = [e for e in loaded[3] if type(e) is list and len(e) == 2]
            _run_tests(units, cfg, channel.Channel(req_w, rep_r), report, exceptions)
    except wire.CandidateGoneError:  # the solution's process ended before the tests did: no completion record
        os.close(req_w)
        if select.select([os.pidfd_open(watch.pid)], [], [], 0.5)[0]:
            emit(f"EXIT {watch.exit_code(True)}")
        watch.end()
    except wire.ProtocolError as exc:
        for index in tests:
            report(index, False, str(exc)[:200])
    emit(f"END {len(units)}")
    watch.end()


def main(cfg, tests_fd, result_fd):
    """Seal the run, fork the candidate, supervise it (called by `sandboxed.py` with the job already read)."""
    wire.MAX_FRAME = cfg["budget_mb"] << 20  # no message may be larger than the run's whole memory budget
    try:
        cfg["call"] = _seal_root(cfg)
        ready_r, ready_w = os.pipe()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
    except BaseException as exc:
        os.write(2, f"rlloom sandbox setup failed: {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    if pid == 0:
        for fd in (tests_fd, result_fd, ready_r, req_w, rep_r):
            os.close(fd)
        cfg.pop("nonce")
        try:
            _candidate(cfg, ready_w, req_r, rep_w)
        except BaseException as exc:
            if cfg.get("started"):
                raise
            os.write(2, f"rlloom sandbox setup failed: {type(exc).__name__}: {exc}\n".encode())
            os._exit(SETUP_FAILED)
        return
    for fd in (ready_w, req_r, rep_w):
        os.close(fd)
    nonce = cfg.pop("nonce")

    def emit(line):
        os.write(result_fd, f"{nonce} {line}\n".encode("utf-8", "replace"))

    def report(index, passed, reason):
        emit(f"{index} {'P' if passed else 'F'} {reason.replace(chr(10), ' ').replace(chr(13), ' ')}")

    watch = _Watch(pid, cfg, emit)
    try:
        if cfg["mode"] == "namespaces":  # another uid than the candidate's: it cannot signal, trace or prctl us
            _become(cfg["call"], cfg["uid"] + 1, cfg, trace=True)
        else:  # weak mode keeps its identity, so it can kill the candidate's processes it finds
            cfg["call"]("prctl", 1, 9, 0, 0, 0)
        ready = os.read(ready_r, 1)
    except BaseException as exc:
        os.write(2, f"rlloom sandbox setup failed: {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    if ready != b"R":  # the candidate process could not seal itself (its stderr says why)
        watch.exit_code(True)
        os._exit(SETUP_FAILED)
    emit("SEALED")
    watch.start()
    if cfg["kind"] == "script":
        os.close(tests_fd)
        watch.wait()
        watch.end()
    _supervise_tests(cfg, tests_fd, watch, req_w=req_w, rep_r=rep_r, report=report, emit=emit)
