"""The filters and tests templates may use, each as Jinja2 defines it."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from llmd.prompt.jinja.runtime import _compare, _Ctx
from llmd.prompt.jinja.values import (_Builtin, _check_format, _check_width, get_attr, get_item, _html_escape,
                                      _is_safe, _join_with, _Lazy, _Macro, _mark_safe, _PERCENT_WIDTH, _slice,
                                      _str_method, _taint, TemplateRuntimeError, _to_str, _type_name,
                                      Undefined)


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
