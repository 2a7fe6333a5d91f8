# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
# ruff: noqa: SIM105  (contextlib costs start-up time in every sandbox; try/except/pass does the same)
"""Calls from the tests to the solution across a sandboxed run's two processes: `Channel` and `Remote` on the test
side, `serve` on the candidate side.

A test's call `f(x)` on a `Remote` sends `["call", ref, args, kwargs]` and gets back `["ok", value, changed
arguments]`, `["obj", handle, type name]` for a value with no data form, or `["raise", type name, message]`.
A `Remote` can be called and have attributes read and set (tests build the solution's objects, e.g. MBPP's trees
of `Node`), but refuses comparison, truth and arithmetic: only data answers a test.

Standalone, like `wire.py`: imported by the sandbox harness under `python -I -S`.
"""

import os
import sys

try:  # as part of the rlloom package (tests, type checks)
    from . import wire
except ImportError:  # inside the sandbox, where the harness imports its siblings as top-level modules
    import wire  # type: ignore[no-redef]


class Remote:
    """A solution object with no data form, or a name in the solution: call it, read attributes; nothing else."""

    __slots__ = ("_channel", "_ref", "_what")

    def __init__(self, ref, what, channel):
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_channel", channel)

    def __call__(self, *args, **kwargs):
        return self._channel.call(self._ref, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._channel.get(self._ref, name, f"{self._what}.{name}")

    def __setattr__(self, name, value):  # tests that build the solution's objects (MBPP's trees of Node)
        self._channel.set(self._ref, name, value)

    def __repr__(self):
        return f"<the solution's {self._what}>"

    def _refuse(self, *args):
        raise TypeError(f"the solution gave a {self._what} object where the test needs a value")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __len__ = __iter__ = __contains__ = _refuse
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __abs__ = __neg__ = _refuse
    __int__ = __float__ = __index__ = __getitem__ = __round__ = _refuse
    __hash__ = None  # type: ignore[assignment]


class Channel:
    """The test side's end: turns calls on `Remote` objects into requests and replies into trusted values."""

    def __init__(self, req_w, rep_r):
        self.req_w, self.rep_r = req_w, rep_r
        self.broken = ""

    def remote(self, ref, what):
        return Remote(ref, what, self)

    def _ask(self, message):
        if self.broken:
            raise wire.ProtocolError(self.broken)
        try:
            wire.send(self.req_w, message)
            reply = wire.receive(self.rep_r)
        except (OSError, wire.CandidateGoneError) as exc:
            raise wire.CandidateGoneError(str(exc)) from None
        except wire.ProtocolError as exc:
            self.broken = f"the solution broke the call protocol ({exc})"
            raise wire.ProtocolError(self.broken) from None
        if type(reply) is not list or not reply or reply[0] not in ("ok", "obj", "raise"):
            self.broken = "the solution broke the call protocol (bad reply)"
            raise wire.ProtocolError(self.broken)
        return reply

    def _result(self, reply, what):
        try:
            if reply[0] == "obj" and len(reply) == 3 and type(reply[1]) is int and type(reply[2]) is str:
                return Remote(["h", reply[1]], reply[2][:80], self)
            if reply[0] == "raise" and len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str:
                raise _rebuilt(reply[1], reply[2])
            if reply[0] == "ok" and len(reply) == 3:
                return wire.decode(reply[1])
        except wire.ProtocolError as exc:
            self.broken = f"the solution broke the call protocol ({exc})"
            raise wire.ProtocolError(self.broken) from None
        self.broken = f"the solution broke the call protocol (bad reply to {what})"
        raise wire.ProtocolError(self.broken)

    def call(self, ref, args, kwargs):
        try:
            wire_args = [wire.encode(a, 0, Remote) for a in args]
            wire_kwargs = [[k, wire.encode(v, 0, Remote)] for k, v in kwargs.items()]
        except wire.UnencodableError as exc:
            raise TypeError(f"the test passed a {exc} to the solution, which only takes data") from None
        reply = self._ask(["call", ref, wire_args, wire_kwargs])
        result = self._result(reply, "a call")
        if reply[0] == "ok":
            self._write_back(args, reply[2])
        return result

    def _write_back(self, args, synced):
        """Lists, dicts and sets the solution changed in place change on the test side too."""
        if type(synced) is not list:
            return
        for entry in synced:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not int or not 0 <= entry[0] < len(args):
                continue
            arg, new = args[entry[0]], wire.decode(entry[1])
            if type(arg) is list and type(new) is list:
                arg[:] = new
            elif type(arg) in (dict, set) and type(new) is type(arg):
                arg.clear()
                arg.update(new)

    def get(self, ref, name, what):
        return self._result(self._ask(["get", ref, name]), what)

    def set(self, ref, name, value):
        try:
            wire_value = wire.encode(value, 0, Remote)
        except wire.UnencodableError as exc:
            raise TypeError(f"the test set a {exc} on the solution's object, which only takes data") from None
        self._result(self._ask(["set", ref, name, wire_value]), "setting an attribute")


def _rebuilt(type_name, message):
    """The solution's exception, as the builtin exception of that name when there is one (tests may catch it)."""
    import builtins

    found = getattr(builtins, type_name, None)
    if isinstance(found, type) and issubclass(found, Exception):
        try:
            return found(message)
        except Exception:
            pass
    return wire.CandidateExitError(f"{type_name}: {message}") if type_name in ("SystemExit", "KeyboardInterrupt") else (
        RuntimeError(f"{type_name}: {message}")
    )  # fmt: skip


def serve(namespace, req_r, rep_w):
    """Answer the test side's requests until it closes the channel (runs in the candidate's process)."""
    handles = {}  # type: ignore[var-annotated]

    def resolve(ref):
        if ref[0] == "n":
            if ref[1] not in namespace:
                raise NameError(f"the solution does not define {ref[1]!r}")
            return namespace[ref[1]]
        if ref[0] == "h":
            return handles[ref[1]]
        return getattr(resolve(ref[1]), ref[2])

    def reply_for(value):
        try:
            return ["ok", wire.encode(value), []]
        except wire.UnencodableError:
            handles[len(handles)] = value
            return ["obj", len(handles) - 1, type(value).__qualname__]

    while True:
        _flush()  # the run ends when the tests do, without waiting for this process to exit and flush
        try:
            request = wire.receive(req_r)
        except (wire.CandidateGoneError, wire.ProtocolError):
            os._exit(0)
        try:
            if request[0] == "get":
                reply = reply_for(getattr(resolve(request[1]), request[2]))
            elif request[0] == "set":
                setattr(resolve(request[1]), request[2], wire.decode(request[3], 0, resolve))
                reply = ["ok", None, []]
            else:
                args = [wire.decode(a, 0, resolve) for a in request[2]]
                kwargs = {k: wire.decode(v, 0, resolve) for k, v in request[3]}
                reply = reply_for(resolve(request[1])(*args, **kwargs))
                if reply[0] == "ok":
                    reply[2] = _changed(args)
        except BaseException as exc:
            reply = ["raise", type(exc).__name__, _text(exc)]
        try:
            wire.send(rep_w, reply)
        except (ValueError, TypeError):
            wire.send(rep_w, ["raise", "TypeError", "the solution's value could not be sent"])
        except OSError:
            os._exit(0)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def _changed(args):
    """The list, dict and set arguments as they are after the call, for the test side to update its own; one
    holding something with no data form (the tests' handles to the solution's objects) is left out."""
    changed = []
    for i, arg in enumerate(args):
        if type(arg) in (list, dict, set):
            try:
                changed.append([i, wire.encode(arg)])
            except wire.UnencodableError:
                continue
    return changed


def _text(exc):
    try:
        return str(exc)[:300]
    except BaseException:
        return "(unprintable)"
