"""A sandboxed interpreter for the subset of Jinja that chat templates are written in.

Theory of operation. `Template(source)` lexes and parses once; `render(**variables)`
walks the tree and returns the text. The dialect is the one Hugging Face transformers
gives chat templates: trim_blocks and lstrip_blocks on, `break`/`continue`, a
`tojson` that is `json.dumps` (non-ASCII kept, optional indent / separators /
sort_keys), `raise_exception(message)`, `strftime_now(format)` and the transparent
`{% generation %}` block. The goal is byte-identical output to Jinja2 for the same
template and values, including where Jinja2 fails: what it cannot render, this
interpreter refuses too, with a TemplateError naming the construct and its line.

Values are plain Python data (dict, list, str, int, float, bool, None) plus a few
template objects (Undefined, namespaces, loops, macros). Nothing reaches Python
objects beyond that: names never start with `_`, attributes resolve only to dict keys,
the read-only methods of str/dict/list listed below, and template objects' own fields;
the only callables are those methods, macros and the listed globals. Work is bounded:
output size, loop iterations, call depth and `range` length all have limits.

Provenance. Strings that come from the caller's data (`render_parts(..., data)` wraps
them) are `Text`: a str that knows which of its characters are data, each range with a
source tag (0, or the tag the caller gave with `data_text`). Concatenation, slicing,
strip, split, join and output keep that knowledge exactly; every other operation that
reads data marks its whole result as untagged data. `render_parts` then returns the
output as runs with their source, so a caller can treat control-token strings the
template wrote as markers while the same characters typed by a user stay text.
"""

from __future__ import annotations

import codecs
import datetime as _dt
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

MAX_OUTPUT = 4 << 20        # characters a rendering may produce
MAX_ITERATIONS = 1_000_000  # loop bodies run, over the whole rendering
MAX_DEPTH = 40              # nested macro calls
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


# --- provenance ---------------------------------------------------------------------

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


# --- values -------------------------------------------------------------------------

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


# --- lexer --------------------------------------------------------------------------

_TAG_START = re.compile(r"\{([{%#])([-+]?)")
_RAW_BEGIN = re.compile(r"\{%[-+]?\s*raw\s*(?:-%\}\s*|%\})")
_RAW_END = re.compile(r"(.*?)\{%([-+]?)\s*endraw\s*(?:\+%\}|-%\}\s*|%\}\n?)", re.S)
_COMMENT_END = re.compile(r"(.*?)(\+#\}|-#\}\s*|#\}\n?)", re.S)
_BLOCK_END = re.compile(r"\+%\}|-%\}\s*|%\}\n?")
_VAR_END = re.compile(r"-\}\}\s*|\}\}")
_SPACE = re.compile(r"\s+")
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_STRING = re.compile(r"'([^'\\]*(?:\\.[^'\\]*)*)'|\"([^\"\\]*(?:\\.[^\"\\]*)*)\"", re.S)
_FLOAT = re.compile(r"(?<!\.)\d+(?:_\d+)*(?:\.\d+(?:_\d+)*(?:[eE][+-]?\d+(?:_\d+)*)?|[eE][+-]?\d+(?:_\d+)*)")
_INTEGER = re.compile(r"0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0[xX](?:_?[\da-fA-F])+|[1-9](?:_?\d)*|0(?:_?0)*")
_OPERATORS = ("//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")",
              "{", "}", ">", "<", "=", ".", ":", "|", ",", ";")


@dataclass
class _Tok:
    kind: str   # data, var_begin, var_end, block_begin, block_end, name, string, int, float, op, eof
    value: Any
    line: int


def _strip_before_tag(text: str, sign: str, lstrip: bool, line_starting: bool) -> str:
    """Text before a tag after whitespace control: `-` strips all trailing whitespace;
    otherwise, for block tags and comments (lstrip), spaces from the line's start."""
    if sign == "-":
        return text.rstrip()
    if sign != "+" and lstrip:
        l_pos = text.rfind("\n") + 1
        if (l_pos > 0 or line_starting) and _SPACE.fullmatch(text, l_pos):
            return text[:l_pos]
    return text


def _lex(source: str) -> list[_Tok]:
    lines = re.split(r"\r\n|\r|\n", source)
    if lines[-1] == "":
        lines.pop()  # Jinja drops one trailing newline
    source = "\n".join(lines)
    toks: list[_Tok] = []
    pos, line, line_starting = 0, 1, True
    while pos < len(source):
        m = _TAG_START.search(source, pos)
        text = source[pos:m.start()] if m else source[pos:]
        if not m:
            toks.append(_Tok("data", text, line))
            break
        kind, sign = m.group(1), m.group(2)
        text = _strip_before_tag(text, sign, kind != "{", line_starting)
        if text:
            toks.append(_Tok("data", text, line))
        if kind == "%" and (raw := _RAW_BEGIN.match(source, m.start())):
            # {% raw %}...{% endraw %}: the text between is data, tags and all
            end = _RAW_END.match(source, raw.end())
            if not end:
                raise TemplateSyntaxError("{% raw %} is not closed with {% endraw %}", line)
            body = _strip_before_tag(end.group(1), end.group(2), True, raw.group(0).endswith("\n"))
            line += source.count("\n", pos, raw.end())
            if body:
                toks.append(_Tok("data", body, line))
            line += source.count("\n", raw.end(), end.end())
            pos = end.end()
            line_starting = end.group(0).endswith("\n")
            continue
        line += source.count("\n", pos, m.end())
        pos = m.end()
        if kind == "#":
            end = _COMMENT_END.match(source, pos)
            if not end:
                raise TemplateSyntaxError("comment is not closed with #}", line)
            line += end.group(0).count("\n")
            pos = end.end()
            line_starting = end.group(0).endswith("\n")
            continue
        toks.append(_Tok("var_begin" if kind == "{" else "block_begin", None, line))
        pos, line, last = _lex_tag(source, pos, line, kind, toks)
        line_starting = last.endswith("\n")
    toks.append(_Tok("eof", None, line))
    return toks


def _lex_tag(source: str, pos: int, line: int, kind: str, toks: list[_Tok]) -> tuple[int, int, str]:
    end_re = _VAR_END if kind == "{" else _BLOCK_END
    depth = 0
    start_line = line
    while True:
        space = _SPACE.match(source, pos)
        if space:
            line += space.group(0).count("\n")
            pos = space.end()
        if pos >= len(source):
            raise TemplateSyntaxError("tag is not closed with " + ("}}" if kind == "{" else "%}"), start_line)
        end = end_re.match(source, pos) if depth == 0 else None
        if end:
            toks.append(_Tok("var_end" if kind == "{" else "block_end", None, line))
            line += end.group(0).count("\n")
            return end.end(), line, end.group(0)
        if m := _NAME.match(source, pos):
            toks.append(_Tok("name", m.group(0), line))
        elif m := _STRING.match(source, pos):
            body = m.group(1) if m.group(1) is not None else m.group(2)
            value = codecs.decode(body.encode("ascii", "backslashreplace"), "unicode-escape")
            toks.append(_Tok("string", value, line))
            line += m.group(0).count("\n")
        elif m := _FLOAT.match(source, pos):
            toks.append(_Tok("float", float(m.group(0).replace("_", "")), line))
        elif m := _INTEGER.match(source, pos):
            toks.append(_Tok("int", int(m.group(0).replace("_", ""), 0), line))
        else:
            op = next((o for o in _OPERATORS if source.startswith(o, pos)), None)
            if op is None:
                raise TemplateSyntaxError(f"unexpected character {source[pos]!r}", line)
            depth += op in "([{"
            depth -= op in ")]}" and depth > 0
            toks.append(_Tok("op", op, line))
            pos += len(op)
            continue
        pos = m.end()


# --- parser: expressions ------------------------------------------------------------
# Each node is a small class with `ev(ctx)`; statements have `run(ctx, out)`.

class _Node:
    line = 0


class _Const(_Node):
    def __init__(self, value: Any):
        self.value = value

    def ev(self, ctx: _Ctx) -> Any:
        return self.value


class _Name(_Node):
    def __init__(self, name: str):
        self.name = name

    def ev(self, ctx: _Ctx) -> Any:
        return ctx.lookup(self.name)


class _ListLit(_Node):
    def __init__(self, items: list[_Node], kind: str = "list"):
        self.items, self.kind = items, kind

    def ev(self, ctx: _Ctx) -> Any:
        values = [item.ev(ctx) for item in self.items]
        return tuple(values) if self.kind == "tuple" else values


class _DictLit(_Node):
    def __init__(self, pairs: list[tuple[_Node, _Node]]):
        self.pairs = pairs

    def ev(self, ctx: _Ctx) -> Any:
        return {k.ev(ctx): v.ev(ctx) for k, v in self.pairs}


class _Attr(_Node):
    def __init__(self, obj: _Node, name: Any):
        self.obj, self.name = obj, name

    def ev(self, ctx: _Ctx) -> Any:
        obj = self.obj.ev(ctx)
        if isinstance(obj, Undefined):
            raise obj.fail(self.line)
        return get_attr(obj, self.name)


class _Item(_Node):
    def __init__(self, obj: _Node, key: _Node):
        self.obj, self.key = obj, key

    def ev(self, ctx: _Ctx) -> Any:
        obj = self.obj.ev(ctx)
        if isinstance(obj, Undefined):
            raise obj.fail(self.line)
        return get_item(obj, self.key.ev(ctx))


class _Slice(_Node):
    def __init__(self, start: _Node | None, stop: _Node | None, step: _Node | None):
        self.parts = (start, stop, step)

    def ev(self, ctx: _Ctx) -> Any:
        return slice(*(None if p is None else p.ev(ctx) for p in self.parts))


class _Call(_Node):
    def __init__(self, fn: _Node, args: list[_Node], kwargs: list[tuple[str, _Node]],
                 star: _Node | None = None, dstar: _Node | None = None):
        self.fn, self.args, self.kwargs, self.star, self.dstar = fn, args, kwargs, star, dstar

    def ev(self, ctx: _Ctx) -> Any:
        fn = self.fn.ev(ctx)
        args = [a.ev(ctx) for a in self.args]
        if self.star is not None:
            args.extend(self.star.ev(ctx))
        kwargs = {k: v.ev(ctx) for k, v in self.kwargs}
        if self.dstar is not None:
            kwargs.update(self.dstar.ev(ctx))
        return ctx.call(fn, args, kwargs, self.line)


class _Unary(_Node):
    def __init__(self, op: str, operand: _Node):
        self.op, self.operand = op, operand

    def ev(self, ctx: _Ctx) -> Any:
        value = self.operand.ev(ctx)
        if self.op == "not":
            return not value
        _defined(value, self.line)
        return -value if self.op == "-" else +value


def _defined(value: Any, line: int) -> None:
    if isinstance(value, Undefined):
        raise value.fail(line)


class _Binary(_Node):
    def __init__(self, op: str, left: _Node, right: _Node):
        self.op, self.left, self.right = op, left, right

    def ev(self, ctx: _Ctx) -> Any:
        op = self.op
        if op == "and":
            left = self.left.ev(ctx)
            return self.right.ev(ctx) if left else left
        if op == "or":
            left = self.left.ev(ctx)
            return left if left else self.right.ev(ctx)
        a, b = self.left.ev(ctx), self.right.ev(ctx)
        if op == "~":
            return _join([_to_str(a), _to_str(b)])
        _defined(a, self.line)
        _defined(b, self.line)
        if op == "+" and isinstance(a, str) and isinstance(b, str):
            if _is_safe(a) or _is_safe(b):
                return _mark_safe(_join([_html_escape(a), _html_escape(b)]))
            result = _join([a, b])
        elif op == "%" and isinstance(a, str) and (_check_format(a, _PERCENT_WIDTH) or _is_safe(a)):
            args = tuple(_html_escape(x) if isinstance(x, str) else x for x in b) if isinstance(b, tuple) \
                else (_html_escape(b) if isinstance(b, str) else b)
            return _mark_safe(_taint(a % args, a, b))
        elif op == "*" and isinstance(a, (str, list)) and isinstance(b, int) and len(a) * b > MAX_OUTPUT:
            raise TemplateRuntimeError("a repeated string or list is longer than the output limit", self.line)
        elif op == "*" and isinstance(b, (str, list)) and isinstance(a, int) and len(b) * a > MAX_OUTPUT:
            raise TemplateRuntimeError("a repeated string or list is longer than the output limit", self.line)
        elif op == "**" and isinstance(b, int) and abs(b) > 10_000:
            raise TemplateRuntimeError("an exponent is larger than the limit", self.line)
        else:
            result = _BINARY[op](a, b)
        return _taint(result, a, b) if op in ("%", "*") else result


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a / b, "//": lambda a, b: a // b, "%": lambda a, b: a % b,
    "**": lambda a, b: a ** b,
}


class _Compare(_Node):
    def __init__(self, first: _Node, rest: list[tuple[str, _Node]]):
        self.first, self.rest = first, rest

    def ev(self, ctx: _Ctx) -> Any:
        left = self.first.ev(ctx)
        for op, node in self.rest:
            right = node.ev(ctx)
            if not _compare(op, left, right, self.line):
                return False
            left = right
        return True


def _compare(op: str, a: Any, b: Any, line: int) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op in ("in", "notin"):
        if isinstance(b, Undefined):
            if b.unsafe:
                raise b.fail(line)
            found = False
        elif isinstance(b, str) and not isinstance(a, str):
            raise TemplateRuntimeError(f"'in <string>' requires string as left operand, not {_type_name(a)}", line)
        else:
            found = a in b
        return found if op == "in" else not found
    _defined(a, line)
    _defined(b, line)
    return {"<": a.__lt__, ">": a.__gt__, "<=": a.__le__, ">=": a.__ge__}[op](b) is True \
        if _comparable(a, b) else _fail_compare(op, a, b, line)


def _comparable(a: Any, b: Any) -> bool:
    numbers = (int, float)
    return (isinstance(a, numbers) and isinstance(b, numbers)) or (isinstance(a, str) and isinstance(b, str)) \
        or (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b))


def _fail_compare(op: str, a: Any, b: Any, line: int) -> bool:
    raise TemplateRuntimeError(f"'{op}' not supported between instances of {_type_name(a)!r} and "
                               f"{_type_name(b)!r}", line)


class _Cond(_Node):
    def __init__(self, test: _Node, then: _Node, other: _Node | None):
        self.test, self.then, self.other = test, then, other

    def ev(self, ctx: _Ctx) -> Any:
        if self.test.ev(ctx):
            return self.then.ev(ctx)
        return self.other.ev(ctx) if self.other is not None else Undefined("an if-expression without else had a false condition: its value is undefined")


class _Filter(_Node):
    def __init__(self, value: _Node | None, name: str, args: list[_Node], kwargs: list[tuple[str, _Node]]):
        self.value, self.name, self.args, self.kwargs = value, name, args, kwargs

    def ev(self, ctx: _Ctx, value: Any = None) -> Any:
        fn = FILTERS.get(self.name)
        if fn is None:
            raise TemplateRuntimeError(f"filter {self.name!r} is not supported", self.line)
        if self.value is not None:
            value = self.value.ev(ctx)
        args = [a.ev(ctx) for a in self.args]
        kwargs = {k: v.ev(ctx) for k, v in self.kwargs}
        try:
            return fn(ctx, value, *args, **kwargs)
        except TemplateError as exc:
            if exc.line is None:
                raise type(exc)(str(exc), self.line) from None
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
            raise TemplateRuntimeError(f"filter {self.name!r} failed: {exc}", self.line) from None


class _Test(_Node):
    def __init__(self, value: _Node, name: str, args: list[_Node], negated: bool):
        self.value, self.name, self.args, self.negated = value, name, args, negated

    def ev(self, ctx: _Ctx) -> Any:
        fn = TESTS.get(self.name)
        if fn is None:
            raise TemplateRuntimeError(f"test {self.name!r} is not supported", self.line)
        value = self.value.ev(ctx)
        try:
            result = bool(fn(value, *[a.ev(ctx) for a in self.args]))
        except (TypeError, ValueError) as exc:
            raise TemplateRuntimeError(f"test {self.name!r} failed: {exc}", self.line) from None
        return not result if self.negated else result


class _Parser:
    def __init__(self, toks: list[_Tok]):
        self.toks, self.i = toks, 0

    @property
    def cur(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def is_op(self, *ops: str) -> bool:
        return self.cur.kind == "op" and self.cur.value in ops

    def is_name(self, *names: str) -> bool:
        return self.cur.kind == "name" and self.cur.value in names

    def skip_op(self, op: str) -> bool:
        if self.is_op(op):
            self.i += 1
            return True
        return False

    def skip_name(self, name: str) -> bool:
        if self.is_name(name):
            self.i += 1
            return True
        return False

    def expect_op(self, op: str) -> None:
        if not self.skip_op(op):
            self.error(f"expected {op!r}")

    def expect_name(self, name: str | None = None) -> str:
        tok = self.cur
        if tok.kind != "name" or (name is not None and tok.value != name):
            self.error(f"expected {name or 'a name'}")
        self.i += 1
        return tok.value

    def error(self, message: str) -> None:
        tok = self.cur
        got = {"block_end": "end of tag", "var_end": "end of expression", "eof": "end of template"}.get(
            tok.kind, repr(tok.value))
        raise TemplateSyntaxError(f"{message}, found {got}", tok.line)

    def node(self, node: _Node, line: int) -> _Node:
        node.line = line
        return node

    # expression grammar, lowest precedence first (as Jinja's parser)
    def expr(self, with_cond: bool = True) -> _Node:
        if not with_cond:
            return self.or_()
        line = self.cur.line
        node = self.or_()
        while self.skip_name("if"):
            test = self.or_()
            other = self.expr() if self.skip_name("else") else None
            node = self.node(_Cond(test, node, other), line)
        return node

    def or_(self) -> _Node:
        node = self.and_()
        while self.is_name("or"):
            line = self.next().line
            node = self.node(_Binary("or", node, self.and_()), line)
        return node

    def and_(self) -> _Node:
        node = self.not_()
        while self.is_name("and"):
            line = self.next().line
            node = self.node(_Binary("and", node, self.not_()), line)
        return node

    def not_(self) -> _Node:
        if self.is_name("not"):
            line = self.next().line
            return self.node(_Unary("not", self.not_()), line)
        return self.compare()

    def compare(self) -> _Node:
        line = self.cur.line
        first = self.math1()
        rest = []
        while True:
            if self.is_op("==", "!=", "<", ">", "<=", ">="):
                rest.append((self.next().value, self.math1()))
            elif self.skip_name("in"):
                rest.append(("in", self.math1()))
            elif self.is_name("not") and self.toks[self.i + 1].kind == "name" and self.toks[self.i + 1].value == "in":
                self.i += 2
                rest.append(("notin", self.math1()))
            else:
                break
        return self.node(_Compare(first, rest), line) if rest else first

    def math1(self) -> _Node:
        node = self.concat()
        while self.is_op("+", "-"):
            tok = self.next()
            node = self.node(_Binary(tok.value, node, self.concat()), tok.line)
        return node

    def concat(self) -> _Node:
        node = self.math2()
        while self.is_op("~"):
            tok = self.next()
            node = self.node(_Binary("~", node, self.math2()), tok.line)
        return node

    def math2(self) -> _Node:
        node = self.pow()
        while self.is_op("*", "/", "//", "%"):
            tok = self.next()
            node = self.node(_Binary(tok.value, node, self.pow()), tok.line)
        return node

    def pow(self) -> _Node:
        node = self.unary()
        while self.is_op("**"):
            tok = self.next()
            node = self.node(_Binary("**", node, self.unary()), tok.line)
        return node

    def unary(self, with_filter: bool = True) -> _Node:
        line = self.cur.line
        if self.is_op("-", "+"):
            op = self.next().value
            node = self.node(_Unary(op, self.unary(False)), line)
        else:
            node = self.primary()
        node = self.postfix(node)
        return self.filters(node) if with_filter else node

    def primary(self) -> _Node:
        tok = self.next()
        line = tok.line
        if tok.kind == "name":
            consts = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}
            if tok.value in consts:
                return self.node(_Const(consts[tok.value]), line)
            return self.node(_Name(tok.value), line)
        if tok.kind == "string":
            value = tok.value
            while self.cur.kind == "string":
                value += self.next().value
            return self.node(_Const(value), line)
        if tok.kind in ("int", "float"):
            return self.node(_Const(tok.value), line)
        if tok.kind == "op" and tok.value == "(":
            node = self.tuple_(explicit=True)
            self.expect_op(")")
            return node
        if tok.kind == "op" and tok.value == "[":
            items = []
            while not self.is_op("]"):
                if items:
                    self.expect_op(",")
                    if self.is_op("]"):
                        break
                items.append(self.expr())
            self.expect_op("]")
            return self.node(_ListLit(items), line)
        if tok.kind == "op" and tok.value == "{":
            pairs = []
            while not self.is_op("}"):
                if pairs:
                    self.expect_op(",")
                    if self.is_op("}"):
                        break
                key = self.expr()
                self.expect_op(":")
                pairs.append((key, self.expr()))
            self.expect_op("}")
            return self.node(_DictLit(pairs), line)
        self.i -= 1
        self.error("expected an expression")
        raise AssertionError  # error() always raises

    def tuple_(self, explicit: bool = False, with_cond: bool = True, simple: bool = False) -> _Node:
        """An expression or a bare tuple `a, b` (as in `for k, v in ...`, `set a, b = ...`)."""
        line = self.cur.line
        items, comma = [], False
        while True:
            if items:
                if not self.skip_op(","):
                    break
                comma = True
            if self.cur.kind in ("block_end", "var_end") or self.is_op(")") or (
                    items and self.is_name("in")) or self.is_op("="):
                break
            if simple:
                items.append(self.node(_Name(self.expect_name()), self.cur.line))
            else:
                items.append(self.expr(with_cond))
        if not comma and len(items) == 1:
            return items[0]
        if not items and not explicit:
            self.error("expected an expression")
        return self.node(_ListLit(items, "tuple"), line)

    def postfix(self, node: _Node) -> _Node:
        while True:
            line = self.cur.line
            if self.skip_op("."):
                tok = self.next()
                if tok.kind == "name":
                    node = self.node(_Attr(node, tok.value), line)
                elif tok.kind == "int":
                    node = self.node(_Item(node, _Const(tok.value)), line)
                else:
                    self.i -= 1
                    self.error("expected an attribute name after '.'")
            elif self.skip_op("["):
                node = self.node(_Item(node, self.subscript()), line)
                self.expect_op("]")
            elif self.is_op("("):
                node = self.call(node)
            else:
                return node

    def subscript(self) -> _Node:
        line = self.cur.line
        parts: list[_Node | None] = [None]
        if not self.is_op(":"):
            parts[0] = self.expr()
            if not self.is_op(":"):
                return parts[0]
        while self.skip_op(":") and len(parts) < 3:
            parts.append(None if self.is_op(":", "]") else self.expr())
        parts += [None] * (3 - len(parts))
        return self.node(_Slice(*parts), line)

    def call_args(self) -> tuple[list, list, _Node | None, _Node | None]:
        self.expect_op("(")
        args, kwargs, star, dstar = [], [], None, None
        while not self.is_op(")"):
            if args or kwargs or star or dstar:
                self.expect_op(",")
                if self.is_op(")"):
                    break
            if self.skip_op("*"):
                star = self.expr()
            elif self.skip_op("**"):
                dstar = self.expr()
            elif self.cur.kind == "name" and self.toks[self.i + 1].kind == "op" and self.toks[self.i + 1].value == "=":
                name = self.next().value
                self.i += 1
                kwargs.append((name, self.expr()))
            else:
                args.append(self.expr())
        self.expect_op(")")
        return args, kwargs, star, dstar

    def call(self, fn: _Node) -> _Node:
        line = self.cur.line
        return self.node(_Call(fn, *self.call_args()), line)

    def filters(self, node: _Node) -> _Node:
        while True:
            line = self.cur.line
            if self.skip_op("|"):
                node = self.filter_call(node, line)
            elif self.skip_name("is"):
                negated = self.skip_name("not")
                name = self.dotted_name()
                args: list[_Node] = []
                if self.is_op("("):
                    args, _, _, _ = self.call_args()
                elif (self.cur.kind in ("name", "string", "int", "float") or self.is_op("(", "[", "{")) \
                        and not self.is_name("else", "or", "and"):
                    arg = self.postfix(self.primary())
                    args = [arg]
                node = self.node(_Test(node, name, args, negated), line)
            elif self.is_op("("):
                node = self.call(node)
            else:
                return node

    def dotted_name(self) -> str:
        name = self.expect_name()
        while self.skip_op("."):
            name += "." + self.expect_name()
        return name

    def filter_call(self, node: _Node | None, line: int) -> _Filter:
        name = self.dotted_name()
        args, kwargs = [], []
        if self.is_op("("):
            args, kwargs, star, dstar = self.call_args()
            if star is not None or dstar is not None:
                self.error("*args and **kwargs in filter calls are not supported")
        return self.node(_Filter(node, name, args, kwargs), line)  # type: ignore[return-value]


# --- parser: statements -------------------------------------------------------------

class _Output(_Node):
    def __init__(self, expr: _Node):
        self.expr = expr

    def run(self, ctx: _Ctx) -> None:
        ctx.write(_to_str(self.expr.ev(ctx)))


class _Data(_Node):
    def __init__(self, text: str):
        self.text = text

    def run(self, ctx: _Ctx) -> None:
        ctx.write(self.text)


class _If(_Node):
    def __init__(self, branches: list[tuple[_Node, list]], other: list):
        self.branches, self.other = branches, other

    def run(self, ctx: _Ctx) -> None:
        for test, body in self.branches:
            if test.ev(ctx):
                ctx.run(body)
                return
        ctx.run(self.other)


class _LoopControl(Exception):
    def __init__(self, kind: str):
        self.kind = kind


class _Control(_Node):
    def __init__(self, kind: str):
        self.kind = kind

    def run(self, ctx: _Ctx) -> None:
        raise _LoopControl(self.kind)


class _For(_Node):
    def __init__(self, target: _Node, iterable: _Node, condition: _Node | None, body: list, other: list):
        self.target, self.iterable, self.condition = target, iterable, condition
        self.body, self.other = body, other

    def run(self, ctx: _Ctx) -> None:
        iterable = self.iterable.ev(ctx)
        if isinstance(iterable, Undefined) and iterable.unsafe:
            raise iterable.fail(self.line)
        if isinstance(iterable, dict):
            items = list(iterable.keys())
        elif isinstance(iterable, str):
            items = [_slice(iterable, i, i + 1) for i in range(len(iterable))]
        elif isinstance(iterable, (list, tuple, Undefined, _Lazy)):
            items = list(iterable)
        else:
            raise TemplateRuntimeError(f"{_type_name(iterable)!r} object is not iterable", self.line)
        if self.condition is not None:
            kept = []
            for item in items:
                ctx.tick(self.line)
                frame = ctx.push()
                ctx.assign(self.target, item, self.line)
                if self.condition.ev(ctx):
                    kept.append(item)
                ctx.pop(frame)
            items = kept
        if not items:
            ctx.run(self.other)
            return
        loop = _Loop(items)
        for index, item in enumerate(items):
            ctx.tick(self.line)
            frame = ctx.push()
            loop.index0 = index
            ctx.set("loop", loop)
            ctx.assign(self.target, item, self.line)
            try:
                ctx.run(self.body)
            except _LoopControl as control:
                if control.kind == "break":
                    ctx.pop(frame)
                    break
            ctx.pop(frame)


class _Set(_Node):
    def __init__(self, target: _Node, value: _Node | None, body: list | None, filters: list[_Filter]):
        self.target, self.value, self.body, self.filters = target, value, body, filters

    def run(self, ctx: _Ctx) -> None:
        if self.body is not None:
            value = ctx.capture(self.body)
            for filt in self.filters:
                value = filt.ev(ctx, value)
        else:
            value = self.value.ev(ctx)
        ctx.assign(self.target, value, self.line)


class _Macro:
    """A macro value: its parameters (name, default node or None), body, and the frame it
    was defined in (names it does not bind resolve there, when it is called)."""

    def __init__(self, name: str, params: list[tuple[str, _Node | None]], body: list, frame: dict,
                 uses_caller: bool):
        self.name, self.params, self.body, self.frame, self.uses_caller = name, params, body, frame, uses_caller

    def __repr__(self) -> str:
        return f"<Macro {self.name!r}>"


class _MacroDef(_Node):
    def __init__(self, name: str, params: list[tuple[str, _Node | None]], body: list):
        self.name, self.params, self.body = name, params, body
        self.uses_caller = _mentions(body, "caller")

    def run(self, ctx: _Ctx) -> None:
        ctx.set(self.name, _Macro(self.name, self.params, self.body, ctx.frames[-1], self.uses_caller))


class _CallBlock(_Node):
    def __init__(self, call: _Call, params: list[tuple[str, _Node | None]], body: list):
        self.call_node, self.params, self.body = call, params, body

    def run(self, ctx: _Ctx) -> None:
        caller = _Macro("caller", self.params, self.body, ctx.frames[-1], False)
        fn = self.call_node.fn.ev(ctx)
        args = [a.ev(ctx) for a in self.call_node.args]
        kwargs = {k: v.ev(ctx) for k, v in self.call_node.kwargs}
        kwargs["caller"] = caller
        ctx.write(_to_str(ctx.call(fn, args, kwargs, self.line)))


class _FilterBlock(_Node):
    def __init__(self, filters: list[_Filter], body: list):
        self.filters, self.body = filters, body

    def run(self, ctx: _Ctx) -> None:
        value = ctx.capture(self.body)
        for filt in self.filters:
            value = filt.ev(ctx, value)
        ctx.write(_to_str(value))


class _With(_Node):
    """`{% with a = x %}...{% endwith %}`: names that exist only inside the block."""

    def __init__(self, assignments: list[tuple[_Node, _Node]], body: list):
        self.assignments, self.body = assignments, body

    def run(self, ctx: _Ctx) -> None:
        values = [(target, value.ev(ctx)) for target, value in self.assignments]
        saved = ctx.push()
        try:
            for target, value in values:
                ctx.assign(target, value, self.line)
            ctx.run(self.body)
        finally:
            ctx.pop(saved)


class _Transparent(_Node):
    """`{% generation %}`: transformers marks assistant text with it; it renders its body."""

    def __init__(self, body: list):
        self.body = body

    def run(self, ctx: _Ctx) -> None:
        ctx.run(self.body)


def _mentions(body: Any, name: str) -> bool:
    """Whether a name is read anywhere in a tree (for `caller` and macros' extra args)."""
    return any(isinstance(node, _Name) and node.name == name for node in _nodes(body))


_END_TAGS = {"if": ("elif", "else", "endif"), "for": ("else", "endfor")}


class _StatementParser(_Parser):
    def template(self) -> list:
        body = self.body(())
        if self.cur.kind != "eof":
            self.error("unexpected tag")
        return body

    def body(self, ends: tuple[str, ...]) -> list:
        """Statements up to one of the block tags in `ends` (the tag name is left current)."""
        nodes: list = []
        while True:
            tok = self.cur
            if tok.kind == "eof":
                if ends:
                    raise TemplateSyntaxError(f"missing {{% {ends[-1]} %}} before the end of the template", tok.line)
                return nodes
            if tok.kind == "data":
                self.i += 1
                nodes.append(self.node(_Data(tok.value), tok.line))
            elif tok.kind == "var_begin":
                self.i += 1
                nodes.append(self.node(_Output(self.tuple_()), tok.line))
                if self.cur.kind != "var_end":
                    self.error("expected end of expression '}}'")
                self.i += 1
            elif tok.kind == "block_begin":
                nxt = self.toks[self.i + 1]
                if nxt.kind == "name" and nxt.value in ends:
                    self.i += 1
                    return nodes
                self.i += 1
                nodes.append(self.statement())
            else:
                self.error("unexpected token")

    def end_tag(self) -> None:
        if self.cur.kind != "block_end":
            self.error("expected end of tag '%}'")
        self.i += 1

    def statement(self) -> _Node:
        tok = self.cur
        if tok.kind != "name":
            self.error("expected a statement name")
        self.i += 1
        handler = getattr(self, "stmt_" + tok.value, None)
        if handler is None:
            raise TemplateSyntaxError(f"the tag {{% {tok.value} %}} is not supported", tok.line)
        node = handler()
        node.line = tok.line
        return node

    def stmt_if(self) -> _Node:
        branches, other = [(self.tuple_(), None)], []
        self.end_tag()
        while True:
            branches[-1] = (branches[-1][0], self.body(_END_TAGS["if"]))
            tag = self.next().value
            if tag == "elif":
                branches.append((self.tuple_(), None))
                self.end_tag()
            elif tag == "else":
                self.end_tag()
                other = self.body(("endif",))
                self.next()
                self.end_tag()
                break
            else:
                self.end_tag()
                break
        return _If(branches, other)

    def stmt_for(self) -> _Node:
        target = self.tuple_(simple=True)
        self.expect_name("in")
        iterable = self.tuple_(with_cond=False)
        condition = self.expr() if self.skip_name("if") else None
        if self.skip_name("recursive"):
            raise TemplateSyntaxError("recursive for loops are not supported", self.cur.line)
        self.end_tag()
        body = self.body(_END_TAGS["for"])
        other = []
        if self.next().value == "else":
            self.end_tag()
            other = self.body(("endfor",))
            self.next()
        self.end_tag()
        return _For(target, iterable, condition, body, other)

    def stmt_set(self) -> _Node:
        line = self.cur.line
        target = self.set_target()
        if self.skip_op("="):
            value = self.tuple_()
            self.end_tag()
            return _Set(target, value, None, [])
        filters = self.filter_chain(line) if self.skip_op("|") else []
        self.end_tag()
        body = self.body(("endset",))
        self.next()
        self.end_tag()
        return _Set(target, None, body, filters)

    def filter_chain(self, line: int) -> list[_Filter]:
        """`f1(args) | f2 ...` as applied to a block's output (after a first `|`)."""
        chain = [self.filter_call(None, line)]
        while self.skip_op("|"):
            chain.append(self.filter_call(None, line))
        return chain

    def set_target(self) -> _Node:
        line = self.cur.line
        name = self.expect_name()
        if self.skip_op("."):
            return self.node(_Attr(_Name(name), self.expect_name()), line)
        if self.is_op(","):
            names = [_Name(name)]
            while self.skip_op(","):
                names.append(_Name(self.expect_name()))
            return self.node(_ListLit(names, "tuple"), line)
        return self.node(_Name(name), line)

    def params(self) -> list[tuple[str, _Node | None]]:
        params: list[tuple[str, _Node | None]] = []
        self.expect_op("(")
        while not self.is_op(")"):
            if params:
                self.expect_op(",")
            name = self.expect_name()
            params.append((name, self.expr() if self.skip_op("=") else None))
        self.expect_op(")")
        return params

    def stmt_macro(self) -> _Node:
        name = self.expect_name()
        params = self.params()
        self.end_tag()
        body = self.body(("endmacro",))
        self.next()
        if self.cur.kind == "name":
            self.i += 1  # {% endmacro name %}
        self.end_tag()
        return _MacroDef(name, params, body)

    def stmt_call(self) -> _Node:
        params = self.params() if self.is_op("(") else []
        call = self.expr()
        if not isinstance(call, _Call):
            self.error("{% call %} needs a macro call")
        self.end_tag()
        body = self.body(("endcall",))
        self.next()
        self.end_tag()
        return _CallBlock(call, params, body)  # type: ignore[arg-type]

    def stmt_filter(self) -> _Node:
        filters = self.filter_chain(self.cur.line)
        self.end_tag()
        body = self.body(("endfilter",))
        self.next()
        self.end_tag()
        return _FilterBlock(filters, body)

    def stmt_with(self) -> _Node:
        assignments: list[tuple[_Node, _Node]] = []
        while self.cur.kind != "block_end":
            if assignments:
                self.expect_op(",")
            target = self.set_target()
            self.expect_op("=")
            assignments.append((target, self.expr()))
        self.end_tag()
        body = self.body(("endwith",))
        self.next()
        self.end_tag()
        return _With(assignments, body)

    def stmt_generation(self) -> _Node:
        self.end_tag()
        body = self.body(("endgeneration",))
        self.next()
        self.end_tag()
        return _Transparent(body)

    def stmt_break(self) -> _Node:
        self.end_tag()
        return _Control("break")

    def stmt_continue(self) -> _Node:
        self.end_tag()
        return _Control("continue")


# --- rendering ----------------------------------------------------------------------

class _Ctx:
    """One rendering's state: the scope frames (innermost last), the output being
    written, and the counters the limits are checked against."""

    def __init__(self, frames: list[dict]):
        self.frames = frames
        self.out: list[str] = []
        self.size = 0
        self.iterations = 0
        self.depth = 0

    def lookup(self, name: str) -> Any:
        for frame in reversed(self.frames):
            if name in frame:
                return frame[name]
        return Undefined(f"{name!r} is undefined")

    def set(self, name: str, value: Any) -> None:
        self.frames[-1][name] = value

    def push(self) -> list[dict]:
        saved = self.frames
        self.frames = saved + [{}]
        return saved

    def pop(self, saved: list[dict]) -> None:
        self.frames = saved

    def assign(self, target: _Node, value: Any, line: int) -> None:
        if isinstance(target, _Name):
            self.set(target.name, value)
        elif isinstance(target, _Attr):
            ns = target.obj.ev(self)
            if not isinstance(ns, Namespace):
                raise TemplateRuntimeError("only namespace objects accept attribute assignment "
                                           f"(set {target.obj.name}.{target.name})", line)  # type: ignore
            ns.values[target.name] = value
        else:
            names = target.items  # type: ignore[attr-defined]
            if not isinstance(value, (list, tuple, str, dict)):
                raise TemplateRuntimeError(f"cannot unpack a {_type_name(value)} into names", line)
            values = list(value)
            if len(values) != len(names):
                raise TemplateRuntimeError(f"cannot unpack {len(values)} values into {len(names)} names", line)
            for name, item in zip(names, values):
                self.assign(name, item, line)

    def write(self, text: str) -> None:
        if text:
            self.size += len(text)
            if self.size > MAX_OUTPUT:
                raise TemplateRuntimeError(f"the rendering is longer than {MAX_OUTPUT} characters")
            self.out.append(text)

    def run(self, body: list) -> None:
        for node in body:
            try:
                node.run(self)
            except (TemplateRaised, _LoopControl):
                raise
            except TemplateError as exc:
                if exc.line is None:  # raised below any node that knew its line
                    raise type(exc)(str(exc), node.line) from None
                raise
            except RecursionError:
                raise TemplateRuntimeError("the template nests too deeply", node.line) from None
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError,
                    OverflowError) as exc:
                raise TemplateRuntimeError(f"{type(exc).__name__}: {exc}", node.line) from None

    def capture(self, body: list) -> str:
        saved = self.out
        self.out = []
        try:
            self.run(body)
            return _join(self.out)
        finally:
            self.out = saved

    def tick(self, line: int) -> None:
        self.iterations += 1
        if self.iterations > MAX_ITERATIONS:
            raise TemplateRuntimeError(f"the template ran more than {MAX_ITERATIONS} loop iterations", line)

    def call(self, fn: Any, args: list, kwargs: dict, line: int) -> Any:
        if isinstance(fn, Undefined):
            raise fn.fail(line)
        if isinstance(fn, _Macro):
            return self.call_macro(fn, args, kwargs, line)
        if isinstance(fn, _Builtin):
            try:
                return fn.fn(*args, **kwargs)
            except TemplateRaised:
                raise  # the template's own words, as Jinja gives them
            except TemplateError as exc:
                if exc.line is None:
                    raise type(exc)(str(exc), line) from None
                raise
            except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as exc:
                raise TemplateRuntimeError(f"{fn.name}() failed: {exc}", line) from None
        raise TemplateRuntimeError(f"{_type_name(fn)!r} object is not callable", line)

    def call_macro(self, macro: _Macro, args: list, kwargs: dict, line: int) -> str:
        if self.depth >= MAX_DEPTH:
            raise TemplateRuntimeError(f"macros nest deeper than {MAX_DEPTH} calls", line)
        local: dict[str, Any] = {}
        caller = kwargs.pop("caller", None)
        if caller is not None:
            if not macro.uses_caller:
                raise TemplateRuntimeError(f"macro {macro.name!r} was invoked with a caller it does not use", line)
            local["caller"] = caller
        names = [name for name, _ in macro.params]
        if len(args) > len(names):
            if not _mentions(macro.body, "varargs"):
                raise TemplateRuntimeError(f"macro {macro.name!r} takes not more than {len(names)} argument(s)", line)
        for name, value in zip(names, args):
            local[name] = value
        local["varargs"] = tuple(args[len(names):])
        extra = {}
        for name, value in kwargs.items():
            if name in names:
                if name in local:
                    raise TemplateRuntimeError(f"macro {macro.name!r} got multiple values for {name!r}", line)
                local[name] = value
            else:
                extra[name] = value
        if extra and not _mentions(macro.body, "kwargs"):
            raise TemplateRuntimeError(f"macro {macro.name!r} takes no keyword argument {next(iter(extra))!r}", line)
        local["kwargs"] = extra
        saved_frames, saved_out = self.frames, self.out
        # Names the macro does not bind resolve in the frames it was defined in.
        base = saved_frames[:next(i for i, f in enumerate(saved_frames) if f is macro.frame) + 1] \
            if any(f is macro.frame for f in saved_frames) else [*saved_frames[:1], macro.frame]
        self.frames = base + [local]
        for name, default in macro.params:
            if name not in local:
                local[name] = default.ev(self) if default is not None else Undefined(f"{name!r} is undefined")
        self.out = []
        self.depth += 1
        try:
            self.run(macro.body)
            return _join(self.out)
        except _LoopControl:
            raise TemplateRuntimeError("break or continue outside a loop", line) from None
        finally:
            self.depth -= 1
            self.frames, self.out = saved_frames, saved_out


class Template:
    """A parsed chat template. Parsing errors raise TemplateSyntaxError at construction."""

    def __init__(self, source: str):
        self.source = source
        toks = _lex(source)
        # Same tokens, same program: escapes and spacing inside tags do not change it.
        self.fingerprint = hashlib.sha256(repr([(t.kind, t.value) for t in toks]).encode()).hexdigest()
        try:
            self.body = _StatementParser(toks).template()
        except RecursionError:
            raise TemplateSyntaxError("the template nests expressions too deeply") from None

    def variables(self) -> set[str]:
        """The names the template reads (assignment and loop targets aside): what a
        caller's extra variables must be among to have any effect."""
        targets = {id(n) for node in _nodes(self.body) if isinstance(node, (_Set, _For))
                   for n in _nodes(node.target)}
        return {node.name for node in _nodes(self.body) if isinstance(node, _Name) and id(node) not in targets}

    def unsupported(self) -> list[str]:
        """Filters and tests the template names that this interpreter does not have
        (an error only when reached, as in Jinja), each with its line."""
        return [f"{kind} {node.name!r} (template line {node.line})" for node in _nodes(self.body)
                for kind, table in (("filter", FILTERS), ("test", TESTS))
                if type(node) is {"filter": _Filter, "test": _Test}[kind] and node.name not in table]

    def render(self, variables: dict[str, Any], clock: Callable[[], _dt.datetime] | None = None) -> str:
        """The rendering as a plain string; `clock` is what strftime_now reads (default: now)."""
        return str(self._render(variables, clock))

    def render_parts(self, variables: dict[str, Any], data: dict[str, Any],
                     clock: Callable[[], _dt.datetime] | None = None) -> list[tuple[str, int | None]]:
        """Render with `variables` (trusted, such as bos_token) and `data` (marked as the
        caller's data, such as messages); the output as (text, source) runs in order,
        source None for the template's own text, else the data's tag (0 if untagged)."""
        try:
            marked = {k: as_data(v) for k, v in data.items()}
        except RecursionError:
            raise TemplateRuntimeError("the input nests too deeply") from None
        out = self._render({**variables, **marked}, clock)
        runs: list[tuple[str, int | None]] = []
        at = 0
        for start, end, tag in _spans(out):
            if start > at:
                runs.append((str(out[at:start]), None))
            runs.append((str(out[start:end]), tag))
            at = end
        if at < len(out):
            runs.append((str(out[at:]), None))
        return runs

    def _render(self, variables: dict[str, Any], now: Callable[[], _dt.datetime] | None) -> str:
        clock = now or _dt.datetime.now
        globals_ = {
            "range": _Builtin("range", _range),
            "namespace": _Builtin("namespace", lambda *a, **k: Namespace(dict(*a, **k))),
            "dict": _Builtin("dict", lambda *a, **k: dict(*a, **k)),
            "raise_exception": _Builtin("raise_exception", _raise),
            "strftime_now": _Builtin("strftime_now", lambda fmt: clock().strftime(str(fmt))),
        }
        ctx = _Ctx([globals_, dict(variables)])
        try:
            ctx.run(self.body)
        except _LoopControl:
            raise TemplateRuntimeError("break or continue outside a loop") from None
        return _join(ctx.out)

    def literals(self) -> list[str]:
        """Every string the template itself can write: its text and string constants."""
        return [node.text if isinstance(node, _Data) else node.value for node in _nodes(self.body)
                if isinstance(node, _Data) or (isinstance(node, _Const) and isinstance(node.value, str))]


def _nodes(tree: Any) -> Iterable[_Node]:
    """Every node of a parsed body, depth first."""
    if isinstance(tree, (list, tuple)):
        for x in tree:
            yield from _nodes(x)
    elif isinstance(tree, _Node):
        yield tree
        for v in vars(tree).values():
            if isinstance(v, (list, tuple, _Node)):
                yield from _nodes(v)


def _range(*args: Any) -> list[int]:
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise TemplateRuntimeError(f"range() is longer than the limit of {MAX_RANGE}")
    return list(r)


def _raise(message: Any = "") -> Any:
    raise TemplateRaised(str(message))


# --- filters and tests --------------------------------------------------------------

def _require(value: Any) -> Any:
    if isinstance(value, Undefined):
        raise value.fail()
    return value


def _tojson(ctx: _Ctx, value: Any, ensure_ascii: bool = False, indent: Any = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    def default(o: Any) -> Any:
        if isinstance(o, Undefined):
            raise o.fail()
        raise TemplateRuntimeError(f"Object of type {type(o).__name__} is not JSON serializable")
    if isinstance(value, Undefined):
        raise value.fail()
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators is not None else None,
                      sort_keys=sort_keys, default=default)
    return _taint(text, value)


def _getter(ctx: _Ctx, attribute: Any, default: Any = None) -> Callable[[Any], Any]:
    if attribute is None:
        parts: list = []
    elif isinstance(attribute, str):
        parts = [int(p) if p.isdigit() else p for p in attribute.split(".")]
    else:
        parts = [attribute]

    def get(item: Any) -> Any:
        for part in parts:
            item = get_item(item, part)
            if default is not None and isinstance(item, Undefined):
                item = default
        return item
    return get


def _select(ctx: _Ctx, value: Any, args: tuple, kwargs: dict, by_attr: bool, keep: bool) -> list:
    args = list(args)
    get = (lambda x: x)
    if by_attr:
        if not args:
            raise TemplateRuntimeError("missing parameter for attribute name")
        get = _getter(ctx, args.pop(0))
    if args:
        name = args.pop(0)
        test = TESTS.get(name)
        if test is None:
            raise TemplateRuntimeError(f"test {name!r} is not supported")

        def check(item: Any) -> bool:
            return bool(test(item, *args, **kwargs))
    else:
        check = bool
    return _Lazy(item for item in (value or ()) if check(get(item)) == keep)


def _map(ctx: _Ctx, value: Any, *args: Any, **kwargs: Any) -> _Lazy:
    items = list(value or ())
    if "attribute" in kwargs or (not args and kwargs):
        get = _getter(ctx, kwargs.pop("attribute", None), kwargs.pop("default", None))
        if kwargs:
            raise TemplateRuntimeError(f"unexpected keyword argument {next(iter(kwargs))!r}")
        return _Lazy(get(item) for item in items)
    if not args:
        raise TemplateRuntimeError("map requires a filter name")
    name, rest = args[0], args[1:]
    fn = FILTERS.get(name)
    if fn is None:
        raise TemplateRuntimeError(f"filter {name!r} is not supported")
    return _Lazy(fn(ctx, item, *rest, **kwargs) for item in items)


def _ignore_case(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _sort(ctx: _Ctx, value: Any, reverse: bool = False, case_sensitive: bool = False,
          attribute: Any = None) -> list:
    get = _getter(ctx, attribute)

    def key(item: Any) -> Any:
        v = get(item)
        return v if case_sensitive else _ignore_case(v)
    return sorted(_require(value), key=key, reverse=reverse)


def _unique(ctx: _Ctx, value: Any, case_sensitive: bool = False, attribute: Any = None) -> _Lazy:
    get = _getter(ctx, attribute)
    seen, out = set(), []
    for item in _require(value):
        key = get(item)
        key = key if case_sensitive else _ignore_case(key)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return _Lazy(out)


def _dictsort(ctx: _Ctx, value: Any, case_sensitive: bool = False, by: str = "key",
              reverse: bool = False) -> list:
    if by not in ("key", "value"):
        raise TemplateRuntimeError('You can only sort by either "key" or "value"')
    pos = 0 if by == "key" else 1

    def key(item: tuple) -> Any:
        return item[pos] if case_sensitive else _ignore_case(item[pos])
    return sorted(_require(value).items(), key=key, reverse=reverse)


def _default(ctx: _Ctx, value: Any, default: Any = "", boolean: bool = False) -> Any:
    if isinstance(value, Undefined) or (boolean and not value):
        return default
    return value


def _join_filter(ctx: _Ctx, value: Any, d: str = "", attribute: Any = None) -> str:
    items = list(_require(value))
    if attribute is not None:
        items = [_getter(ctx, attribute)(x) for x in items]
    return _join_with(_to_str(d), [_to_str(x) for x in items])


def _first(ctx: _Ctx, value: Any) -> Any:
    for item in _require(value):
        return item
    return Undefined("no first item, sequence was empty")


def _last(ctx: _Ctx, value: Any) -> Any:
    if isinstance(value, _Lazy):
        raise TemplateRuntimeError(f"'{value.kind}' object is not reversible")
    items = list(_require(value))
    return items[-1] if items else Undefined("no last item, sequence was empty")


def _list(ctx: _Ctx, value: Any) -> list:
    if isinstance(value, dict):
        return list(value.keys())
    if isinstance(value, str):
        return [_slice(value, i, i + 1) for i in range(len(value))]
    return list(_require(value))


def _length(ctx: _Ctx, value: Any) -> int:
    if isinstance(value, (str, list, tuple, dict, Undefined)):
        return len(value)
    raise TemplateRuntimeError(f"object of type {_type_name(value)!r} has no len()")


def _int(ctx: _Ctx, value: Any, default: int = 0, base: int = 10) -> int:
    try:
        if isinstance(value, str):
            return int(str(value), base)
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def _float(ctx: _Ctx, value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _round(ctx: _Ctx, value: Any, precision: int = 0, method: str = "common") -> float:
    import math
    if method == "common":
        return round(value, precision)
    if method not in ("ceil", "floor"):
        raise TemplateRuntimeError("method must be common, ceil or floor")
    func = math.ceil if method == "ceil" else math.floor
    return func(value * (10 ** precision)) / (10 ** precision)


def _str_filter(method: str) -> Callable[..., str]:
    fn = _str_method(method)
    assert fn is not None
    return lambda ctx, value, *a, **k: fn(_to_str(value), *a, **k)


def _capitalize(ctx: _Ctx, value: Any) -> str:
    s = _to_str(value)
    return _taint(s[:1].upper() + s[1:].lower(), s)


_WORD_SPLIT = re.compile(r"([-\s({\[<]+)")


def _title(ctx: _Ctx, value: Any) -> str:
    s = _to_str(value)
    return _taint("".join(item[0].upper() + item[1:].lower() for item in _WORD_SPLIT.split(s) if item), s)


def _indent(ctx: _Ctx, value: Any, width: Any = 4, first: bool = False, blank: bool = False) -> str:
    s = _to_str(value)
    _check_width(width)
    indention = width if isinstance(width, str) else " " * width
    lines = (s + "\n").splitlines()
    if blank:
        rv = ("\n" + indention).join(lines)
    else:
        rv = lines.pop(0)
        if lines:
            rv += "\n" + "\n".join(indention + line if line else line for line in lines)
    if first:
        rv = indention + rv
    return _taint(rv, s, indention)


def _replace(ctx: _Ctx, value: Any, old: Any, new: Any, count: Any = None) -> str:
    s = _to_str(value)
    result = s.replace(str(old), str(new), -1 if count is None else count)
    return _taint(result, s, new)


def _items(ctx: _Ctx, value: Any) -> _Lazy:
    if isinstance(value, Undefined):
        return _Lazy(())
    if not isinstance(value, dict):
        raise TemplateRuntimeError(f"can only get item pairs from a mapping, not {_type_name(value)}")
    return _Lazy(value.items())


def _min_max(pick: Callable) -> Callable[..., Any]:
    def run(ctx: _Ctx, value: Any, case_sensitive: bool = False, attribute: Any = None) -> Any:
        items = list(_require(value))
        if not items:
            return Undefined("no items in an empty sequence")
        get = _getter(ctx, attribute)
        return pick(items, key=lambda x: get(x) if case_sensitive else _ignore_case(get(x)))
    return run


def _format(ctx: _Ctx, value: Any, *args: Any, **kwargs: Any) -> str:
    if args and kwargs:
        raise TemplateRuntimeError("can't handle positional and keyword arguments at the same time")
    s = _to_str(value)
    _check_format(s, _PERCENT_WIDTH)
    return _taint(s % (kwargs or args), s, list(args), kwargs)


def _batch(ctx: _Ctx, value: Any, linecount: int, fill_with: Any = None) -> list:
    out, tmp = [], []
    for item in _require(value):
        if len(tmp) == linecount:
            out.append(tmp)
            tmp = []
        tmp.append(item)
    if tmp:
        if fill_with is not None and len(tmp) < linecount:
            tmp += [fill_with] * (linecount - len(tmp))
        out.append(tmp)
    return out


FILTERS: dict[str, Callable[..., Any]] = {
    "abs": lambda ctx, v: abs(_require(v)),
    "attr": lambda ctx, v, name: get_attr(v, name),
    "batch": _batch,
    "capitalize": _capitalize,
    "center": lambda ctx, v, width=80: _check_width(width) or _taint(_to_str(v).center(width), v),
    "count": _length,
    "d": _default,
    "default": _default,
    "dictsort": _dictsort,
    "e": lambda ctx, v: _html_escape(v),
    "escape": lambda ctx, v: _html_escape(v),
    "first": _first,
    "float": _float,
    "format": _format,
    "indent": _indent,
    "int": _int,
    "items": _items,
    "join": _join_filter,
    "last": _last,
    "length": _length,
    "list": _list,
    "lower": _str_filter("lower"),
    "map": _map,
    "max": _min_max(max),
    "min": _min_max(min),
    "reject": lambda ctx, v, *a, **k: _select(ctx, v, a, k, False, False),
    "rejectattr": lambda ctx, v, *a, **k: _select(ctx, v, a, k, True, False),
    "replace": _replace,
    "reverse": lambda ctx, v: _taint(_require(v)[::-1], v) if isinstance(v, str) else _Lazy(
        reversed(list(_require(v))), "list_reverseiterator"),
    "round": _round,
    "safe": lambda ctx, v: _mark_safe(_to_str(v)),
    "select": lambda ctx, v, *a, **k: _select(ctx, v, a, k, False, True),
    "selectattr": lambda ctx, v, *a, **k: _select(ctx, v, a, k, True, True),
    "sort": _sort,
    "string": lambda ctx, v: _to_str(v),  # a safe string stays safe, as Jinja's soft_str
    "sum": lambda ctx, v, attribute=None, start=0: sum((_getter(ctx, attribute)(x) for x in _require(v)), start),
    "title": _title,
    "tojson": _tojson,
    "trim": _str_filter("strip"),
    "unique": _unique,
    "upper": _str_filter("upper"),
    "wordcount": lambda ctx, v: len(re.findall(r"\w+", _to_str(v))),
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, Undefined)


def _is_sequence(v: Any) -> bool:
    return isinstance(v, (str, list, tuple, dict, Undefined))


TESTS: dict[str, Callable[..., bool]] = {
    "boolean": lambda v: v is True or v is False,
    "callable": lambda v: isinstance(v, (_Macro, _Builtin)),
    "defined": lambda v: not isinstance(v, Undefined),
    "divisibleby": lambda v, n: v % n == 0,
    "eq": lambda v, o: v == o, "equalto": lambda v, o: v == o, "==": lambda v, o: v == o,
    "escaped": _is_safe,
    "even": lambda v: v % 2 == 0,
    "false": lambda v: v is False,
    "float": lambda v: isinstance(v, float),
    "ge": lambda v, o: _compare(">=", v, o, 0), ">=": lambda v, o: _compare(">=", v, o, 0),
    "gt": lambda v, o: _compare(">", v, o, 0), ">": lambda v, o: _compare(">", v, o, 0),
    "greaterthan": lambda v, o: _compare(">", v, o, 0),
    "in": lambda v, seq: _compare("in", v, seq, 0),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "iterable": lambda v: isinstance(v, (str, list, tuple, dict, Undefined)),
    "le": lambda v, o: _compare("<=", v, o, 0), "<=": lambda v, o: _compare("<=", v, o, 0),
    "lower": lambda v: _to_str(v).islower(),
    "lt": lambda v, o: _compare("<", v, o, 0), "<": lambda v, o: _compare("<", v, o, 0),
    "lessthan": lambda v, o: _compare("<", v, o, 0),
    "mapping": lambda v: isinstance(v, dict),
    "ne": lambda v, o: v != o, "!=": lambda v, o: v != o,
    "none": lambda v: v is None,
    "number": _is_number,
    "odd": lambda v: v % 2 == 1,
    "sameas": lambda v, o: v is o,
    "sequence": _is_sequence,
    "string": lambda v: isinstance(v, str),
    "true": lambda v: v is True,
    "undefined": lambda v: isinstance(v, Undefined),
    "upper": lambda v: _to_str(v).isupper(),
}
