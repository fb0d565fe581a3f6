"""The interpreter's limits and errors, the provenance of strings (`Text`: which
characters are the caller's data), and the template values (Undefined, namespaces,
loops, lazy sequences) with the attribute and item access the sandbox allows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable


MAX_OUTPUT = 4 << 20        # characters a rendering may produce
MAX_ITERATIONS = 1_000_000  # loop bodies run, over the whole rendering
MAX_DEPTH = 40              # nested macro calls
MAX_NESTING = 200           # levels of a parsed template (real ones: up to 38); Python walks them recursively
MAX_RANGE = 100_000         # as Jinja's sandbox


class TemplateError(ValueError):
    """The template cannot be parsed or rendered; the message names the construct
    and the line."""

    def __init__(self, message: str, line: int | None = None):
        self.line = line
        super().__init__(f"{message} (template line {line})" if line else message)


class TemplateSyntaxError(TemplateError):
    """The template uses syntax this interpreter does not parse."""


class TemplateRuntimeError(TemplateError):
    """Rendering failed: undefined value used, unsafe access, a limit, a type error."""


class TemplateRaised(TemplateRuntimeError):
    """The template itself refused the input with raise_exception(message)."""


class Text(str):
    """A string whose characters in `spans` ((start, end, tag) triples, sorted, disjoint)
    came from the caller's data, and, when `safe`, one marked by `|safe` or `|escape` (Jinja's
    Markup: `+` and `%` HTML-escape the plain strings combined with it). Build with
    `_text`; a plain str has no data and is not safe."""

    spans: tuple[tuple[int, int, int], ...] = ()
    safe: bool = False


def _text(value: str, spans: Iterable[tuple[int, int, int]], safe: bool = False) -> str:
    merged: list[tuple[int, int, int]] = []
    for start, end, tag in spans:
        if start >= end:
            continue
        if merged and merged[-1][1] >= start and merged[-1][2] == tag:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]), tag)
        else:
            merged.append((start, end, tag))
    if not merged and not safe:
        return str(value)
    out = Text(value)
    out.spans, out.safe = tuple(merged), safe
    return out


def _is_safe(value: Any) -> bool:
    return isinstance(value, Text) and value.safe


def _mark_safe(value: str) -> str:
    return _text(value, _spans(value), safe=True)


def _html_escape(value: Any) -> str:
    """Markup escaping: a safe string stays, anything else is converted and escaped."""
    if _is_safe(value):
        return value
    s = _to_str(value)
    out = (s.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")
           .replace("'", "&#39;").replace('"', "&#34;"))
    return _mark_safe(_taint(out, s))


def _spans(value: Any) -> tuple[tuple[int, int, int], ...]:
    return value.spans if isinstance(value, Text) else ()


def _has_data(value: Any) -> bool:
    if isinstance(value, Text):
        return True
    if isinstance(value, dict):
        return any(_has_data(k) or _has_data(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_data(v) for v in value)
    return False


def _taint(result: Any, *sources: Any) -> Any:
    """A string computed from `sources` is all data if any source holds data."""
    if isinstance(result, str) and result and any(_has_data(s) for s in sources):
        return _text(result, [(0, len(result), 0)])
    return result


def _join(pieces: list[str]) -> str:
    spans, at = [], 0
    for piece in pieces:
        spans.extend((at + s, at + e, tag) for s, e, tag in _spans(piece))
        at += len(piece)
    return _text("".join(pieces), spans)


def _slice(value: str, start: int, end: int) -> str:
    return _text(value[start:end], [(max(s, start) - start, min(e, end) - start, tag)
                                     for s, e, tag in _spans(value)])


def data_text(value: str, tag: int) -> str:
    """`value` as the caller's data with source `tag` (> 0), for `render_parts` to report."""
    return _text(value, [(0, len(value), tag)])


def as_data(value: Any) -> Any:
    """Mark every string in a JSON-like value (keys too) as the caller's data; strings
    already marked (data_text) keep their tags."""
    if isinstance(value, Text):
        return value
    if isinstance(value, str):
        return _text(value, [(0, len(value), 0)])
    if isinstance(value, dict):
        return {as_data(k): as_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_data(v) for v in value]
    return value


class Undefined:
    """A missing value: prints as nothing, iterates as empty, is false; any other use
    is an error whose message (`hint`) says what was missing or refused."""

    __slots__ = ("hint", "unsafe")

    def __init__(self, hint: str, unsafe: bool = False):
        self.hint, self.unsafe = hint, unsafe

    def fail(self, line: int | None = None) -> TemplateRuntimeError:
        return TemplateRuntimeError(self.hint, line)

    def __str__(self) -> str:
        return ""

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: Any) -> bool:
        return type(other) is Undefined

    def __ne__(self, other: Any) -> bool:
        return type(other) is not Undefined

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "Undefined"


class Namespace:
    """`namespace(...)`: the one object a template may assign attributes to."""

    def __init__(self, values: dict[str, Any]):
        self.values = dict(values)

    def __repr__(self) -> str:
        return "<Namespace %r>" % self.values


@dataclass
class _Loop:
    """`loop` inside a for body (loops are never recursive here, so depth is 1)."""

    items: list
    index0: int = 0

    def field(self, name: str) -> Any:
        n, i = len(self.items), self.index0
        fields = {
            "index0": i, "index": i + 1, "revindex0": n - i - 1, "revindex": n - i,
            "first": i == 0, "last": i == n - 1, "length": n,
            "depth0": 0, "depth": 1,
        }
        if name in fields:
            return fields[name]
        if name == "previtem":
            return self.items[i - 1] if i > 0 else Undefined("there is no previous item")
        if name == "nextitem":
            return self.items[i + 1] if i + 1 < n else Undefined("there is no next item")
        if name == "cycle":
            return _Builtin("loop.cycle", lambda *args: args[i % len(args)] if args else _fail(
                "loop.cycle needs at least one value"))
        return Undefined(f"loop.{name}")


class _Lazy:
    """What Jinja's map/select/reject/unique/items filters return: a one-pass generator.
    It iterates and tests true, but has no length, no index and no JSON form."""

    def __init__(self, items: Iterable[Any], kind: str = "generator"):
        self.items, self.kind = list(items), kind

    def __iter__(self):
        return iter(self.items)

    def __bool__(self) -> bool:
        return True


class _Builtin:
    """A callable the template may call: a global function, a bound safe method."""

    def __init__(self, name: str, fn: Callable[..., Any]):
        self.name, self.fn = name, fn

    def __repr__(self) -> str:
        return f"<built-in {self.name}>"


def _fail(message: str) -> Any:
    raise TemplateRuntimeError(message)


def _to_str(value: Any) -> str:
    """Jinja's str(value) for output and `~`."""
    if isinstance(value, str):
        return value
    if isinstance(value, Undefined):
        return ""
    if isinstance(value, _Lazy):
        raise TemplateRuntimeError(f"a {value.kind} (from map, select, reject, unique or items) is printed; "
                                   "Jinja would print its address: convert it with |list")
    return _taint(str(value), value)


def _str_method(name: str) -> Callable[..., Any] | None:
    """A read-only str method that keeps provenance where it can."""
    def strip_like(mode: str) -> Callable[..., str]:
        def run(s: str, chars: str | None = None) -> str:
            chars = None if chars is None else str(chars)
            start = len(s) - len(s.lstrip(chars)) if mode in "lb" else 0
            end = len(s.rstrip(chars)) if mode in "rb" else len(s)
            return _slice(s, start, max(start, end))
        return run

    def split_like(method: str) -> Callable[..., list]:
        def run(s: str, sep: str | None = None, maxsplit: int = -1) -> list:
            pieces = getattr(str, method)(str(s), sep, maxsplit)
            out, pos = [], 0
            for piece in pieces:
                start = s.find(piece, pos) if sep is None else pos
                out.append(_slice(s, start, start + len(piece)))
                pos = start + len(piece) + (0 if sep is None else len(sep))
            return out
        return run

    special = {"strip": strip_like("b"), "lstrip": strip_like("l"), "rstrip": strip_like("r"),
               "split": split_like("split"), "rsplit": split_like("rsplit"),
               "format": lambda s, *a, **k: _check_format(s, _FORMAT_WIDTH) or _taint(
                   str.format(s, *a, **k), s, list(a), dict(k)),
               "join": lambda s, items: _join_with(s, [_to_str(x) for x in items])}
    if name in special:
        return special[name]
    if name not in _STR_METHODS:
        return None
    method = getattr(str, name)

    def generic(s: str, *args: Any, **kwargs: Any) -> Any:
        if name in ("center", "ljust", "rjust", "zfill", "expandtabs") and args:
            _check_width(args[0])
        result = method(str(s), *args, **kwargs)
        if isinstance(result, (list, tuple)):
            return [_taint(r, s, list(args)) for r in result]
        return _taint(result, s, list(args))
    return generic


# Field widths in printf-style and str.format formats; beyond the output limit they
# would only build a huge string before the limit could refuse it.
_PERCENT_WIDTH = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\d+)?(?:\.(\d+))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d+)[^{}]*\}")


def _check_width(width: Any) -> None:
    if isinstance(width, int) and width > MAX_OUTPUT:
        raise TemplateRuntimeError(f"a field width of {width} is beyond the output limit")


def _check_format(fmt: str, pattern: re.Pattern) -> None:
    for m in pattern.finditer(fmt):
        for digits in m.groups():
            if digits and len(digits) > 7:
                raise TemplateRuntimeError("a field width in a format string is beyond the output limit")
            if digits:
                _check_width(int(digits))


def _join_with(sep: str, items: list[str]) -> str:
    pieces: list[str] = []
    for i, item in enumerate(items):
        if i:
            pieces.append(sep)
        pieces.append(item)
    return _join(pieces)


_STR_METHODS = frozenset((
    "capitalize", "casefold", "center", "count", "endswith", "expandtabs", "find", "index",
    "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "ljust", "lower",
    "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
    "rpartition", "splitlines", "startswith", "swapcase", "title", "upper", "zfill"))
_DICT_METHODS = {"get": lambda d, k, default=None: d.get(k, default),
                 "items": lambda d: list(d.items()),
                 "keys": lambda d: list(d.keys()), "values": lambda d: list(d.values()),
                 "copy": lambda d: dict(d)}
_LIST_METHODS = {"index": lambda xs, *a: xs.index(*a), "count": lambda xs, x: xs.count(x),
                 "copy": lambda xs: list(xs)}
# Jinja's immutable sandbox refuses these by name; the refusal is the error message.
_MUTATING = frozenset(("append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear",
                       "popitem", "setdefault", "update", "add", "discard", "difference_update",
                       "intersection_update", "symmetric_difference_update"))
_DICT_ATTRS = frozenset(dir(dict))
_LIST_ATTRS = frozenset(dir(list))


def get_attr(obj: Any, name: Any) -> Any:
    """`obj.name` as the sandbox resolves it: a template object's field, a safe method,
    else the item; Undefined when absent."""
    if isinstance(obj, Undefined):
        raise obj.fail()
    if isinstance(name, str) and name.startswith("_"):
        return Undefined(f"access to attribute {name!r} of {_type_name(obj)!r} object is unsafe.", True)
    if isinstance(obj, Namespace):
        return obj.values.get(name, Undefined(f"namespace has no attribute {name!r}"))
    if isinstance(obj, _Loop):
        return obj.field(name)
    if isinstance(obj, _Macro):
        return {"name": obj.name, "arguments": tuple(a for a, _ in obj.params)}.get(
            name, Undefined(f"macro has no attribute {name!r}"))
    if isinstance(name, str) and isinstance(obj, (dict, list, tuple, str)):
        method = _method(obj, name)
        if method is not None:
            return method
    return get_item(obj, name, from_attr=True)


def _method(obj: Any, name: str) -> Any:
    if isinstance(obj, str):
        fn = _str_method(name)
        if fn is not None:
            return _Builtin(f"str.{name}", lambda *a, **k: fn(obj, *a, **k))
        return None
    table, attrs = (_DICT_METHODS, _DICT_ATTRS) if isinstance(obj, dict) else (_LIST_METHODS, _LIST_ATTRS)
    if name in table:
        fn = table[name]
        return _Builtin(f"{_type_name(obj)}.{name}", lambda *a, **k: fn(obj, *a, **k))
    if name in attrs:
        return Undefined(f"access to attribute {name!r} of {_type_name(obj)!r} object is unsafe.", True)
    return None


def _type_name(obj: Any) -> str:
    if isinstance(obj, _Lazy):
        return obj.kind
    return {dict: "dict", list: "list", tuple: "tuple", int: "int", float: "float", bool: "bool",
            type(None): "NoneType"}.get(type(obj), "str" if isinstance(obj, str) else type(obj).__name__)


def get_item(obj: Any, key: Any, from_attr: bool = False) -> Any:
    """`obj[key]` as Jinja resolves it; Undefined when absent."""
    if isinstance(obj, Undefined):
        raise obj.fail()
    if isinstance(key, Undefined):
        return Undefined(f"'{_type_name(obj)} object' has no attribute Undefined")
    if isinstance(obj, dict):
        try:
            if key in obj:
                return obj[key]
        except TypeError:
            pass
    elif isinstance(obj, (list, tuple, str)) and isinstance(key, int) and not isinstance(key, bool):
        if -len(obj) <= key < len(obj):
            return _slice(obj, key % len(obj), key % len(obj) + 1) if isinstance(obj, str) else obj[key]
    elif isinstance(obj, (list, tuple, str)) and isinstance(key, slice):
        return _slice_value(obj, key)
    elif isinstance(obj, (Namespace, _Loop, _Macro)) and isinstance(key, str) and not from_attr:
        return get_attr(obj, key)
    if not from_attr and isinstance(key, str) and isinstance(obj, (dict, list, tuple, str)):
        method = _method(obj, key) if not key.startswith("_") else None
        if method is not None:
            return method
    return Undefined(f"'{_type_name(obj)} object' has no attribute {key!r}")


def _slice_value(obj: Any, key: slice) -> Any:
    if isinstance(obj, str):
        if key.step in (None, 1):
            start, stop, _ = key.indices(len(obj))
            return _slice(obj, start, max(start, stop))
        return _taint(obj[key], obj)
    return obj[key]


class _Macro:
    """A macro value: its parameters (name, default node or None), body, and the frame it
    was defined in (names it does not bind resolve there, when it is called)."""

    def __init__(self, name: str, params: list[tuple[str, Any]], body: list, frame: dict,
                 uses_caller: bool):
        self.name, self.params, self.body, self.frame, self.uses_caller = name, params, body, frame, uses_caller

    def __repr__(self) -> str:
        return f"<Macro {self.name!r}>"
