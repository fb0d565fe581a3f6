"""Grammars for constrained decoding: expressions over bytes, compiled into the
automaton text the engine reads (llmd_session_set_grammar; the format is described
in native/src/decode/grammar.h).

Theory of operation. A grammar is a mapping of rule names to expressions over
bytes: `Chars` (a set of bytes), `Seq`, `Alt`, `Repeat` (bounded or not) and `Ref`
(another rule, by name), and `token(id)` for one control token: it writes no bytes
(so no byte expression can produce it), and the engine lets the model write exactly
that token id there. Rules may be recursive but not left-recursive (the engine
refuses that). `compile_grammar` turns every rule reachable from the root into a
deterministic automaton: Thompson construction gives an NFA whose edges read a
byte set or call a rule, and subset construction over the byte classes the rule
uses makes it deterministic. A `Ref` becomes a call edge: enter the callee's start
state, continue at the return state once the callee accepts; the engine keeps the
return states on a stack. So only recursion needs a rule of its own: whatever is
inlined in one rule (strings, numbers, literals, bounded repeats) costs the engine
one table lookup per byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Union

MAX_STATES = 50_000       # automaton states over all rules
MAX_NFA_NODES = 400_000   # Thompson nodes of one rule, checked while building


class GrammarError(ValueError):
    """The grammar cannot be compiled: an undefined rule or left recursion."""


class GrammarTooLarge(GrammarError):
    """The grammar would exceed MAX_STATES or MAX_NFA_NODES."""


# --- expressions -----------------------------------------------------------------

@dataclass(frozen=True)
class Chars:
    """One input symbol out of a set: bit b of `mask` set means byte b matches (b <
    256), bit 256 + id that control token id does (`token`)."""
    mask: int

    def __or__(self, other: Chars) -> Chars:
        return Chars(self.mask | other.mask)

    def __sub__(self, other: Chars) -> Chars:
        return Chars(self.mask & ~other.mask)


@dataclass(frozen=True)
class Seq:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Repeat:
    item: Expr
    min: int
    max: int | None  # None: no upper bound


@dataclass(frozen=True)
class Ref:
    name: str


Expr = Union[Chars, Seq, Alt, Repeat, Ref]

_BYTES = 256  # symbols below are bytes, from here on control token ids
ANY_BYTE = Chars((1 << _BYTES) - 1)
EMPTY = Seq(())


def byte_range(lo: int, hi: int) -> Chars:
    """Bytes lo..hi inclusive."""
    return Chars(((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1))


def one_of(data: bytes | str) -> Chars:
    """Any one of the given bytes (a str is taken as ASCII)."""
    raw = data.encode("ascii") if isinstance(data, str) else data
    mask = 0
    for b in raw:
        mask |= 1 << b
    return Chars(mask)


def token(token_id: int) -> Chars:
    """The control token token_id, written as that one token."""
    if token_id < 0:
        raise ValueError(f"bad token id {token_id}")
    return Chars(1 << (_BYTES + token_id))


def lit(text: str | bytes) -> Expr:
    """Exactly these bytes (a str is UTF-8)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return seq(*(Chars(1 << b) for b in raw))


def seq(*items: Expr) -> Expr:
    return items[0] if len(items) == 1 else Seq(tuple(items))


def alt(*items: Expr) -> Expr:
    return items[0] if len(items) == 1 else Alt(tuple(items))


def opt(item: Expr) -> Expr:
    return Repeat(item, 0, 1)


def star(item: Expr) -> Expr:
    return Repeat(item, 0, None)


def repeat(item: Expr, lo: int, hi: int | None) -> Expr:
    """lo to hi copies of item (hi None: no limit)."""
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"bad repeat bounds {lo}..{hi}")
    return Repeat(item, lo, hi)


def text_without(markers: Iterable[str], unit: Chars = ANY_BYTE, wide: Expr | None = None) -> Expr:
    """Any text in which none of `markers` occurs: a sequence of single bytes out of
    `unit` and of `wide` items (multi-byte characters, when given). The markers are
    ASCII and begin with one byte that recurs in none of them.

    Cut at each occurrence of that first byte: what follows a cut up to the next one
    must not begin with the rest of any marker, so it is a proper prefix of such a
    rest, possibly followed by a unit that breaks every match and then anything."""
    markers = tuple(markers)
    first = markers[0][:1]
    rests = {m[1:] for m in markers}
    assert all(m[:1] == first and first not in m[1:] and m.isascii() for m in markers), \
        "the construction needs ASCII markers sharing a first byte that does not recur in them"
    free = unit - one_of(first)

    def units(single: Chars) -> Expr:
        return single if wide is None else alt(single, wide)

    pieces = []
    for prefix in dict.fromkeys(r[:k] for r in sorted(rests) for k in range(len(r))):
        if prefix.startswith(tuple(rests)):
            continue  # a whole marker already: nothing may continue it
        following = one_of("".join(r[len(prefix)] for r in rests if r.startswith(prefix) and len(r) > len(prefix)))
        pieces.append(seq(lit(prefix), opt(seq(units(free - following), star(units(free))))))
    return seq(star(units(free)), star(seq(lit(first), alt(*pieces))))


# --- compilation -------------------------------------------------------------------

class _Nfa:
    """Thompson construction for one rule: nodes with ε edges, byte-set edges and
    call edges (rule name, node to continue at when the callee accepts)."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int]]] = []
        self.calls: list[list[tuple[str, int]]] = []

    def node(self) -> int:
        if len(self.eps) >= MAX_NFA_NODES:
            raise GrammarTooLarge(f"a rule needs more than {MAX_NFA_NODES} automaton nodes")
        self.eps.append([])
        self.edges.append([])
        self.calls.append([])
        return len(self.eps) - 1

    def build(self, expr: Expr, start: int) -> int:
        """Add expr starting at node start; return its end node."""
        if isinstance(expr, Chars):
            end = self.node()
            if expr.mask:
                self.edges[start].append((expr.mask, end))
            return end
        if isinstance(expr, Seq):
            for item in expr.items:
                start = self.build(item, start)
            return start
        if isinstance(expr, Alt):
            end = self.node()
            for item in expr.items:
                begin = self.node()
                self.eps[start].append(begin)
                self.eps[self.build(item, begin)].append(end)
            return end
        if isinstance(expr, Repeat):
            for _ in range(expr.min):
                start = self.build(expr.item, start)
            if expr.max is None:
                loop = self.node()
                self.eps[start].append(loop)
                self.eps[self.build(expr.item, loop)].append(loop)
                return loop
            end = self.node()
            for _ in range(expr.max - expr.min):
                self.eps[start].append(end)
                start = self.build(expr.item, start)
            self.eps[start].append(end)
            return end
        if isinstance(expr, Ref):
            end = self.node()
            self.calls[start].append((expr.name, end))
            return end
        raise TypeError(f"not a grammar expression: {expr!r}")

    def closure(self, nodes: Iterable[int]) -> frozenset[int]:
        stack = list(nodes)
        seen = set(stack)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)


@dataclass
class _DState:
    accept: bool
    moves: dict[int, int]            # target DFA state -> byte mask
    calls: list[tuple[str, int]]     # (rule, target DFA state)


def _atoms(masks: Iterable[int]) -> list[int]:
    """The coarsest partition of the bytes in masks such that every mask is a union of parts."""
    atoms: list[int] = []
    for m in dict.fromkeys(masks):
        refined, covered = [], 0
        for a in atoms:
            covered |= a
            if a & m:
                refined.append(a & m)
            if a & ~m:
                refined.append(a & ~m)
        if m & ~covered:
            refined.append(m & ~covered)
        atoms = refined
    return atoms


def _determinize(nfa: _Nfa, start: int, final: int, budget: int) -> list[_DState]:
    first = nfa.closure([start])
    ids: dict[frozenset[int], int] = {first: 0}
    sets = [first]
    states: list[_DState] = []

    def state_of(nodes: frozenset[int]) -> int:
        if nodes not in ids:
            if len(sets) >= budget:
                raise GrammarTooLarge(f"the grammar needs more than {MAX_STATES} states")
            ids[nodes] = len(sets)
            sets.append(nodes)
        return ids[nodes]

    while len(states) < len(sets):
        current = sets[len(states)]
        moves = [edge for n in current for edge in nfa.edges[n]]
        by_target: dict[int, int] = {}
        for atom in _atoms(m for m, _ in moves):
            target = state_of(nfa.closure(t for m, t in moves if m & atom))
            by_target[target] = by_target.get(target, 0) | atom
        returns: dict[str, list[int]] = {}
        for n in current:
            for rule, t in nfa.calls[n]:
                returns.setdefault(rule, []).append(t)
        calls = [(rule, state_of(nfa.closure(ts))) for rule, ts in returns.items()]
        states.append(_DState(final in current, by_target, calls))
    return states


def _minimize(states: list[_DState]) -> list[_DState]:
    """Merge states with the same future (Moore's partition refinement); state 0 stays first.

    Thompson and subset construction leave many twins (the copies of a string inside
    each property, say); merging them shrinks what the engine holds and walks."""
    block = [int(st.accept) for st in states]
    count = len(set(block))
    while True:
        signatures: dict[tuple, int] = {}
        refined = []
        for s, st in enumerate(states):
            moves: dict[int, int] = {}
            for target, mask in st.moves.items():
                moves[block[target]] = moves.get(block[target], 0) | mask
            key = (block[s], tuple(sorted(moves.items())), tuple(sorted((r, block[t]) for r, t in st.calls)))
            refined.append(signatures.setdefault(key, len(signatures)))
        block = refined
        if len(signatures) == count:
            break
        count = len(signatures)
    order = {b: i for i, b in enumerate(dict.fromkeys(block))}  # first seen first: state 0 keeps id 0
    merged: list[_DState | None] = [None] * len(order)
    for s, st in enumerate(states):
        b = order[block[s]]
        if merged[b] is None:
            moves = {}
            for target, mask in st.moves.items():
                moves[order[block[target]]] = moves.get(order[block[target]], 0) | mask
            merged[b] = _DState(st.accept, moves, [(r, order[block[t]]) for r, t in st.calls])
    return merged


def _token_ids(mask: int) -> list[int]:
    """The control token ids in mask."""
    ids, rest = [], mask >> _BYTES
    while rest:
        low = rest & -rest
        ids.append(low.bit_length() - 1)
        rest ^= low
    return ids


def _runs(mask: int) -> list[tuple[int, int]]:
    """The byte ranges (lo, hi) making up mask."""
    runs, b, mask = [], 0, mask & ANY_BYTE.mask
    while mask >> b:
        if mask >> b & 1:
            lo = b
            while mask >> (b + 1) & 1:
                b += 1
            runs.append((lo, b))
        b += 1
    return runs


def _derives(expr: Expr, rules_derive: Mapping[str, bool], empty: bool) -> bool:
    """Whether expr derives a finite text (the empty text, if `empty`), given which
    rules do."""
    if isinstance(expr, Chars):
        return not empty and expr.mask != 0
    if isinstance(expr, Seq):
        return all(_derives(item, rules_derive, empty) for item in expr.items)
    if isinstance(expr, Alt):
        return any(_derives(item, rules_derive, empty) for item in expr.items)
    if isinstance(expr, Repeat):
        return expr.min == 0 or _derives(expr.item, rules_derive, empty)
    return rules_derive[expr.name]


def _rules_deriving(rules: Mapping[str, Expr], names: list[str], empty: bool) -> dict[str, bool]:
    """Which of the rules derive a finite text (the empty text, if `empty`)."""
    derive = dict.fromkeys(names, False)
    changed = True
    while changed:
        changed = False
        for name in names:
            if not derive[name] and _derives(rules[name], derive, empty):
                derive[name] = changed = True
    return derive


def accepts_text(rules: Mapping[str, Expr], expr: Expr) -> bool:
    """Whether expr, over `rules`, matches any finite text."""
    return _derives(expr, _rules_deriving(rules, list(rules), empty=False), empty=False)


def _nullable(expr: Expr, rules_nullable: Mapping[str, bool]) -> bool:
    return _derives(expr, rules_nullable, True)


def _first_calls(expr: Expr, rules_nullable: Mapping[str, bool]) -> set[str]:
    """Rules that expr may call before reading a byte."""
    if isinstance(expr, Chars):
        return set()
    if isinstance(expr, Seq):
        found: set[str] = set()
        for item in expr.items:
            found |= _first_calls(item, rules_nullable)
            if not _nullable(item, rules_nullable):
                break
        return found
    if isinstance(expr, Alt):
        return set().union(*(_first_calls(item, rules_nullable) for item in expr.items))
    if isinstance(expr, Repeat):
        return _first_calls(expr.item, rules_nullable) if expr.max != 0 else set()
    return {expr.name}


def _check_left_recursion(rules: Mapping[str, Expr], names: list[str]) -> None:
    """Raise GrammarError if a rule can call itself again before reading a byte."""
    nullable = _rules_deriving(rules, names, empty=True)
    calls = {name: _first_calls(rules[name], nullable) for name in names}
    done: set[str] = set()
    for top in names:
        path, stack = [top], [iter(calls[top])]
        while stack:  # depth-first, iterative: rule chains may be long
            callee = next(stack[-1], None)
            if callee is None:
                done.add(path.pop())
                stack.pop()
            elif callee in path:
                raise GrammarError(f"grammar rule {callee!r} is left-recursive")
            elif callee not in done:
                path.append(callee)
                stack.append(iter(calls[callee]))


def compile_grammar(rules: Mapping[str, Expr], root: str) -> str:
    """The automaton text of the grammar `rules` starting at rule `root`.

    Raises GrammarTooLarge past the size limits and GrammarError for a Ref to an
    undefined rule, left recursion, or a grammar that accepts no finite text."""
    order, index, dfas, total = [root], {root: 0}, [], 0
    if root not in rules:
        raise GrammarError(f"undefined grammar rule {root!r}")
    while len(dfas) < len(order):
        nfa = _Nfa()
        start = nfa.node()
        final = nfa.build(rules[order[len(dfas)]], start)
        dfa = _minimize(_determinize(nfa, start, final, MAX_STATES - total))
        for st in dfa:
            for rule, _ in st.calls:
                if rule not in rules:
                    raise GrammarError(f"undefined grammar rule {rule!r}")
                if rule not in index:
                    index[rule] = len(order)
                    order.append(rule)
        dfas.append(dfa)
        total += len(dfa)
    _check_left_recursion(rules, order)
    if not _rules_deriving(rules, order, empty=False)[root]:
        raise GrammarError("it accepts no finite text (a part it requires contains itself without end)")

    bases = [0]
    for dfa in dfas:
        bases.append(bases[-1] + len(dfa))
    lines = [f"llmd-grammar 1 {total} 0"]
    for base, dfa in zip(bases, dfas):
        for st in dfa:
            ranges = sorted((lo, hi, base + target) for target, mask in st.moves.items()
                            for lo, hi in _runs(mask))
            items = ["$"] if st.accept else []
            items += [f"{lo:02x}>{t}" if lo == hi else f"{lo:02x}-{hi:02x}>{t}" for lo, hi, t in ranges]
            items += [f"t{i}>{base + target}" for target, mask in st.moves.items() for i in _token_ids(mask)]
            items += [f"@{bases[index[rule]]}>{base + target}" for rule, target in st.calls]
            lines.append(" ".join(items))
    return "\n".join(lines) + "\n"
