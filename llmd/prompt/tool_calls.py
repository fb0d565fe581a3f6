"""Tool calls in model output: the Hermes `<tool_call>{json}</tool_call>` convention,
and each family's own format (`call_stream` by the name templates.tool_format gives).

Theory of operation. The model answers with text in which each call is a block

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A block is a call when its body is a JSON object whose `name` is one of the declared
tools and whose `arguments` is an object (or a JSON string holding one; missing means
{}), or Qwen3-Coder's XML body (`<function=NAME>` with `<parameter=P>` values), or
GLM-4.5's (NAME, then `<arg_key>` and `<arg_value>` pairs). Any other block, and a
block never closed, stays in the content as written.
Whitespace between content and a call block is layout, not content, and is dropped.

`ToolCallStream` works on text deltas for SSE: text outside blocks is released at
once, except a tail that could still become a block (trailing whitespace, a partial
`<tool_call>`). A block written exactly in the layout that constrained decoding
produces (CALL_HEAD, a declared name, CALL_ARGUMENTS, an object; llmd/structured/constrain.py)
is a call as soon as its name is known, and its arguments stream as they come: a
small JSON scanner finds where the object ends, and the rest up to `</tool_call>`
is layout. Any other block is held until its closing tag and then released as one
tool call with its full arguments, or as content when invalid. `parse_tool_calls`
runs the same machine over the whole text, so streamed and non-streamed answers agree.

Other families: Llama 3.x's JSON reply or <|python_tag|> (`JsonReplyCallStream`), and
formats whose calls a marker opens (`MarkedCallStream`: Mistral's [TOOL_CALLS], Gemma
4's <|tool_call>, Granite's <|tool_call|>, Phi-4's <|tool_call|> ... <|/tool_call|>,
Nemotron Nano v2's <TOOLCALL> ... </TOOLCALL>).
Both read Hermes blocks too (Granite's calls are constrained as those). Qwen3-Coder's
and GLM-4.5's XML blocks are Hermes blocks with other bodies. gpt-oss's channels are
llmd.prompt.harmony's.
Each family's CallLayout (below) is how constrained decoding writes its calls; the
family's parser reads back whatever that grammar allows.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Union

from llmd.prompt.text import partial_suffix

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
# The layout of a constrained call: OPEN_TAG CALL_HEAD name CALL_ARGUMENTS {...}
# CALL_TAIL CLOSE_TAG, and CALL_SEPARATOR between parallel calls.
CALL_HEAD = '\n{"name": "'
CALL_ARGUMENTS = '", "arguments": '
CALL_TAIL = "}\n"
CALL_SEPARATOR = "\n"


@dataclass(frozen=True)
class ContentDelta:
    """Text for `delta.content`."""

    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of tool call `index`: the first piece carries the call's `id` and
    `name` (later pieces None), every piece a part of the arguments JSON text."""

    index: int
    id: str | None
    name: str | None
    arguments: str

    def to_openai_delta(self) -> dict[str, Any]:
        """The entry for a streamed `delta.tool_calls` list."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


ToolEvent = Union[ContentDelta, ToolCallDelta]


def merge_tool_calls(events: Iterable[ToolEvent]) -> list[dict[str, Any]]:
    """The OpenAI `tool_calls` entries that the ToolCallDelta pieces add up to."""
    calls: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            if e.id is not None:
                calls[e.index] = {"id": e.id, "type": "function",
                                  "function": {"name": e.name, "arguments": ""}}
            calls[e.index]["function"]["arguments"] += e.arguments
    return list(calls.values())


def new_call_id() -> str:
    """A fresh OpenAI-style call id: `call_` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def new_mistral_call_id() -> str:
    """A call id Mistral's templates accept when it is sent back: 9 letters and digits."""
    return "".join(secrets.choice(_ALNUM) for _ in range(9))


def tool_names(tools: Iterable[dict[str, Any]] | None) -> frozenset[str]:
    """Names of the declared function tools, OpenAI-shaped or flat {name, ...} records."""
    return frozenset(t.get("function", t)["name"] for t in tools or ())


def string_params(tools: Iterable[dict[str, Any]] | None) -> frozenset[tuple[str, str]]:
    """(tool, parameter) pairs whose schema type is "string": an XML call's value for
    them stays text even when it looks like JSON ("01234")."""
    pairs = set()
    for tool in tools or ():
        function = tool.get("function", tool)
        properties = (function.get("parameters") or {}).get("properties") or {}
        pairs.update((function["name"], p) for p, schema in properties.items()
                     if isinstance(schema, dict) and schema.get("type") == "string")
    return frozenset(pairs)


def decode_call(body: str, names: frozenset[str],
                strings: frozenset[tuple[str, str]] = frozenset()) -> tuple[str, str] | None:
    """(name, arguments JSON) for a valid block body, else None. The body is a JSON
    object, or Qwen3-Coder's XML: <function=NAME> then <parameter=P>VALUE</parameter>
    each, then </function>; or GLM-4.5's: NAME, then <arg_key>P</arg_key> and
    <arg_value>VALUE</arg_value> each. A VALUE is read as JSON unless `strings` says it
    is text."""
    try:
        call = json.loads(body)
    except ValueError:
        call = _xml_call(body, strings) or _glm_call(body, strings)
    return _call_of(call, names)


def _xml_value(name: str, key: str, value: str, strings: frozenset[tuple[str, str]]) -> Any:
    """A parameter's VALUE as an XML call writes it: text for a string parameter, else
    JSON where it reads as JSON."""
    if (name, key) in strings:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
_XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>\s*", re.S)


def _xml_call(body: str, strings: frozenset[tuple[str, str]]) -> dict[str, Any] | None:
    function = _XML_FUNCTION.fullmatch(body)
    if function is None:
        return None
    name, rest, arguments, pos = function.group(1), function.group(2), {}, 0
    while pos < len(rest):
        parameter = _XML_PARAMETER.match(rest, pos)
        if parameter is None:
            return None if rest[pos:].strip() else {"name": name, "arguments": arguments}
        arguments[parameter.group(1)] = _xml_value(name, parameter.group(1), parameter.group(2), strings)
        pos = parameter.end()
    return {"name": name, "arguments": arguments}


GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_GLM_NAME = re.compile(r"\s*([^<>\n]+?)\s*(?=<|$)")
_GLM_ARGUMENT = re.compile(r"\s*<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.S)


def _glm_call(body: str, strings: frozenset[tuple[str, str]]) -> dict[str, Any] | None:
    head = _GLM_NAME.match(body)
    if head is None:
        return None
    name, arguments, pos = head.group(1), {}, head.end()
    while pos < len(body):
        argument = _GLM_ARGUMENT.match(body, pos)
        if argument is None:
            return None
        arguments[argument.group(1)] = _xml_value(name, argument.group(1), argument.group(2), strings)
        pos = argument.end()
    return {"name": name, "arguments": arguments}


def _call_of(call: Any, names: frozenset[str]) -> tuple[str, str] | None:
    """(name, arguments JSON) of a decoded call object naming a declared tool, with its
    arguments under "arguments" (Hermes) or "parameters" (Llama 3.x), else None."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    if call["name"] not in names:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return call["name"], json.dumps(arguments, ensure_ascii=False)


class _ObjectScanner:
    """Finds where a JSON object ends in text fed piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> int:
        """How much of text belongs to the object: len(text), or up to and
        including the brace that closes it."""
        for i, c in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return len(text)


class ToolCallStream:
    """Incremental tool-call parser: `feed` text deltas, then `finish` once."""

    def __init__(self, tools: Iterable[dict[str, Any]] | None,
                 new_id: Callable[[], str] = new_call_id) -> None:
        self._names = tool_names(tools)
        self._strings = string_params(tools)
        self._new_id = new_id
        self._buf = ""          # outside: held-back tail; inside: the block's unread text
        self._mode = "outside"  # or, inside a block: head, arguments, tail, held
        self._scanner = _ObjectScanner()
        self._lead_ws = ""      # whitespace before the open block, dropped if it is a call
        self._after_call = False
        self.calls = 0          # tool calls begun so far

    def feed(self, text: str) -> list[ToolEvent]:
        """Events that `text` makes certain; consecutive content is merged."""
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[ToolEvent]:
        """Release everything still held: an unclosed block that did not start a
        call becomes content; a call cut short keeps the arguments it streamed."""
        return self._drain(final=True)

    def _head(self) -> str | None:
        """For a block in the constrained layout, its tool name once the arguments
        begin; "" while the text so far may still be one; None if it is not."""
        buf, head = self._buf, CALL_HEAD
        if not buf.startswith(head):
            return "" if head.startswith(buf) else None
        end = buf.find('"', len(head))
        if end < 0:
            name = buf[len(head):]
            return "" if any(n.startswith(name) for n in self._names) else None
        name, rest = buf[len(head):end], buf[end:]
        if name not in self._names:
            return None
        opening = CALL_ARGUMENTS + "{"
        if not rest.startswith(opening):
            return "" if opening.startswith(rest) else None
        return name

    def _drain(self, final: bool) -> list[ToolEvent]:
        events: list[ToolEvent] = []

        def content(text: str) -> None:
            if not text:
                return
            if events and isinstance(events[-1], ContentDelta):
                events[-1] = ContentDelta(events[-1].text + text)
            else:
                events.append(ContentDelta(text))

        while True:
            if self._mode == "head":
                name = self._head()
                if name is None:
                    self._mode = "held"
                elif name:
                    self._buf = self._buf[len(CALL_HEAD) + len(name) + len(CALL_ARGUMENTS):]
                    self._scanner = _ObjectScanner()
                    events.append(ToolCallDelta(self.calls, self._new_id(), name, ""))
                    self.calls += 1
                    self._mode = "arguments"
                elif final:
                    self._mode = "held"
                else:
                    return events
                continue

            if self._mode == "arguments":
                n = self._scanner.feed(self._buf)
                if n:
                    events.append(ToolCallDelta(self.calls - 1, None, None, self._buf[:n]))
                self._buf = self._buf[n:]
                if self._scanner.depth > 0:
                    if final:
                        self._buf, self._mode = "", "outside"
                    return events
                self._mode = "tail"
                continue

            if self._mode == "tail":  # layout up to the closing tag
                end = self._buf.find(CLOSE_TAG)
                if end < 0:
                    if final:
                        self._buf, self._mode = "", "outside"
                    else:
                        self._buf = self._buf[max(0, len(self._buf) - len(CLOSE_TAG)):]
                    return events
                self._buf = self._buf[end + len(CLOSE_TAG):]
                self._mode, self._after_call = "outside", True
                continue

            if self._mode == "held":
                end = self._buf.find(CLOSE_TAG)
                if end < 0:
                    if final:
                        content(self._lead_ws + OPEN_TAG + self._buf)
                        self._buf, self._mode = "", "outside"
                    return events
                body, self._buf = self._buf[:end], self._buf[end + len(CLOSE_TAG):]
                self._mode = "outside"
                call = decode_call(body, self._names, self._strings)
                if call is None:
                    content(self._lead_ws + OPEN_TAG + body + CLOSE_TAG)
                    self._after_call = False
                else:
                    events.append(ToolCallDelta(self.calls, self._new_id(), *call))
                    self.calls += 1
                    self._after_call = True
                continue

            if self._after_call:
                stripped = self._buf.lstrip()
                if not stripped:
                    self._buf = ""
                    return events
                self._buf, self._after_call = stripped, False

            start = self._buf.find(OPEN_TAG)
            if start >= 0:
                before = self._buf[:start]
                kept = before.rstrip()
                content(kept)
                self._lead_ws = before[len(kept):]
                self._buf, self._mode = self._buf[start + len(OPEN_TAG):], "head"
                continue

            if final:
                content(self._buf)
                self._buf = ""
                return events
            cut = len(self._buf) - partial_suffix(self._buf, OPEN_TAG)
            while cut > 0 and self._buf[cut - 1].isspace():
                cut -= 1
            content(self._buf[:cut])
            self._buf = self._buf[cut:]
            return events


class JsonReplyCallStream:
    """Tool calls written as a JSON reply. Llama 3.x: an object {"name": <tool>,
    "parameters": {...}} (or several, separated by ';'), as the Llama 3.1-3.3 templates
    ask, or what follows <|python_tag|> (python_tag_calls). A reply starting with "{"
    is held to its end, then becomes calls when all of it is calls of declared tools;
    any other reply is read as one the tag may mark (MarkedCallStream): text before the
    tag streams as content through the Hermes parser, which also reads `<tool_call>`
    blocks, and what follows the tag is held to the end of the reply."""

    def __init__(self, tools: Iterable[dict[str, Any]] | None, new_id: Callable[[], str] = new_call_id) -> None:
        self._names = tool_names(tools)
        self._new_id = new_id
        self._tagged = MarkedCallStream(tools, PYTHON_TAG, python_tag_calls, new_id=new_id)
        self._held = ""
        self._mode = "start"  # start, json (held), tagged

    def feed(self, text: str) -> list[ToolEvent]:
        if self._mode == "tagged":
            return self._tagged.feed(text)
        self._held += text
        if self._mode == "start":
            head = self._held.lstrip()
            if not head:
                return []
            if not head.startswith("{"):
                self._mode, held, self._held = "tagged", self._held, ""
                return self._tagged.feed(held)
            self._mode = "json"
        return []

    def finish(self) -> list[ToolEvent]:
        held, self._held = self._held, ""
        calls = _json_calls(held, self._names) if self._mode == "json" else None
        if calls is None:  # text that merely starts with "{" may still hold a tagged call
            return self._tagged.feed(held) + self._tagged.finish()
        return [ToolCallDelta(i, self._new_id(), name, arguments) for i, (name, arguments) in enumerate(calls)]


def _json_calls(text: str, names: frozenset[str]) -> list[tuple[str, str]] | None:
    """The calls a reply of JSON call objects or arrays of them (separated by whitespace
    or ';') makes; None unless all of it is calls."""
    decoder, calls, pos = json.JSONDecoder(), [], 0
    text = text.strip()
    while pos < len(text):
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return None
        for item in obj if isinstance(obj, list) and obj else [obj]:
            call = _call_of(item, names)
            if call is None:
                return None
            calls.append(call)
        while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
            pos += 1
    return calls or None


# A call a decoder read: (name, arguments JSON, the id the model wrote or None).
Call = tuple[str, str, Union[str, None]]


class MarkedCallStream:
    """Tool calls that a family's marker opens: Mistral's `[TOOL_CALLS]`, Gemma 4's
    `<|tool_call>` ... `<tool_call|>`, Granite's `<|tool_call|>`. Text before the marker
    streams as content through the Hermes parser (which also reads the blocks
    constrained decoding writes). From the marker on, text is held up to `end` (without
    one, to the end of the output), then `decode(body, names)` reads it: calls of
    declared tools, or None, and then the block is content as written. Whitespace
    around calls is layout."""

    def __init__(self, tools: Iterable[dict[str, Any]] | None, start: str,
                 decode: Callable[[str, frozenset[str]], list[Call] | None], end: str | None = None,
                 new_id: Callable[[], str] = new_call_id) -> None:
        self._names = tool_names(tools)
        self._start, self._end, self._decode, self._new_id = start, end, decode, new_id
        self._hermes = ToolCallStream(tools, new_id)
        self._held = ""         # outside: a tail that may begin the marker; inside: the block so far
        self._inside = False
        self._lead_ws = ""      # whitespace before the marker, content again if the block is not calls
        self._after_call = False

    def feed(self, text: str) -> list[ToolEvent]:
        self._held += text
        return self._drain(final=False)

    def finish(self) -> list[ToolEvent]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[ToolEvent]:
        events: list[ToolEvent] = []
        while True:
            if self._after_call:
                self._held = self._held.lstrip()
                if not self._held and not final:
                    return events
                self._after_call = False
            if not self._inside:
                at = self._held.find(self._start)
                if at < 0:
                    cut = len(self._held)
                    if not final:  # hold what may begin the marker, and whitespace that may precede it
                        cut -= partial_suffix(self._held, self._start)
                        while cut > 0 and self._held[cut - 1].isspace():
                            cut -= 1
                    events += self._hermes.feed(self._held[:cut])
                    self._held = self._held[cut:]
                    return events + (self._hermes.finish() if final else [])
                before = self._held[:at]
                kept = before.rstrip()
                events += self._hermes.feed(kept) + self._hermes.finish()  # what precedes a block is complete
                self._lead_ws, self._held, self._inside = before[len(kept):], self._held[at + len(self._start):], True
            stop = self._held.find(self._end) if self._end else -1
            if stop < 0 and not final:
                return events
            body = self._held if stop < 0 else self._held[:stop]
            self._held = "" if stop < 0 else self._held[stop + len(self._end or ""):]
            self._inside = False
            calls = self._decode(body, self._names)
            if calls is None:
                events.append(ContentDelta(self._lead_ws + self._start + body + (self._end if stop >= 0 else "")))
            else:
                for name, arguments, call_id in calls:
                    events.append(ToolCallDelta(self._hermes.calls, call_id or self._new_id(), name, arguments))
                    self._hermes.calls += 1
                self._after_call = True
            if final and not self._held:
                return events + self._hermes.finish()


MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def mistral_calls(body: str, names: frozenset[str]) -> list[Call] | None:
    """The calls after Mistral's [TOOL_CALLS]: `name[ARGS]{...}` (Mistral Small 3.x,
    Magistral, Devstral; Small 3.2 puts `[CALL_ID]id` before [ARGS]), each call opened
    by [TOOL_CALLS] again, or Nemo's JSON array of {"name", "arguments"} objects."""
    calls: list[Call] = []
    for segment in body.split(MISTRAL_CALLS):
        segment = segment.strip()
        if segment.startswith(("[", "{")):
            found = _json_calls(segment, names)
            if found is None:
                return None
            calls += [(name, arguments, None) for name, arguments in found]
            continue
        head, sep, arguments = segment.partition(MISTRAL_ARGS)
        name, _, call_id = head.partition(MISTRAL_CALL_ID)
        try:
            call = _call_of({"name": name.strip(), "arguments": json.loads(arguments)}, names) if sep else None
        except ValueError:
            return None
        if call is None:
            return None
        call_id = call_id.strip()
        calls.append((*call, call_id if len(call_id) == 9 and call_id.isalnum() and call_id.isascii() else None))
    return calls or None


GEMMA_CALL, GEMMA_CALL_END, GEMMA_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'


def gemma_calls(body: str, names: frozenset[str]) -> list[Call] | None:
    """One Gemma 4 call: `call:NAME{key:value,...}`, where a string is written between
    <|"|> marks and keys, numbers, booleans and null bare."""
    if not body.startswith("call:"):
        return None
    brace = body.find("{")
    if brace < 0:
        return None
    try:
        arguments, end = _gemma_value(body, brace)
    except (ValueError, IndexError):
        return None
    if body[end:].strip():
        return None
    call = _call_of({"name": body[len("call:"):brace], "arguments": arguments}, names)
    return None if call is None else [(*call, None)]


def _gemma_value(text: str, pos: int) -> tuple[Any, int]:
    """The value at text[pos] in Gemma 4's call syntax, and where it ends."""
    if text.startswith(GEMMA_QUOTE, pos):
        end = text.index(GEMMA_QUOTE, pos + len(GEMMA_QUOTE))
        return text[pos + len(GEMMA_QUOTE):end], end + len(GEMMA_QUOTE)
    if text[pos] in "{[":
        close = "}" if text[pos] == "{" else "]"
        items: dict[str, Any] | list[Any] = {} if close == "}" else []
        pos += 1
        while text[pos] != close:
            if isinstance(items, dict):
                if text.startswith(GEMMA_QUOTE, pos):
                    key, pos = _gemma_value(text, pos)
                else:
                    colon = text.index(":", pos)
                    key, pos = text[pos:colon].strip(), colon
                if text[pos] != ":":
                    raise ValueError("a key without a value")
                items[key], pos = _gemma_value(text, pos + 1)
            else:
                value, pos = _gemma_value(text, pos)
                items.append(value)
            if text[pos] == ",":
                pos += 1
            elif text[pos] != close:
                raise ValueError("items not separated by commas")
        return items, pos + 1
    end = pos
    while end < len(text) and text[end] not in ",}]":
        end += 1
    bare = text[pos:end].strip()
    try:
        return json.loads(bare), end
    except ValueError:
        return bare, end


PYTHON_TAG = "<|python_tag|>"


def python_tag_calls(body: str, names: frozenset[str]) -> list[Call] | None:
    """What Llama 3.1 writes after <|python_tag|>: JSON calls, a built-in tool's
    `name.call(arg="value", ...)`, or code for a declared `python` / `code_interpreter`
    tool (its arguments then {"code": ...}). JSON calls may each be opened by the tag
    again."""
    body = body.strip()
    if PYTHON_TAG in body:
        segments = [_json_calls(segment, names) for segment in body.split(PYTHON_TAG)]
        if any(found is None for found in segments):
            return None
        return [(name, arguments, None) for found in segments for name, arguments in found]
    found = _json_calls(body, names)
    if found is not None:
        return [(name, arguments, None) for name, arguments in found]
    call = _pythonic_call(body, names)
    if call is not None:
        return [(*call, None)]
    for name in ("python", "code_interpreter"):
        if name in names and body:
            return [(name, json.dumps({"code": body}, ensure_ascii=False), None)]
    return None


def _pythonic_call(body: str, names: frozenset[str]) -> tuple[str, str] | None:
    """`name.call(k=literal, ...)` as (name, arguments JSON); the literals are read by
    ast.literal_eval, nothing is executed."""
    try:
        tree = ast.parse(body, mode="eval").body
        if not (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr == "call"
                and isinstance(tree.func.value, ast.Name) and not tree.args):
            return None
        arguments = {k.arg: ast.literal_eval(k.value) for k in tree.keywords if k.arg is not None}
        if len(arguments) != len(tree.keywords):
            return None
        return _call_of({"name": tree.func.value.id, "arguments": arguments}, names)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


TAGGED_CALLS, TAGGED_CALLS_END = "<|tool_call|>", "<|/tool_call|>"
PHI4_TOOLS = "<|tool|>"  # where Phi-4's system turn declares its tools


def json_list_calls(end: str) -> Callable[[str, frozenset[str]], list[Call] | None]:
    """The reader of what follows a marker: a JSON list of {"name", "arguments"} calls,
    or one such object, closed by `end` where the model writes one (Phi-4 and Nemotron
    Nano v2 do, Granite does not)."""
    def calls(body: str, names: frozenset[str]) -> list[Call] | None:
        body = body.strip()
        if body.endswith(end):
            body = body[:-len(end)]
        found = _json_calls(body, names)
        return None if found is None else [(name, arguments, None) for name, arguments in found]
    return calls


tagged_json_calls = json_list_calls(TAGGED_CALLS_END)  # <|tool_call|> blocks
# Nemotron Nano v2: <TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>
NEMOTRON_CALLS, NEMOTRON_CALLS_END = "<TOOLCALL>", "</TOOLCALL>"


@dataclass(frozen=True)
class CallLayout:
    """How constrained decoding writes a call (llmd/structured/constrain.py): `head`, the tool's
    name, `between`, the arguments, `tail`; `separator` between parallel calls (it may
    also end the answer). Free text before a call may not contain `opens`; without
    `after_text`, calls only open the reply (the parser reads no call after text). The
    arguments are spelled as `arguments` says: "json" (an object), "gemma4" (Gemma 4's
    call syntax, gemma_calls), "xml" (Qwen3-Coder's <parameter=P> elements) or "glm"
    (GLM-4.5's <arg_key>/<arg_value> pairs); no string in them spells one of `ends`, the
    markers at which the family's parser would end the arguments or the call (empty
    where it reads JSON to its closing brace)."""

    opens: str
    head: str
    between: str
    tail: str
    separator: str
    arguments: str = "json"
    after_text: bool = True
    ends: tuple[str, ...] = ()


HERMES_LAYOUT = CallLayout(OPEN_TAG, OPEN_TAG + CALL_HEAD, CALL_ARGUMENTS, CALL_TAIL + CLOSE_TAG, CALL_SEPARATOR)
# Llama 3.x: the JSON reply their templates ask for, the whole reply (JsonReplyCallStream
# reads JSON only at its start); parallel calls separated by ';'.
LLAMA3_LAYOUT = CallLayout('{"name": "', '{"name": "', '", "parameters": ', "}", "; ", after_text=False)
# Mistral Small 3.x, Magistral, Devstral: [TOOL_CALLS]name[ARGS]{...}, each call opened again.
MISTRAL_LAYOUT = CallLayout(MISTRAL_CALLS, MISTRAL_CALLS, MISTRAL_ARGS, "", "", ends=(MISTRAL_CALLS,))
# Mistral Nemo: [TOOL_CALLS] then a JSON array (one call per array here).
MISTRAL_NEMO_LAYOUT = CallLayout(MISTRAL_CALLS, MISTRAL_CALLS + '[{"name": "', '", "arguments": ', "}]", "",
                                 ends=(MISTRAL_CALLS,))
# Phi-4: each call a closed <|tool_call|> block holding a JSON list.
PHI4_LAYOUT = CallLayout(TAGGED_CALLS, TAGGED_CALLS + '[{"name": "', '", "arguments": ', "}]" + TAGGED_CALLS_END, "",
                         ends=(TAGGED_CALLS_END,))
# Nemotron Nano v2: the same, between <TOOLCALL> and </TOOLCALL>.
NEMOTRON_LAYOUT = CallLayout(NEMOTRON_CALLS, NEMOTRON_CALLS + '[{"name": "', '", "arguments": ',
                             "}]" + NEMOTRON_CALLS_END, "", ends=(NEMOTRON_CALLS_END,))
# Gemma 4: <|tool_call>call:NAME{key:value,...}<tool_call|>, each call a block of its own.
GEMMA4_LAYOUT = CallLayout(GEMMA_CALL, GEMMA_CALL + "call:", "", GEMMA_CALL_END, "", "gemma4",
                           ends=(GEMMA_QUOTE, GEMMA_CALL_END))
# Qwen3-Coder (and Qwen3.5): a Hermes block around <function=NAME> and its <parameter=P> elements.
XML_PARAMETER_END = "</parameter>"
QWEN3_CODER_LAYOUT = CallLayout(OPEN_TAG, OPEN_TAG + "\n<function=", ">\n", "</function>\n" + CLOSE_TAG,
                                CALL_SEPARATOR, "xml", ends=(XML_PARAMETER_END, CLOSE_TAG))
# GLM-4.5 and 4.6: a Hermes block around NAME and its <arg_key>/<arg_value> pairs, as their template writes one.
GLM_LAYOUT = CallLayout(OPEN_TAG, OPEN_TAG, "\n", CLOSE_TAG, CALL_SEPARATOR, "glm", ends=(GLM_VALUE_END, CLOSE_TAG))



# Each tool format by name (templates.tool_format): the strings its calls are written with,
# the one that opens a call first. Where they are control tokens, the output parser
# must see them as text.
FORMAT_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": (),
    "llama3_json": (PYTHON_TAG,),
    "mistral": (MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID),
    "gemma4": (GEMMA_CALL, GEMMA_CALL_END, GEMMA_QUOTE),
    "tagged_json": (TAGGED_CALLS, TAGGED_CALLS_END),
    "phi4": (TAGGED_CALLS, TAGGED_CALLS_END),
    "nemotron": (NEMOTRON_CALLS, NEMOTRON_CALLS_END),
    "qwen3_coder": (),
    "glm": (OPEN_TAG, CLOSE_TAG, GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END),  # control tokens in GLM-4.5
}


def call_stream(tool_format: str, tools: Iterable[dict[str, Any]] | None, new_id: Callable[[], str] | None = None
                ) -> ToolCallStream | JsonReplyCallStream | MarkedCallStream:
    """The incremental parser of a tool format named in FORMAT_MARKERS; `new_id` makes
    the ids of calls the model wrote none for (new_call_id, Mistral's new_mistral_call_id)."""
    ids = new_id or new_call_id
    if tool_format in ("hermes", "qwen3_coder", "glm"):  # the Hermes parser reads their three bodies
        return ToolCallStream(tools, ids)
    if tool_format == "llama3_json":
        return JsonReplyCallStream(tools, ids)
    if tool_format == "mistral":
        return MarkedCallStream(tools, MISTRAL_CALLS, mistral_calls, new_id=new_id or new_mistral_call_id)
    if tool_format == "gemma4":
        return MarkedCallStream(tools, GEMMA_CALL, gemma_calls, GEMMA_CALL_END, ids)
    if tool_format == "tagged_json":
        return MarkedCallStream(tools, TAGGED_CALLS, tagged_json_calls, new_id=ids)
    if tool_format == "phi4":  # each block closed, so text and more blocks may follow
        return MarkedCallStream(tools, TAGGED_CALLS, tagged_json_calls, TAGGED_CALLS_END, ids)
    if tool_format == "nemotron":
        return MarkedCallStream(tools, NEMOTRON_CALLS, json_list_calls(NEMOTRON_CALLS_END), NEMOTRON_CALLS_END, ids)
    raise ValueError(f"unknown tool format {tool_format!r}")


def parse_tool_calls(text: str, tools: Iterable[dict[str, Any]] | None,
                     new_id: Callable[[], str] = new_call_id
                     ) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a finished answer into (content, OpenAI `tool_calls` entries).

    With no valid call, content is `text` unchanged and the list is empty. With calls,
    content is the text outside them, or None when that is empty.
    """
    stream = ToolCallStream(tools, new_id)
    events = stream.feed(text) + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = merge_tool_calls(events)
    if calls and not content:
        return None, calls
    return content, calls
