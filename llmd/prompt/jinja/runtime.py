"""The parsed tree and how it runs: expression and statement nodes, each evaluating
itself in a `_Ctx`, the state of one rendering (scope frames, output, the counters
the limits are checked against, and the filters and tests it may call)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from llmd.prompt.jinja import values  # the limits, read at each check (tests lower them)
from llmd.prompt.jinja.values import (_Builtin, _check_format, get_attr, get_item, _html_escape, _is_safe,
                                      _join, _Lazy, _Loop, _Macro, _mark_safe, Namespace, _PERCENT_WIDTH,
                                      _slice, _taint, TemplateError, TemplateRaised, TemplateRuntimeError,
                                      _to_str, _type_name, Undefined)


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
        elif op == "*" and isinstance(a, (str, list)) and isinstance(b, int) and len(a) * b > values.MAX_OUTPUT:
            raise TemplateRuntimeError("a repeated string or list is longer than the output limit", self.line)
        elif op == "*" and isinstance(b, (str, list)) and isinstance(a, int) and len(b) * a > values.MAX_OUTPUT:
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
        fn = ctx.filters.get(self.name)
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
        fn = ctx.tests.get(self.name)
        if fn is None:
            raise TemplateRuntimeError(f"test {self.name!r} is not supported", self.line)
        value = self.value.ev(ctx)
        try:
            result = bool(fn(value, *[a.ev(ctx) for a in self.args]))
        except (TypeError, ValueError) as exc:
            raise TemplateRuntimeError(f"test {self.name!r} failed: {exc}", self.line) from None
        return not result if self.negated else result


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


class _Ctx:
    """One rendering's state: the scope frames (innermost last), the output being
    written, the counters the limits are checked against, and the filters and tests
    (by name) the template may call."""

    def __init__(self, frames: list[dict], filters: dict[str, Callable[..., Any]],
                 tests: dict[str, Callable[..., bool]]):
        self.frames = frames
        self.filters, self.tests = filters, tests
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
            if self.size > values.MAX_OUTPUT:
                raise TemplateRuntimeError(f"the rendering is longer than {values.MAX_OUTPUT} characters")
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
        if self.iterations > values.MAX_ITERATIONS:
            raise TemplateRuntimeError(f"the template ran more than {values.MAX_ITERATIONS} loop iterations", line)

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
        if self.depth >= values.MAX_DEPTH:
            raise TemplateRuntimeError(f"macros nest deeper than {values.MAX_DEPTH} calls", line)
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


def _nesting(tree: Any) -> int:
    """How many levels (nodes and lists) a parsed body has, counted without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        t, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(t, (list, tuple)):
            stack.extend((x, level + 1) for x in t)
        elif isinstance(t, _Node):
            stack.extend((v, level + 1) for v in vars(t).values() if isinstance(v, (list, tuple, _Node)))
    return deepest


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
