# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
# ruff: noqa: SIM105  (contextlib costs start-up time in every sandbox; try/except/pass does the same)
"""Calls between a sandboxed run's two processes: `Channel` and `Remote` on the test side, `serve` on the
candidate side.

Both ends run the same loop (`_Peer`): send a request, then read messages until its reply comes, serving whatever
requests the other side sends meanwhile. A test's call `f(x)` on a `Remote` sends `["call", ref, args, kwargs]`
and gets back `["ok", value, changed arguments]` or `["raise", type name, message, class lineage]`; while the
solution runs it may call back what the test passed it (a lambda, a key function: `["call", ...]` the other way),
or read more of an iterator the test passed. Values are data (`wire.py`); what has no data form travels as a
handle: the solution's objects reach the tests as `Remote`, the tests' callables reach the solution as
`TestCallable`.

A `Remote` can be called, have attributes read and set (tests build the solution's objects, e.g. MBPP's trees of
`Node`) and be iterated (items come back as data), but refuses comparison, truth and arithmetic: only data answers
a test, never the solution's own `__eq__`. The test side serves the solution only calls of the callables and reads
of the iterators the tests passed it: no attribute of a test object is ever read for the solution, so it cannot
reach the tests' namespace, builtins or frames through them.

Standalone, like `wire.py`: imported by the sandbox harness under `python -I -S`.
"""

import _thread
import os
import sys

try:  # as part of the rlloom package (tests, type checks)
    from . import wire
except ImportError:  # inside the sandbox, where the harness imports its siblings as top-level modules
    import wire  # type: ignore[no-redef]

_ITERATION_ENDS = ("StopIteration", "StopAsyncIteration")
_EXITS = ("SystemExit", "KeyboardInterrupt", "GeneratorExit")


class _Peer:
    """One end of the channel: exported objects (handles), the request/reply loop, how to encode and decode."""

    def __init__(self, out_fd, in_fd):
        self.out_fd, self.in_fd = out_fd, in_fd
        self.exported = {}  # handle id -> object this side lent the other side
        self.ids = {}  # id(object) -> handle id, so the same object keeps its handle
        self.lock = _thread.RLock()

    # --- what this side lends -------------------------------------------------------------------------------
    def export(self, value):
        key = id(value)
        if key in self.ids and self.exported.get(self.ids[key]) is value:
            return self.ids[key]
        handle = len(self.exported)
        self.exported[handle] = value
        self.ids[key] = handle
        return handle

    def stream(self, iterator, items):
        return {"st": [self.export(iterator), items]}

    def encode(self, value):
        return wire.encode(value, 0, self)

    def decode(self, data):
        return wire.decode(data, 0, self.resolve)

    # --- the loop -------------------------------------------------------------------------------------------
    def ask(self, message):
        """Send a request and return its reply, serving the other side's requests until it comes."""
        with self.lock:
            self._send(message)
            while True:
                incoming = self._receive()
                if incoming[0] in ("ok", "raise"):
                    return incoming
                self.reply(self.serve_one(incoming))

    def _send(self, message):
        wire.send(self.out_fd, message)

    def reply(self, message):
        try:
            wire.send(self.out_fd, message)  # `dumps` fails, if at all, before anything is written
        except (wire.UnencodableError, ValueError, TypeError):
            wire.send(self.out_fd, ["raise", "TypeError", "the value could not be sent", []])

    def _receive(self):
        message = wire.receive(self.in_fd)
        if type(message) is not list or not message or type(message[0]) is not str:
            raise wire.ProtocolError("bad message")
        return message

    def serve_one(self, request):
        """The reply to one request from the other side; never raises for what the request or the call did."""
        try:
            kind = request[0]
            if kind == "call" and len(request) == 4:
                return self.do_call(request[1], request[2], request[3])
            if kind == "next" and len(request) == 3 and type(request[2]) is int:
                items, done = wire.take(self.local(request[1]), max(1, min(request[2], wire.CHUNK)), wire.CHUNK_S)
                return ["ok", [self.encode(items), done], []]
            return self.serve_more(request)
        except wire.CandidateGoneError:
            raise
        except BaseException as exc:
            return self.raised(exc)

    def serve_more(self, request):
        raise TypeError(f"request {request[0]!r} refused")

    def do_call(self, ref, args, kwargs):  # each side's own
        raise NotImplementedError

    def resolve(self, tag, payload, depth):  # each side's own
        raise NotImplementedError

    def raised(self, exc):
        lineage = []
        for cls in type(exc).__mro__:
            lineage.append(f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}")
        return ["raise", type(exc).__name__, _text(exc), lineage[:16]]

    def local(self, ref):
        if type(ref) is list and len(ref) == 2 and ref[0] == "h" and type(ref[1]) is int and ref[1] in self.exported:
            return self.exported[ref[1]]
        raise wire.ProtocolError("unknown handle")


class Remote:
    """A solution object with no data form, or a name in the solution: call it, read and set attributes, iterate
    it (each item comes back as data); nothing else."""

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

    def __iter__(self):  # an iterable object: its items, as data (so `in`, list(), sorted() compare data only)
        return self._channel.iterate(self._ref, self._what)

    def __repr__(self):
        return f"<the solution's {self._what}>"

    def _compare(self, *args):
        raise TypeError(
            f"the test compared the solution's {self._what} object, whose own __eq__ would decide the comparison: "
            "refused, since a solution could grade itself that way (return data: numbers, strings, lists, tuples, "
            "dicts, sets, dataclasses)"
        )

    def _refuse(self, *args):
        raise TypeError(f"the solution gave a {self._what} object where the test needs a value")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare
    __bool__ = __len__ = _refuse  # no __contains__: `x in obj` iterates it, comparing data on the test side
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __abs__ = __neg__ = _refuse
    __int__ = __float__ = __index__ = __getitem__ = __round__ = _refuse
    __hash__ = None  # type: ignore[assignment]


def _stream(channel, ref, items):
    """An iterator the solution returned that did not end within its first chunk: read on in growing chunks."""
    yield from items
    size = 1024
    while True:
        items, done = channel.more(ref, size)
        yield from items
        if done or not items:
            return
        size = min(size * 4, wire.CHUNK)


class Channel(_Peer):
    """The test side's end: turns calls on `Remote` objects into requests and replies into trusted values, and
    serves the solution the callables and iterators the tests passed it (calls and reads only)."""

    def __init__(self, req_w, rep_r):
        super().__init__(req_w, rep_r)
        self.broken = ""
        self.remotes = {}  # handle id -> Remote, so one solution object is one Remote
        self.exceptions = {}  # the solution's exception class (module.qualname) -> its stand-in on the test side

    def remote(self, ref, what):
        return Remote(ref, what, self)

    def stand_in(self, name, lineage):
        """A test-side exception class for the solution's own exception class `name` (its class lineage, itself
        first, as `module.qualname`), so `except ItsError` works: based on the stand-in of its nearest base that
        has one, else on its nearest builtin exception (StopIteration and the exits excepted)."""
        import builtins

        base = Exception
        for entry in lineage[1:16]:
            if type(entry) is not str:
                continue
            if entry in self.exceptions:
                base = self.exceptions[entry]
                break
            module, _, builtin = entry.partition(".")
            found = getattr(builtins, builtin, None) if module == "builtins" else None
            if isinstance(found, type) and issubclass(found, Exception):
                if builtin not in _ITERATION_ENDS:
                    base = found
                break
        cls = type(name, (base,), {"__module__": "solution", "__qualname__": name})
        self.exceptions[lineage[0]] = cls
        return cls

    # --- encoding the tests' values for the solution --------------------------------------------------------
    def handle(self, value):
        if type(value) is Remote:
            return {"ref": value._ref}
        builtin = _builtin_name(value)
        if builtin is not None:
            return {"bi": builtin}
        if callable(value):
            return {"h": [self.export(value), type(value).__name__, "call"]}
        raise wire.UnencodableError(type(value).__name__)

    def resolve(self, tag, payload, depth):
        if tag == "h" and type(payload) is list and len(payload) == 3 and type(payload[0]) is int:
            handle = payload[0]
            if handle not in self.remotes:
                what = payload[1] if type(payload[1]) is str else "object"
                self.remotes[handle] = Remote(["h", handle], what[:80], self)
            return self.remotes[handle]
        if tag == "st" and type(payload) is list and len(payload) == 2 and type(payload[0]) is int:
            return _stream(self, ["h", payload[0]], wire.decode(payload[1], depth + 1, self.resolve))
        if tag == "ref":
            return self.local(payload)
        raise wire.ProtocolError(f"unexpected {tag!r} value from the solution")

    def serve_one(self, request):
        if request[0] == "call" and type(request[1]) is list:
            target = self.local(request[1])  # only what the tests lent: their callables
            if not callable(target):
                return ["raise", "TypeError", "not callable", []]
        return super().serve_one(request)

    def do_call(self, ref, args, kwargs):
        target = self.local(ref)
        if type(args) is not list or type(kwargs) is not list:
            raise wire.ProtocolError("bad call")
        value = target(*self.decode(args), **dict(self.decode(kwargs)))
        try:
            return ["ok", self.encode(value), []]
        except wire.UnencodableError as exc:
            return ["raise", "TypeError", f"the test's callable returned a {exc}, which has no data form", []]

    # --- asking the solution --------------------------------------------------------------------------------
    def _ask(self, message):
        if self.broken:
            raise wire.ProtocolError(self.broken)
        try:
            reply = self.ask(message)
        except (OSError, wire.CandidateGoneError) as exc:
            raise wire.CandidateGoneError(str(exc)) from None
        except wire.ProtocolError as exc:
            self.broken = f"the solution broke the call protocol ({exc})"
            raise wire.ProtocolError(self.broken) from None
        if reply[0] == "raise" and len(reply) == 4 and type(reply[1]) is str and type(reply[2]) is str:
            raise self._rebuilt(reply[1], reply[2], reply[3])
        if reply[0] != "ok" or len(reply) != 3:
            self.broken = "the solution broke the call protocol (bad reply)"
            raise wire.ProtocolError(self.broken)
        return reply

    def _value(self, data, what):
        try:
            return self.decode(data)
        except wire.ProtocolError as exc:
            self.broken = f"the solution broke the call protocol ({exc}, in {what})"
            raise wire.ProtocolError(self.broken) from None

    def _encode_out(self, value, what):
        try:
            return self.encode(value)
        except wire.UnencodableError as exc:
            raise TypeError(f"the test {what} a {exc}, which has no data form") from None

    def call(self, ref, args, kwargs):
        wire_args = [self._encode_out(a, "passed the solution") for a in args]
        wire_kwargs = [[k, self._encode_out(v, "passed the solution")] for k, v in kwargs.items()]
        reply = self._ask(["call", ref, wire_args, wire_kwargs])
        result = self._value(reply[1], "a call's result")
        if type(reply[2]) is list and reply[2]:
            self._write_back(args, kwargs, reply[2])
        return result

    def _write_back(self, args, kwargs, synced):
        """Arguments the solution changed in place (also inside tuples, also keyword arguments) change on the
        test side too; mutable values keep their identity where their shape allows."""
        for entry in synced:
            if type(entry) is not list or len(entry) != 2:
                continue
            key, data = entry
            if type(key) is int and 0 <= key < len(args):
                old = args[key]
            elif type(key) is str and key in kwargs:
                old = kwargs[key]
            else:
                continue
            _sync(old, self._value(data, "an argument changed in place"))

    def get(self, ref, name, what):
        return self._value(self._ask(["get", ref, name])[1], what)

    def set(self, ref, name, value):
        self._ask(["set", ref, name, self._encode_out(value, "set")])

    def iterate(self, ref, what):
        return iter(self._value(self._ask(["iter", ref])[1], f"iterating {what}"))

    def more(self, ref, n):
        data = self._ask(["next", ref, n])[1]
        if type(data) is not list or len(data) != 2 or type(data[0]) is not list or type(data[1]) is not bool:
            self.broken = "the solution broke the call protocol (bad stream chunk)"
            raise wire.ProtocolError(self.broken)
        return self._value(data[0], "an iterator's items"), data[1]

    def _rebuilt(self, type_name, message, lineage):
        """The solution's exception as the tests can catch it: the stand-in of its own class (or of the nearest
        base the tests name), else the nearest builtin exception. StopIteration becomes a RuntimeError, as PEP 479
        does for generators: raised inside the tests' `map` or `filter` it would otherwise end their iteration
        early and pass; SystemExit and friends become CandidateExitError, which fails the test."""
        import builtins

        if type(lineage) is not list:
            lineage = []
        for entry in lineage[:16]:
            if type(entry) is not str:
                continue
            if entry in self.exceptions:
                return self.exceptions[entry](message)
            module, _, name = entry.partition(".")
            if module != "builtins":
                continue
            if name in _ITERATION_ENDS:
                return RuntimeError(f"the solution raised {type_name} ({message}); it does not end the test's loop")
            if name in _EXITS:
                return wire.CandidateExitError(f"{type_name}: {message}")
            found = getattr(builtins, name, None)
            if isinstance(found, type) and issubclass(found, Exception):
                try:
                    return found(message)
                except Exception:
                    break
        return RuntimeError(f"{type_name}: {message}")


def _builtin_name(value):
    """[module, qualname] of a builtin callable the solution can look up by name (`len`, `str.lower`,
    `math.sqrt`, `int`), so it runs there at full speed instead of as a call back to the tests."""
    import builtins

    t = type(value)
    if t.__name__ == "builtin_function_or_method" and t.__module__ == "builtins":
        owner = getattr(value, "__self__", None)
        module = getattr(owner, "__name__", None) if type(owner) is type(builtins) else None
        if module is not None and (module == "builtins" or module in sys.stdlib_module_names):
            return [module, getattr(value, "__name__", "")]
        return None
    if t.__name__ in ("method_descriptor", "wrapper_descriptor") and t.__module__ == "builtins":
        owner_name = getattr(getattr(value, "__objclass__", None), "__name__", "")
        if owner_name and getattr(builtins, owner_name, None) is getattr(value, "__objclass__", None):
            return ["builtins", f"{owner_name}.{getattr(value, '__name__', '')}"]
        return None
    name = getattr(value, "__name__", "")
    if t is type and getattr(builtins, name, None) is value:
        return ["builtins", name]
    return None


def _sync(old, new):
    """Make the test's `old` equal `new`, changing it in place where it is mutable; returns what to keep."""
    t = type(old)
    if t is not type(new):
        return new
    if t is list:
        if len(old) == len(new):
            for i in range(len(old)):
                old[i] = _sync(old[i], new[i])
        else:
            old[:] = new
        return old
    if t is tuple:
        if len(old) == len(new):
            for a, b in zip(old, new, strict=True):
                _sync(a, b)
        return old
    if isinstance(old, dict):
        kept = {k: _sync(old[k], v) if k in old else v for k, v in new.items()}
        old.clear()
        old.update(kept)
        return old
    if t is set:
        old.clear()
        old.update(new)
        return old
    if t is bytearray:
        old[:] = new
        return old
    if t.__name__ == "deque":
        old.clear()
        old.extend(new)
        return old
    return new


class TestCallable:
    """A callable (or iterator) the tests passed the solution: calling it runs it on the test side."""

    __slots__ = ("_handle", "_peer", "_what")

    def __init__(self, peer, handle, what):
        self._peer, self._handle, self._what = peer, handle, what

    def __call__(self, *args, **kwargs):
        peer = self._peer
        reply = peer.ask(["call", ["h", self._handle], [peer.encode(a) for a in args],
                          [[k, peer.encode(v)] for k, v in kwargs.items()]])  # fmt: skip
        if reply[0] == "raise":
            raise _local_exception(reply[1], reply[2])
        return peer.decode(reply[1])

    def __repr__(self):
        return f"<the test's {self._what}>"


def _test_stream(peer, handle, items):
    """An iterator the tests passed the solution, read from the test side in chunks."""
    yield from items
    while True:
        reply = peer.ask(["next", ["h", handle], wire.CHUNK])
        if reply[0] == "raise":
            raise _local_exception(reply[1], reply[2])
        chunk, done = reply[1]
        yield from peer.decode(chunk)
        if done or not chunk:
            return


def _local_exception(type_name, message):
    import builtins

    found = getattr(builtins, type_name, None) if type(type_name) is str else None
    if isinstance(found, type) and issubclass(found, BaseException):
        try:
            return found(message)
        except BaseException:
            pass
    return RuntimeError(f"{type_name}: {message}")


class _Server(_Peer):
    """The candidate side's end: answers calls, attribute reads and writes, iteration."""

    def __init__(self, namespace, req_r, rep_w):
        super().__init__(rep_w, req_r)
        self.namespace = namespace

    def handle(self, value):
        if type(value) is TestCallable:
            return {"ref": ["h", value._handle]}
        return {"h": [self.export(value), type(value).__qualname__, ""]}

    def resolve(self, tag, payload, depth):
        if tag == "ref":
            return self.target(payload)
        if tag == "h" and type(payload) is list and len(payload) == 3:
            return TestCallable(self, payload[0], str(payload[1]))
        if tag == "st" and type(payload) is list and len(payload) == 2:
            return _test_stream(self, payload[0], wire.decode(payload[1], depth + 1, self.resolve))
        if tag == "bi" and type(payload) is list and len(payload) == 2:
            found = __import__(payload[0])
            for part in payload[1].split("."):
                found = getattr(found, part)
            return found
        raise wire.ProtocolError(f"unexpected {tag!r}")

    def target(self, ref):
        if type(ref) is list and len(ref) == 2 and ref[0] == "n":
            if ref[1] not in self.namespace:
                raise NameError(f"the solution does not define {ref[1]!r}")
            return self.namespace[ref[1]]
        return self.local(ref)

    def do_call(self, ref, args, kwargs):
        function = self.target(ref)
        positional = [self.decode(a) for a in args]
        keywords = {k: self.decode(v) for k, v in kwargs}
        value = function(*positional, **keywords)
        return ["ok", self.encode(value), _changed(self, args, positional, kwargs, keywords)]

    def serve_more(self, request):
        kind = request[0]
        if kind == "get" and len(request) == 3:
            return ["ok", self.encode(getattr(self.target(request[1]), request[2])), []]
        if kind == "set" and len(request) == 4:
            setattr(self.target(request[1]), request[2], self.decode(request[3]))
            return ["ok", None, []]
        if kind == "iter" and len(request) == 2:
            return ["ok", self.encode(iter(self.target(request[1]))), []]
        raise TypeError(f"unknown request {kind!r}")


_MUTABLE_TAGS = frozenset(("t", "d", "s", "ba", "od", "ctr", "dq", "dd"))


def _changed(server, sent, positional, kw_sent, keywords):
    """[key, value] for each argument the call changed in place: its data form now differs from what came."""
    changed = []
    for key, before, value in [(i, sent[i], positional[i]) for i in range(len(sent))] + [
        (k, v, keywords[k]) for k, v in kw_sent
    ]:
        if type(before) is not list and not (type(before) is dict and next(iter(before), None) in _MUTABLE_TAGS):
            continue
        try:
            after = server.encode(value)
        except wire.UnencodableError:
            continue
        if after != before:
            changed.append([key, after])
    return changed


def serve(namespace, req_r, rep_w):
    """Answer the test side's requests until it closes the channel (runs in the candidate's process)."""
    server = _Server(namespace, req_r, rep_w)
    while True:
        _flush()  # the run ends when the tests do, without waiting for this process to exit and flush
        with server.lock:
            try:
                server.reply(server.serve_one(server._receive()))
            except (wire.CandidateGoneError, wire.ProtocolError, OSError):
                os._exit(0)


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def _text(exc):
    try:
        return str(exc)[:300]
    except BaseException:
        return "(unprintable)"
