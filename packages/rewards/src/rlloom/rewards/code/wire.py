# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
"""The data form of values crossing between a sandboxed run's test process and its candidate process.

The tests run in a process the candidate never executes in (see `channel.py`); every value crosses a pipe as a
length-prefixed frame of tagged JSON and is rebuilt on the other side. What a test compares is therefore always a
value `decode` built from trusted types, never an object the candidate made: an "always equal" object, a patched
`__eq__` or a forged record cannot exist on the test's side. Dataclass instances and Enum members come back as
`Record` and `EnumValue` (compared by class name and fields); Fraction, Decimal, Counter, OrderedDict, deque,
defaultdict (with a builtin default factory), range, dict views, numpy arrays and scalars as themselves; subclasses
of plain types as their plain value; ints of any size (past Python's 4,300-digit str limit, in hex). An iterator
comes back whole when it ends quickly, else as a stream the test side reads in chunks.

What has no data form goes through the caller's `hook`: the candidate side turns it into a handle (a `Remote` on
the test side: call it, read its attributes, iterate it), the test side turns its callables into callbacks the
solution can call (a builtin such as `len` or `str.lower` travels by name). Tags that need the other side's state
(handles, callbacks, streams, builtins by name) are decoded by the caller's `resolve`, which accepts only the tags
its side may receive: the test side never takes a builtin by name, so a solution cannot hand the tests `exec`.

Standalone: imported by the sandbox harness under `python -I -S`, so it uses the standard library only (and the
C JSON scanner and encoder, not the `json` package, whose `re` import would cost every sandbox start a few ms).
"""

import _json
import builtins
import math
import os
import sys
import time
from itertools import islice as _islice

MAX_FRAME = 1 << 30  # bytes; the supervisor lowers it to the run's memory budget (which also counts the reader)
MAX_DEPTH = 200
FIRST_CHUNK, FIRST_CHUNK_S = 4096, 0.02  # items of an iterator sent with the reply, and the time spent on them
CHUNK, CHUNK_S = 65536, 0.1  # items per later request for more of a stream
BIG_INT_BITS = 14_000  # above this (about 4,200 digits) an int travels in hex, which has no str-digits limit
CONTEXT_TAGS = frozenset(("ref", "h", "cb", "cbr", "st", "bi"))  # decoded by the caller's `resolve`
FACTORIES = ("list", "int", "set", "dict", "str", "float", "tuple", "frozenset", "bool", "bytes", "complex")


class UnencodableError(Exception):
    """The value has no data form (and the caller gave no hook for it)."""


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed frame of this protocol."""


class CandidateGoneError(Exception):
    """The candidate process closed the channel (exited, was killed, or closed its descriptors)."""


class CandidateExitError(Exception):
    """The solution raised SystemExit, KeyboardInterrupt or GeneratorExit; on the test side it is an ordinary
    exception, so it fails the test instead of stopping the test process."""


# ---------------------------------------------------------------------------------------------------- values
class Record:
    """A dataclass instance from the solution: its class's qualified name and its compared fields."""

    __slots__ = ("_cls", "_fields")

    def __init__(self, cls, fields):
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_fields", tuple(fields))

    def __eq__(self, other):
        if type(other) is not Record:
            return NotImplemented
        return self._cls == other._cls and self._fields == other._fields

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self):
        return hash((self._cls, self._fields))

    def __getattr__(self, name):
        for key, value in object.__getattribute__(self, "_fields"):
            if key == name:
                return value
        raise AttributeError(name)

    def __setattr__(self, name, value):
        raise AttributeError("a value returned by the solution is read-only")

    def __repr__(self):
        return f"{self._cls}({', '.join(f'{k}={v!r}' for k, v in self._fields)})"


class EnumValue:
    """A member of an Enum the solution defined (not an int/str/float-valued one, which comes back as its value)."""

    __slots__ = ("cls", "name", "value")

    def __init__(self, cls, name, value):
        self.cls, self.name, self.value = cls, name, value

    def __eq__(self, other):
        if type(other) is not EnumValue:
            return NotImplemented
        return (self.cls, self.name) == (other.cls, other.name)

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self):
        return hash((self.cls, self.name))

    def __repr__(self):
        return f"<{self.cls}.{self.name}: {self.value!r}>"


# ---------------------------------------------------------------------------------------------------- encoding
_STDLIB_TAGS = {
    ("collections", "OrderedDict"): "od", ("collections", "Counter"): "ctr", ("collections", "deque"): "dq",
    ("fractions", "Fraction"): "fr", ("decimal", "Decimal"): "dec", ("collections", "defaultdict"): "dd",
}  # fmt: skip
_STDLIB_NAMES = {tag: key for key, tag in _STDLIB_TAGS.items()}
_NUMPY_KINDS = "biufcUS"  # bool, ints, floats, complex, str, bytes: the dtypes that travel as numpy values


def _stdlib_type(tag, load=False):
    """The stdlib class behind a tag, from its module: imported on demand on the receiving side (`load`), and on
    the sending side only looked up (a value of that class exists only if its module was imported)."""
    module, name = _STDLIB_NAMES[tag]
    if load:
        __import__(module)
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _qualname(cls):
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}"


def take(iterator, limit, seconds):
    """Up to `limit` items of `iterator` (fewer once `seconds` have passed): (items, done)."""
    items: list = []
    end = time.monotonic() + seconds
    step = 1
    while len(items) < limit:
        wanted = min(step, limit - len(items))
        part = list(_islice(iterator, wanted))  # C speed between the clock checks
        items += part
        if len(part) < wanted:
            return items, True
        if time.monotonic() > end:
            break
        step = min(step * 2, 256)
    return items, False


def encode(value, depth=0, hook=None):
    """A JSON-able tagged form of `value`. What has no data form goes to `hook.handle(value)` (and an iterator that
    does not end within its first chunk to `hook.stream(iterator, items)`); without a hook, UnencodableError.

    Lists, str, int, float and None are themselves (floats that JSON lacks and ints past its digit limit are
    tagged); every other kind is a one-key dict naming it, so a plain dict never appears untagged.
    """
    if depth > MAX_DEPTH:
        raise UnencodableError("nested too deeply")
    t = type(value)
    if value is None or t is str or t is bool:
        return value
    if t is int:
        return value if value.bit_length() <= BIG_INT_BITS else {"ix": format(value, "x")}
    if t is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return _plain(value) or [encode(v, depth + 1, hook) for v in value]
    if t is tuple:
        return {"t": _plain(value) or [encode(v, depth + 1, hook) for v in value]}
    if t is dict:
        return {"d": [[encode(k, depth + 1, hook), encode(v, depth + 1, hook)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, depth + 1, hook) for v in value]}
    if t is bytes:
        return {"b": value.decode("latin-1")}
    if t is bytearray:
        return {"ba": bytes(value).decode("latin-1")}
    if t is complex:
        return {"c": [encode(value.real), encode(value.imag)]}
    if t is range:
        return {"rg": [value.start, value.stop, value.step]}
    tag = _STDLIB_TAGS.get((t.__module__, t.__qualname__))
    if tag is not None and _stdlib_type(tag) is t:  # only the real class, imported from its module
        return _encode_stdlib(tag, value, depth, hook)
    return _encode_rich(value, t, depth, hook)


_LIMIT = 1 << BIG_INT_BITS
_SCALARS = frozenset((str, bool, type(None)))


def _plain(values):
    """A copy of a list or tuple of plain scalars that need no tag (at C speed), else None (also when empty)."""
    kinds = set(map(type, values))
    if not kinds or len(kinds) > 2:
        return None
    if kinds <= _SCALARS:
        return list(values)
    if kinds == {int}:
        return list(values) if min(values) > -_LIMIT and max(values) < _LIMIT else None
    if kinds == {float}:
        return list(values) if all(map(math.isfinite, values)) else None
    return None


def _pairs_of(mapping, depth, hook):
    return [[encode(k, depth + 1, hook), encode(v, depth + 1, hook)] for k, v in mapping.items()]


def _encode_stdlib(tag, value, depth, hook):
    if tag in ("od", "ctr"):
        return {tag: _pairs_of(value, depth, hook)}
    if tag == "dd":
        factory = value.default_factory
        named = getattr(factory, "__name__", None)
        if factory is None or (named in FACTORIES and factory is getattr(builtins, named)):
            return {"dd": [named if factory is not None else None, _pairs_of(value, depth, hook)]}
        return {"dd": [encode(factory, depth + 1, hook), _pairs_of(value, depth, hook)]}  # a handle, via the hook
    if tag == "dq":
        return {"dq": [encode(v, depth + 1, hook) for v in value]}
    if tag == "fr":
        return {"fr": [encode(value.numerator), encode(value.denominator)]}
    return {"dec": str(value)}


def _encode_rich(value, t, depth, hook):
    """Subclasses of the plain types, Enum members, dataclasses, numpy values, dict views, iterators; the rest
    through the hook."""
    enum = sys.modules.get("enum")
    if enum is not None and isinstance(value, enum.Enum):
        inner = value.value
        if isinstance(value, int | str | float) and type(inner) in (int, str, float, bool):
            return inner
        return {"enum": [_qualname(t), value.name, encode(inner, depth + 1, hook)]}
    fields = getattr(t, "__dataclass_fields__", None)
    if isinstance(fields, dict) and "dataclasses" in sys.modules:
        compared = [f.name for f in sys.modules["dataclasses"].fields(value) if f.compare]
        return {"dc": [_qualname(t), [[n, encode(getattr(value, n), depth + 1, hook)] for n in compared]]}
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray | np.generic) and value.dtype.kind in _NUMPY_KINDS:
        if isinstance(value, np.generic):
            return {"np": [value.dtype.str, encode(value.item(), depth + 1, hook)]}
        flat = [encode(v, depth + 1, hook) for v in value.ravel().tolist()]
        return {"nd": [value.dtype.str, list(value.shape), flat]}
    for base in (bool, int, float, str, bytes, tuple, list, dict, set, frozenset, complex):
        if isinstance(value, base):  # namedtuple, int and str subclasses ...: as the plain value they hold
            plain = base(value) if base is not dict else dict(value.items())  # type: ignore[arg-type, union-attr]
            return encode(plain, depth, hook)
    name = t.__name__ if t.__module__ == "builtins" else ""
    if name in ("dict_keys", "dict_values"):
        return {"dk" if name == "dict_keys" else "dv": [encode(v, depth + 1, hook) for v in value]}
    if name == "dict_items":
        return {"di": [[encode(k, depth + 1, hook), encode(v, depth + 1, hook)] for k, v in value]}
    if hasattr(value, "__next__") and hasattr(value, "__iter__"):
        items, done = take(value, FIRST_CHUNK, FIRST_CHUNK_S)
        encoded = [encode(v, depth + 1, hook) for v in items]
        if done:
            return {"it": encoded}
        if hook is None:
            raise UnencodableError("iterator too long")
        return hook.stream(value, encoded)
    if hook is None:
        raise UnencodableError(t.__name__)
    return hook.handle(value)


def decode(data, depth=0, resolve=None):
    """The value a tagged form stands for, built from trusted types only; ProtocolError on anything else.
    `resolve(tag, payload, depth)` rebuilds the tags that need this side's state (CONTEXT_TAGS)."""
    if depth > MAX_DEPTH:
        raise ProtocolError("nested too deeply")
    t = type(data)
    if data is None or t is str or t is bool or t is int or t is float:
        return data
    if t is list:
        if set(map(type, data)) <= _JSON_SCALARS:  # scalars from the JSON scanner: a copy at C speed
            return data[:]
        return [decode(v, depth + 1, resolve) for v in data]
    if t is not dict or len(data) != 1:
        raise ProtocolError(f"unexpected {t.__name__}")
    ((tag, payload),) = data.items()
    if tag in CONTEXT_TAGS:
        if resolve is None:
            raise ProtocolError(f"unexpected {tag!r} value")
        return resolve(tag, payload, depth)
    return _decode_tagged(tag, payload, depth, resolve)


_JSON_SCALARS = frozenset((str, int, float, bool, type(None)))


def _items(payload, depth, resolve):
    if type(payload) is not list:
        raise ProtocolError("expected a list")
    return decode(payload, depth, resolve)


def _pairs(payload, depth, resolve):
    if type(payload) is not list or any(type(p) is not list or len(p) != 2 for p in payload):
        raise ProtocolError("expected a list of pairs")
    return [(decode(k, depth + 1, resolve), decode(v, depth + 1, resolve)) for k, v in payload]


def _decode_tagged(tag, payload, depth, resolve):
    try:
        if tag == "t":
            return tuple(_items(payload, depth, resolve))
        if tag == "d":
            return dict(_pairs(payload, depth, resolve))
        if tag in ("od", "ctr"):  # Counter(pairs) would count the pairs: build it from a mapping
            pairs = _pairs(payload, depth, resolve)
            return _stdlib_type(tag, True)(pairs if tag == "od" else dict(pairs))
        if tag == "s":
            return set(_items(payload, depth, resolve))
        if tag == "fs":
            return frozenset(_items(payload, depth, resolve))
        if tag == "it":
            return iter(_items(payload, depth, resolve))
        if tag == "dq":
            return _stdlib_type("dq", True)(_items(payload, depth, resolve))
        if tag == "ix" and type(payload) is str and 0 < len(payload) <= MAX_FRAME:
            return int(payload, 16)
        if tag == "f" and payload in ("nan", "inf", "-inf"):
            return float(payload)
        if tag == "b" and type(payload) is str:
            return payload.encode("latin-1")
        if tag == "ba" and type(payload) is str:
            return bytearray(payload.encode("latin-1"))
        if tag == "c" and type(payload) is list and len(payload) == 2:
            return complex(*(decode(v, depth + 1) for v in payload))
        if tag == "rg" and type(payload) is list and len(payload) == 3 and all(type(v) is int for v in payload):
            return range(*payload)
        if tag in ("dk", "dv"):
            items = _items(payload, depth, resolve)
            return dict.fromkeys(items).keys() if tag == "dk" else dict(enumerate(items)).values()
        if tag == "di":
            return dict(_pairs(payload, depth, resolve)).items()
        if tag == "dd" and type(payload) is list and len(payload) == 2:
            return _defaultdict(payload, depth, resolve)
        if tag == "fr" and type(payload) is list and len(payload) == 2:
            numerator, denominator = (decode(v, depth + 1) for v in payload)
            if type(numerator) is int and type(denominator) is int:
                return _stdlib_type("fr", True)(numerator, denominator)
        if tag == "dec" and type(payload) is str and len(payload) < 10_000:
            return _stdlib_type("dec", True)(payload)
        if tag in ("nd", "np") and type(payload) is list and len(payload) == (3 if tag == "nd" else 2):
            return _numpy(tag, payload, depth, resolve)
        if tag == "enum" and type(payload) is list and len(payload) == 3:
            cls, name, value = payload
            if type(cls) is str and type(name) is str:
                return EnumValue(cls, name, decode(value, depth + 1, resolve))
        if tag == "dc" and type(payload) is list and len(payload) == 2 and type(payload[0]) is str:
            fields = _pairs(payload[1], depth, resolve)
            if all(type(k) is str for k, _ in fields):
                return Record(payload[0], fields)
    except (TypeError, ValueError, ArithmeticError, KeyError, ImportError) as exc:  # unhashable keys, bad numbers
        raise ProtocolError(f"bad {tag!r} value: {type(exc).__name__}") from None
    raise ProtocolError(f"unknown tag {tag!r}")


def _defaultdict(payload, depth, resolve):
    factory, pairs = payload
    if type(factory) is str:  # one of the builtin factories, by name: this side's own
        if factory not in FACTORIES:
            raise ProtocolError(f"unknown default factory {factory!r}")
        factory = getattr(builtins, factory)
    elif factory is not None:
        factory = decode(factory, depth + 1, resolve)  # a handle to the other side's callable
    return _stdlib_type("dd", True)(factory, _pairs(pairs, depth, resolve))


def _numpy(tag, payload, depth, resolve):
    """A numpy array or scalar of a plain dtype, rebuilt with this side's own numpy."""
    np = __import__("numpy")
    if type(payload[0]) is not str or len(payload[0]) > 12:
        raise ProtocolError("bad numpy dtype")
    dtype = np.dtype(payload[0])
    if dtype.kind not in _NUMPY_KINDS:
        raise ProtocolError("bad numpy dtype")
    if tag == "np":
        return dtype.type(decode(payload[1], depth + 1, resolve))
    shape = payload[1]
    if type(shape) is not list or len(shape) > 32 or any(type(n) is not int or n < 0 for n in shape):
        raise ProtocolError("bad numpy shape")
    return np.array(_items(payload[2], depth, resolve), dtype=dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------------- framing
class _ScanOptions:
    """What `_json.make_scanner` reads: the C JSON scanner alone, without the `json` package (which imports `re`
    and costs a few ms at every sandbox start). NaN and Infinity are not JSON here; floats JSON lacks are tagged."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not allowed")


def _not_data(value):
    raise UnencodableError(type(value).__name__)


_scan = _json.make_scanner(_ScanOptions())  # type: ignore[arg-type]
_encoder = _json.make_encoder(  # the C encoder: one pass, no per-item Python objects (a big result stays small)
    None, _not_data, _json.encode_basestring_ascii, None, ":", ",", False, False, False
)


def dumps(value):
    """JSON text of an encoded value (lists, one-key tag dicts, str, int, float, bool, None)."""
    try:
        return "".join(_encoder(value, 0))
    except ValueError as exc:  # NaN (never produced by `encode`), or an int past the str-digits limit
        raise UnencodableError(str(exc)) from None


def loads(text):
    value, end = _scan(text, 0)
    if end != len(text):
        raise ValueError("trailing data")
    return value


def send(fd, message):
    data = dumps(message).encode("ascii")
    if len(data) >= 1 << 32:
        raise UnencodableError("a message over 4 GiB")
    _write_all(fd, len(data).to_bytes(4, "big"))
    _write_all(fd, data)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        read = os.readv(fd, [view[got : got + (1 << 20)]])
        if not read:
            raise CandidateGoneError("the solution's process closed the channel")
        got += read
    return buf


def receive(fd):
    """One frame's JSON value (ProtocolError for anything else, CandidateGoneError at end of file)."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"a message of {size} bytes is over the {MAX_FRAME}-byte limit (the memory budget)")
    try:
        return loads(_read_exact(fd, size).decode("ascii"))
    except (ValueError, RecursionError, MemoryError, StopIteration) as exc:
        raise ProtocolError(f"unreadable message ({type(exc).__name__})") from None
