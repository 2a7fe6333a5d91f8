# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
"""The memory a run holds that no process's resident set shows, read by the supervisor every 20 ms.

Shipped into the sandbox with `wire`, `channel` and `supervisor` (compiled by the parent, see `sandboxed.py`), so it
imports nothing outside the standard library and loads `_socket` and `_ctypes` only when a count needs them.
`supervisor._Watch.check` adds these to the resident sets of the run's processes and ends the run at its budget:

- System V shared memory segments, attached or not (the run's own IPC namespace's /proc/sysvipc/shm);
- what Unix sockets hold in flight (sock_diag) and what netlink sockets queue (/proc/net/netlink), both of the
  run's own network namespace;
- pipe buffers (`pipe_memory`): each pipe a process of the run holds open counts its capacity (F_GETPIPE_SZ).
"""

import os

PAGE = os.sysconf("SC_PAGE_SIZE")
PIPE_DEFAULT = 16 * PAGE  # a pipe's capacity unless F_SETPIPE_SZ changes it (the kernel's PIPE_DEF_BUFFERS pages)
_F_GETPIPE_SZ = 1032
_SYS_PIDFD_GETFD = 438  # one number on every architecture (new syscalls share a table)
_EBADF = 9
_calls: list = []


def _proc_columns_sum(path, columns):
    """The sum of `columns` (0-based) over every row of a /proc table below its header line; 0 when unreadable."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return 0
    total = 0
    for line in lines:
        fields = line.split()
        try:
            total += sum(int(fields[column]) for column in columns)
        except (ValueError, IndexError):
            continue
    return total


def sysv_shm():
    """Bytes resident in the run's System V shared memory segments (its IPC namespace's), attached or not."""
    return _proc_columns_sum("/proc/sysvipc/shm", (14,))  # rss


def unix_socket_memory():
    """What the run's Unix sockets hold in flight; asks sock_diag only when /proc/net/unix lists any (most runs
    have none, and loading `_socket` costs a run a millisecond)."""
    try:
        with open("/proc/net/unix", "rb") as f:
            f.readline()
            if not f.readline():
                return 0
    except OSError:
        return 0
    return _socket_memory(1)


def netlink_memory():
    """Bytes queued in the run's netlink sockets (/proc/net/netlink's Rmem and Wmem columns)."""
    return _proc_columns_sum("/proc/net/netlink", (4, 5))


_UNIX_DIAG = bytes((1, 0, 0, 0)) + b"\xff\xff\xff\xff" + bytes(4) + (0x20).to_bytes(4, "little") + bytes(8)


def _socket_memory(family):
    """Bytes queued in the sockets of `family` (1: AF_UNIX) of the run's network namespace, from the kernel's
    sock_diag (as `ss` reads it): a socket pair can hold megabytes in flight that are in no process's resident
    set. Sums each socket's receive and send allocations (SK_MEMINFO_RMEM_ALLOC, WMEM_ALLOC)."""
    import _socket

    req, header, meminfo = _UNIX_DIAG, 16, 5
    # nlmsghdr: length, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, sequence, port
    message = (16 + len(req)).to_bytes(4, "little") + (20).to_bytes(2, "little") + (0x301).to_bytes(2, "little")
    total = 0
    try:
        sock = _socket.socket(16, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, 4)  # AF_NETLINK, NETLINK_SOCK_DIAG
    except OSError:
        return 0
    try:
        sock.sendto(message + bytes(8) + req, (0, 0))
        while True:
            data = sock.recv(1 << 16)
            at = 0
            while at + 16 <= len(data):
                length = int.from_bytes(data[at : at + 4], "little")
                if length < 16 or int.from_bytes(data[at + 4 : at + 6], "little") in (2, 3):  # ERROR, DONE
                    return total
                attr, end = at + 16 + header, min(at + length, len(data))
                while attr + 4 <= end:
                    size = int.from_bytes(data[attr : attr + 2], "little")
                    if size < 4:
                        break
                    if int.from_bytes(data[attr + 2 : attr + 4], "little") == meminfo and size >= 16:
                        total += int.from_bytes(data[attr + 4 : attr + 8], "little")
                        total += int.from_bytes(data[attr + 12 : attr + 16], "little")
                    attr += (size + 3) & ~3
                at += (length + 3) & ~3
            if not data:
                return total
    except OSError:
        return total
    finally:
        sock.close()


def _libc():
    """`syscall` and `fcntl` from libc on `_ctypes` alone, made once (a function object per call costs ~20 us).
    Built whole, then stored: a budget check that interrupts this one (they run from a timer signal) builds its
    own copy instead of seeing half of this one."""
    if _calls:
        return _calls[0]
    import _ctypes

    class c_long(_ctypes._SimpleCData):  # noqa: N801
        _type_ = "l"

    class c_int(_ctypes._SimpleCData):  # noqa: N801
        _type_ = "i"

    class Long(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_long

    class Int(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int

    handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]
    calls = (Long(_ctypes.dlsym(handle, "syscall")), Int(_ctypes.dlsym(handle, "fcntl")), _ctypes.get_errno)
    _calls.append(calls)
    return calls


def pipe_memory(pids, max_fds):
    """Bytes the pipes held open by `pids` can hold: each distinct pipe (or FIFO) counts its capacity.

    Why capacity, not the bytes queued (FIONREAD): a pipe's pages are its occupied slots, one page each however
    few bytes a slot holds (a pipe opened with O_DIRECT puts every write, one byte or 4 KiB, in a page of its
    own), so queued bytes can undercount 4096 times; capacity bounds the slots, is exact for a full pipe (what
    holding memory in pipes looks like) and is one fcntl. An honest pipe costs its 64 KiB. The supervisor reads
    each descriptor number below the run's descriptor limit with pidfd_getfd (it keeps CAP_SYS_PTRACE for this
    alone: the run's processes are another uid and not dumpable, so their /proc/PID/fd is closed to it), asks
    F_GETPIPE_SZ (EBADF for anything not a pipe) and counts a pipe once however many descriptors share it."""
    syscall, fcntl, errno = _libc()
    seen = set()
    total = 0
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            for number in range(max_fds):
                fd = syscall(_SYS_PIDFD_GETFD, pidfd, number, 0)
                if fd < 0:
                    if errno() != _EBADF:  # the process is gone (ESRCH) or not ours to read
                        break
                    continue
                try:
                    size = fcntl(fd, _F_GETPIPE_SZ)
                    if size > 0:
                        st = os.fstat(fd)
                        if (st.st_dev, st.st_ino) not in seen:
                            seen.add((st.st_dev, st.st_ino))
                            total += size
                finally:
                    os.close(fd)
        finally:
            os.close(pidfd)
    return total
