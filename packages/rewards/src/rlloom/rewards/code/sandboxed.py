# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
# ruff: noqa: N803, N806, SIM105, SIM110  (the harness binds builtins to locals before the candidate runs)
"""The program that runs inside the sandbox: seal the process, then run the untrusted code and its tests.

Started by `runner.py` as `python -I -S sandboxed.py CFG_FD RESULT_FD` (standalone: it imports nothing from rlloom,
because `-I -S` keeps site-packages off the path and start-up short). It reads its job (marshal) from CFG_FD, then,
before any untrusted byte runs (namespaces mode): joins the empty network namespace, chroots into a minimal read-only
root with a fresh private tmpfs at /tmp as the working directory, sets resource limits, drops to an unprivileged
uid and forbids privilege gain.

Test outcomes go to RESULT_FD as `NONCE INDEX P|F reason` lines, one written only after that test statement ran
to completion, then `NONCE END COUNT`. The nonce is a per-run secret the parent chose; the parent counts only
well-formed stamped lines and requires the END line, so exiting early, killing the process or printing text
earns nothing. Every tool the harness uses is bound to a local before the candidate runs, so patching builtins,
`AssertionError` or `sys.exit` does not change how outcomes are judged, and every value a test gets back from a
call must be plain data (builtin types, C types, or subclasses that keep their base's comparison and arithmetic),
which defeats "always equal" objects.
"""

import marshal
import os
import resource
import sys

SETUP_FAILED = 121  # exit code meaning "the sandbox could not be sealed"; the parent reports a sandbox error
_HEAPTYPE = 1 << 9
_DUNDERS = (
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__", "__hash__", "__abs__",
    "__sub__", "__rsub__", "__add__", "__radd__", "__mul__", "__rmul__", "__truediv__", "__float__", "__int__",
    "__index__", "__round__", "__contains__", "__iter__", "__getitem__", "__neg__", "__format__",
)  # fmt: skip


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
_BIND, _REC, _REMOUNT, _RDONLY, _NOSUID, _NODEV = 4096, 16384, 32, 1, 2, 4


def _seal_filesystem(call, uid, tmpfs_mb, stdlib):
    """Chroot into a minimal read-only root: system dirs, /dev, /proc, the stdlib, and a private tmpfs at /tmp.

    Everything else on the host (home directories, the repository, data sets with their answers) is not there at
    all. The host tree is first made read-only and nosuid (mount_setattr, recursive), so every bind inherits that.
    """
    fds = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in stdlib}
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
    for top in ("/dev", "/proc"):
        os.mkdir(root + top)
        call("mount", top.encode(), (root + top).encode(), None, _BIND | _REC, None)
    for path, fd in fds.items():
        if not os.path.isdir(root + path):
            os.makedirs(root + path, 0o755)
            bind(f"/proc/self/fd/{fd}", root + path)
        os.close(fd)
    os.mkdir(root + "/tmp")
    options = f"size={tmpfs_mb}m,nr_inodes=4096,mode=0700,uid={uid},gid={uid}".encode()
    call("mount", b"tmpfs", (root + "/tmp").encode(), b"tmpfs", _NOSUID | _NODEV, options)
    call("mount", None, root.encode(), None, _REMOUNT | _RDONLY | _NOSUID | _NODEV, None)
    os.chroot(root)


def _seal(cfg):
    """Limits, filesystem and identity, in the order that keeps each step possible."""
    call = _libc_caller() if cfg["mode"] == "namespaces" else None
    uid = cfg["uid"]
    if call is not None:
        call("setns", cfg["netns_fd"], 0x40000000)  # CLONE_NEWNET: join the shared empty network namespace
        os.close(cfg["netns_fd"])
        _seal_filesystem(call, uid, cfg["tmpfs_mb"], cfg["stdlib"])
    os.chdir(cfg["workdir"])
    limits = cfg["limits"]
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))
    if os.geteuid() == 0 and (call is not None or not cfg["stdlib_hidden"]):  # weak: root keeps the stdlib readable
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if call is not None:
        call("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        call("prctl", 1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL (a uid change clears it)


def _dunders(t, _names=_DUNDERS, _get=type.__getattribute__, _Missing=AttributeError):
    """The comparison, truth and arithmetic methods `t` resolves to (tools bound as defaults: patch-proof)."""
    found = {}
    for name in _names:
        try:
            found[name] = _get(t, name)
        except _Missing:
            found[name] = None
    return found


def _module_guard(names):
    """Snapshot the modules the tests import, before the candidate runs; return a function that restores them.

    Restoring after every call the tests make undoes a candidate's `math.isclose = lambda *a: True` (or a fake
    module put into sys.modules) before the tests can use it.
    """
    modules, saved = sys.modules, []
    for name in names:
        try:
            __import__(name)
            module = modules[name]
            saved.append((name, module, module.__dict__, dict(module.__dict__)))
        except BaseException:
            continue

    def restore(_setitem=dict.__setitem__, _update=dict.update):
        for name, module, live, snapshot in saved:
            _setitem(modules, name, module)
            _update(live, snapshot)

    return restore


def _make_gate(cap, vetted, restore):
    """Build `call(f, *args)`: call f, and refuse results that are not plain data (see the module docstring).

    `vetted` maps stdlib heap types imported before the candidate ran (e.g. Counter) to their dunders then.
    Nothing is cached: a class the candidate patches later is judged as it is at that moment. Every tool is
    bound here, before the candidate runs, so patching builtins or this module's globals changes nothing.
    """
    _type, _isinstance, _next, _object, _TypeError, _dict = type, isinstance, next, object, TypeError, dict
    _flags = type.__dict__["__flags__"].__get__
    _mro = type.__dict__["__mro__"].__get__
    _qualname = type.__dict__["__qualname__"].__get__
    heap, names, dunders = _HEAPTYPE, _DUNDERS, _dunders
    containers = (list, tuple, set, frozenset, dict)
    keys, values = dict.keys, dict.values
    pop, extend = list.pop, list.extend

    def trusted_type(t):
        if not _flags(t) & heap:
            return True
        theirs = vetted.get(t)
        if theirs is None:
            theirs = dunders(_next((b for b in _mro(t) if not _flags(b) & heap), _object))
        mine = dunders(t)
        for name in names:
            if mine[name] is not theirs[name]:
                return False
        return True

    def check_plain(value):
        stack, seen = [value], 0
        while stack:
            v = pop(stack)
            seen += 1
            if seen > cap:
                raise _TypeError(f"result has more than {cap} parts; too large to check")
            t = _type(v)
            if not trusted_type(t):
                raise _TypeError(f"candidate returned a {_qualname(t):.60} object, which overrides comparison")
            if _isinstance(v, _dict):
                extend(stack, keys(v))
                extend(stack, values(v))
            elif _isinstance(v, containers):
                extend(stack, v)

    def gate(f, /, *args, **kwargs):
        try:
            result = f(*args, **kwargs)
        finally:
            restore()
        if not _isinstance(f, _type):  # constructing a class the test itself names is exempt
            check_plain(result)
        return result

    return gate


def _describe(exc, _type=type, _str=str, _Base=BaseException):
    """`Type: message`, short; the message is the candidate's text, so printing it may itself fail."""
    try:
        return f"{_type.__dict__['__name__'].__get__(_type(exc))}: {_str(exc)}"[:200]
    except _Base:
        return "exception (unprintable)"


def _run_units(units, report, ns, restore, _exec=exec, _Base=BaseException, _range=range, _len=len, _say=_describe):
    """Run each unit in `ns`; report P only after a test statement completed, F with a short reason otherwise."""
    for index in _range(_len(units)):
        kind, code = units[index]
        try:
            restore()
            _exec(code, ns)
        except _Base as exc:  # SystemExit and KeyboardInterrupt raised by the candidate fail the test too
            reason = _say(exc)
            if kind == "setup":
                for later in _range(index, _len(units)):
                    if units[later][0] == "test":
                        report(later, False, "setup failed: " + reason)
                return
            report(index, False, reason)
        else:
            if kind == "test":
                report(index, True, "")


def _run_script(source: str) -> None:
    """Run the program as `__main__` from solution.py in the work dir; an uncaught exception exits with 1."""
    with open("solution.py", "w") as f:
        f.write(source)
    sys.argv[:] = ["solution.py"]
    module = type(sys)("__main__")
    module.__file__ = "solution.py"
    sys.modules["__main__"] = module
    exec(compile(source, "solution.py", "exec"), module.__dict__)


def main() -> None:
    cfg_fd, result_fd = int(sys.argv[1]), int(sys.argv[2])
    try:
        with os.fdopen(cfg_fd, "rb") as f:
            cfg = marshal.loads(f.read())
        _seal(cfg)
    except BaseException as exc:
        os.write(2, f"rlloom sandbox setup failed: {type(exc).__name__}: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    nonce = cfg.pop("nonce")
    os.write(result_fd, f"{nonce} SEALED\n".encode())
    if cfg["kind"] == "script":
        os.close(result_fd)
        _run_script(cfg["code"])
        return
    _judge_tests(cfg, nonce, result_fd)


def _judge_tests(cfg, nonce, result_fd):
    """Load the candidate, then run the test units; everything used after the load is bound before it."""
    import builtins

    _write, _exit, _encode, _replace, _Base, _exec = os.write, os._exit, str.encode, str.replace, BaseException, exec
    _settrace, _setprofile, _dict, _len, _describe_ = sys.settrace, sys.setprofile, dict, len, _describe
    _run, streams = _run_units, (sys.stdout, sys.stderr)
    units, source = cfg["units"], cfg["code"]
    tests = [index for index in range(len(units)) if units[index][0] == "test"]

    def report(index, passed, reason):
        clean = _replace(_replace(reason, "\n", " "), "\r", " ")
        _write(result_fd, _encode(f"{nonce} {index} {'P' if passed else 'F'} {clean}\n", "utf-8", "replace"))

    def finish():
        for stream in streams:
            try:
                stream.flush()
            except _Base:
                pass
        _write(result_fd, _encode(f"{nonce} END {_len(units)}\n"))
        _exit(0)

    def fail_all(reason):
        for index in tests:
            report(index, False, reason)
        finish()

    clean_builtins = dict(builtins.__dict__)
    vetted = {}
    if "Counter" in source:  # import it before the candidate can touch it, so a returned Counter is trusted
        from collections import Counter

        vetted[Counter] = _dunders(Counter)
    restore = _module_guard(cfg["test_modules"])
    gate = _make_gate(cfg["value_cap"], vetted, restore)
    cand_ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        _exec(compile(source, "solution.py", "exec"), cand_ns)
    except _Base as exc:
        fail_all("solution failed to load: " + _describe_(exc))
    _settrace(None)
    _setprofile(None)
    test_ns = _dict(cand_ns)
    test_ns["__builtins__"] = clean_builtins
    test_ns["__rlloom_call__"] = gate
    if cfg["kind"] == "function":
        target = _dict.get(cand_ns, cfg["entry_point"])
        if target is None:
            fail_all(f"solution does not define {cfg['entry_point']!r}")
        test_ns[cfg["param"]] = target
    _run(units, report, test_ns, restore)
    finish()


if __name__ == "__main__":
    main()
