"""Tokens -> the tree of runtime nodes: expressions by precedence, then statements
(if, for, set, macro, call, filter, with, generation blocks)."""

from __future__ import annotations

from llmd.prompt.jinja.lexer import _Tok
from llmd.prompt.jinja.runtime import (_Attr, _Binary, _Call, _CallBlock, _Compare, _Cond, _Const, _Control,
                                       _Data, _DictLit, _Filter, _FilterBlock, _For, _If, _Item, _ListLit,
                                       _MacroDef, _Name, _Node, _Output, _Set, _Slice, _Test, _Transparent,
                                       _Unary, _With)
from llmd.prompt.jinja.values import TemplateSyntaxError


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
