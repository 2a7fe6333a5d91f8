# mypy: allow-untyped-defs, allow-untyped-calls, allow-incomplete-defs
"""The data form of values crossing between a sandboxed run's test process and its candidate process.

The tests run in a process the candidate never executes in (see `channel.py`); every value crosses a pipe as a
length-prefixed frame of tagged JSON and is rebuilt on the other side. What a test compares is therefore always a
value `decode` built from trusted types, never an object the candidate made: an "always equal" object, a patched
`__eq__` or a forged record cannot exist on the test's side. Dataclass instances and Enum members come back as
`Record` and `EnumValue` (compared by class name and fields), Fraction, Decimal, Counter, OrderedDict and deque as
themselves, subclasses of plain types as their plain value; `encode` raises `UnencodableError` for the rest.

Standalone: imported by the sandbox harness under `python -I -S`, so it uses the standard library only (and the
C JSON scanner, not the `json` package, whose `re` import would cost every sandbox start a few ms).
"""

import _json
import math
import os
import sys

MAX_FRAME = 16 << 20  # bytes; a larger reply is refused (the test fails), which also bounds the test side's memory
MAX_DEPTH = 200
MAX_ITEMS = 1_000_000  # elements taken from an iterator the solution returns


class UnencodableError(Exception):
    """The value has no data form; the candidate side returns a handle instead."""


class ProtocolError(Exception):
    """The candidate side sent something that is not a well-formed frame of this protocol."""


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
    ("fractions", "Fraction"): "fr", ("decimal", "Decimal"): "dec",
}  # fmt: skip
_STDLIB_NAMES = {tag: key for key, tag in _STDLIB_TAGS.items()}


def _stdlib_type(tag, load=False):
    """The stdlib class behind a tag, from its module: imported on demand on the test side (`load`), and on the
    candidate side only looked up (a value of that class exists only if the solution imported the module)."""
    module, name = _STDLIB_NAMES[tag]
    if load:
        __import__(module)
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _qualname(cls):
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', '?')}"


def encode(value, depth=0, refs=None):
    """A JSON-able tagged form of `value`; raises UnencodableError for anything with no data form.

    Lists, str, int, float and None are themselves (floats that JSON lacks are tagged); every other kind is a
    one-key dict naming it, so a plain dict never appears untagged.
    """
    if depth > MAX_DEPTH:
        raise UnencodableError("nested too deeply")
    t = type(value)
    if value is None or t is str or t is bool or t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return [encode(v, depth + 1, refs) for v in value]
    if t is tuple:
        return {"t": [encode(v, depth + 1, refs) for v in value]}
    if t is dict:
        return {"d": [[encode(k, depth + 1, refs), encode(v, depth + 1, refs)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, depth + 1, refs) for v in value]}
    if t is bytes or t is bytearray:
        return {"b": bytes(value).decode("latin-1")}
    if t is complex:
        return {"c": [encode(value.real), encode(value.imag)]}
    tag = _STDLIB_TAGS.get((t.__module__, t.__qualname__))
    if tag is not None and _stdlib_type(tag) is t:  # only the real class, imported from its module
        if tag in ("od", "ctr"):
            return {tag: [[encode(k, depth + 1, refs), encode(v, depth + 1, refs)] for k, v in value.items()]}
        if tag == "dq":
            return {"dq": [encode(v, depth + 1, refs) for v in value]}
        if tag == "fr":
            return {"fr": [value.numerator, value.denominator]}
        return {"dec": str(value)}
    if refs is not None and t is refs:  # the test side passing back a handle it got (its class is `refs`)
        return {"ref": value._ref}
    return _encode_rich(value, t, depth, refs)


def _encode_rich(value, t, depth, refs):
    """Subclasses of the plain types, Enum members, dataclasses, iterators (candidate side: best effort)."""
    enum = sys.modules.get("enum")
    if enum is not None and isinstance(value, enum.Enum):
        inner = value.value
        if isinstance(value, int | str | float) and type(inner) in (int, str, float, bool):
            return inner
        return {"enum": [_qualname(t), value.name, encode(inner, depth + 1, refs)]}
    fields = getattr(t, "__dataclass_fields__", None)
    if isinstance(fields, dict) and "dataclasses" in sys.modules:
        compared = [f.name for f in sys.modules["dataclasses"].fields(value) if f.compare]
        return {"dc": [_qualname(t), [[n, encode(getattr(value, n), depth + 1, refs)] for n in compared]]}
    for base in (bool, int, float, str, bytes, tuple, list, dict, set, frozenset, complex):
        if isinstance(value, base):  # namedtuple, int and str subclasses ...: as the plain value they hold
            plain = base(value) if base is not dict else dict(value.items())  # type: ignore[arg-type, union-attr]
            return encode(plain, depth, refs)
    if t.__name__ in ("dict_keys", "dict_items"):
        return {"s": [encode(v, depth + 1, refs) for v in value]}
    if t.__name__ == "dict_values" or (hasattr(value, "__next__") and hasattr(value, "__iter__")):
        items = []  # type: ignore[var-annotated]
        for v in value:
            if len(items) >= MAX_ITEMS:
                raise UnencodableError("iterator too long")
            items.append(encode(v, depth + 1, refs))
        return {"it": items}
    raise UnencodableError(t.__name__)


def decode(data, depth=0, resolve=None):
    """The value a tagged form stands for, built from trusted types only; ProtocolError on anything else."""
    if depth > MAX_DEPTH:
        raise ProtocolError("nested too deeply")
    t = type(data)
    if data is None or t is str or t is bool or t is int or t is float:
        return data
    if t is list:
        return [decode(v, depth + 1, resolve) for v in data]
    if t is not dict or len(data) != 1:
        raise ProtocolError(f"unexpected {t.__name__}")
    ((tag, payload),) = data.items()
    return _decode_tagged(tag, payload, depth, resolve)


def _items(payload, depth, resolve):
    if type(payload) is not list:
        raise ProtocolError("expected a list")
    return [decode(v, depth + 1, resolve) for v in payload]


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
        if tag == "f" and payload in ("nan", "inf", "-inf"):
            return float(payload)
        if tag == "b" and type(payload) is str:
            return payload.encode("latin-1")
        if tag == "c" and type(payload) is list and len(payload) == 2:
            return complex(*(decode(v, depth + 1) for v in payload))
        if tag == "fr" and type(payload) is list and len(payload) == 2 and all(type(v) is int for v in payload):
            return _stdlib_type("fr", True)(*payload)
        if tag == "dec" and type(payload) is str and len(payload) < 10_000:
            return _stdlib_type("dec", True)(payload)
        if tag == "enum" and type(payload) is list and len(payload) == 3:
            cls, name, value = payload
            if type(cls) is str and type(name) is str:
                return EnumValue(cls, name, decode(value, depth + 1, resolve))
        if tag == "dc" and type(payload) is list and len(payload) == 2 and type(payload[0]) is str:
            fields = _pairs(payload[1], depth, resolve)
            if all(type(k) is str for k, _ in fields):
                return Record(payload[0], fields)
        if tag == "ref" and resolve is not None:
            return resolve(payload)
    except (TypeError, ValueError, ArithmeticError, KeyError) as exc:  # unhashable keys, bad numbers
        raise ProtocolError(f"bad {tag!r} value: {type(exc).__name__}") from None
    raise ProtocolError(f"unknown tag {tag!r}")


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


_scan = _json.make_scanner(_ScanOptions())  # type: ignore[arg-type]
_quote = _json.encode_basestring_ascii


def dumps(value):
    """JSON text of an encoded value (lists, one-key tag dicts, str, int, float, bool, None)."""
    parts = []
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str:
            parts.append(_quote(v))
        elif v is None:
            parts.append("null")
        elif v is True or v is False:
            parts.append("true" if v else "false")
        elif t is int:
            parts.append(int.__repr__(v))
        elif t is float:
            parts.append(float.__repr__(v))
        elif t is _Raw:
            parts.append(v.text)
        elif t is list:
            stack.append(_CLOSE_LIST)
            for i in range(len(v) - 1, -1, -1):
                stack.append(v[i])
                if i:
                    stack.append(_COMMA)
            parts.append("[")
        elif t is dict:
            ((k, inner),) = v.items()
            parts.append("{" + _quote(k) + ":")
            stack.append(_CLOSE_DICT)
            stack.append(inner)
        else:
            raise UnencodableError(t.__name__)
    return "".join(parts)


class _Raw:
    __slots__ = ("text",)

    def __init__(self, text):
        self.text = text


_COMMA, _CLOSE_LIST, _CLOSE_DICT = _Raw(","), _Raw("]"), _Raw("}")


def loads(text):
    value, end = _scan(text, 0)
    if end != len(text):
        raise ValueError("trailing data")
    return value


def send(fd, message):
    data = dumps(message).encode("ascii")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            raise CandidateGoneError("the solution's process closed the channel")
        buf += chunk
    return bytes(buf)


def receive(fd):
    """One frame's JSON value (ProtocolError for anything else, CandidateGoneError at end of file)."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"a reply of {size} bytes is over the {MAX_FRAME}-byte limit")
    try:
        return loads(_read_exact(fd, size).decode("ascii"))
    except (ValueError, RecursionError, MemoryError, StopIteration) as exc:
        raise ProtocolError(f"unreadable reply ({type(exc).__name__})") from None
