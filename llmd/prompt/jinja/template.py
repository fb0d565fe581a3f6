"""`Template`: a chat template parsed once, rendered as text or as runs that say which
characters came from the caller's data, with the globals templates may call."""

from __future__ import annotations

import datetime as _dt
import hashlib
from typing import Any, Callable

from llmd.prompt.jinja.filters import FILTERS, TESTS
from llmd.prompt.jinja.lexer import _lex
from llmd.prompt.jinja.parser import _StatementParser
from llmd.prompt.jinja.runtime import (_Const, _Ctx, _Data, _Filter, _For, _LoopControl, _Name, _nesting, _nodes,
                                       _Set, _Test)
from llmd.prompt.jinja import values  # the limits, read at each check (tests lower them)
from llmd.prompt.jinja.values import (as_data, _Builtin, _join, Namespace, _spans, TemplateRaised,
                                      TemplateRuntimeError, TemplateSyntaxError)


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
        # A flat chain (a + b + ... of a thousand terms) parses in a loop, yet nests as deep:
        # every walk of the tree, and the rendering, would recurse that far.
        if _nesting(self.body) > values.MAX_NESTING:
            raise TemplateSyntaxError(f"the template nests more than {values.MAX_NESTING} levels deep")

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
        ctx = _Ctx([globals_, dict(variables)], FILTERS, TESTS)
        try:
            ctx.run(self.body)
        except _LoopControl:
            raise TemplateRuntimeError("break or continue outside a loop") from None
        return _join(ctx.out)

    def literals(self) -> list[str]:
        """Every string the template itself can write: its text and string constants."""
        return [node.text if isinstance(node, _Data) else node.value for node in _nodes(self.body)
                if isinstance(node, _Data) or (isinstance(node, _Const) and isinstance(node.value, str))]


def _range(*args: Any) -> list[int]:
    r = range(*args)
    if len(r) > values.MAX_RANGE:
        raise TemplateRuntimeError(f"range() is longer than the limit of {values.MAX_RANGE}")
    return list(r)


def _raise(message: Any = "") -> Any:
    raise TemplateRaised(str(message))
