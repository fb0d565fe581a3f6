"""The grammar a request's output must follow, for constrained decoding: the
response_format (json_object, json_schema) of chat and completions, and the tool
calls of chat (tool_choice "auto", "required" or a named function).

Tool calls are written in a tool_calls.CallLayout: by default the Hermes layout
tool_calls.py streams (OPEN_TAG CALL_HEAD name CALL_ARGUMENTS arguments CALL_TAIL CLOSE_TAG), for
Llama 3.x its JSON reply (after <|python_tag|> for 3.1 and 3.3), for gpt-oss a message
to functions.NAME, for Mistral, Phi-4 and Gemma 4 their [TOOL_CALLS], <|tool_call|> and
<|tool_call> layouts, for Qwen3-Coder its XML; the arguments follow the tool's
parameters schema, spelled as the layout says (JSON, Gemma 4's call syntax, XML
parameters: _ARGUMENTS); no string in them spells one of the layout's `ends`, the
markers where its parser would end the arguments early. Where a layout's marker is a
control token of the model (`controls`), the grammar writes that one token
(llmd.structured.grammar.token), never the marker's spelling in text bytes. With
parallel_tool_calls, more calls may follow, each after the layout's separator (which
may also end the answer). "required" starts with a call; a named function allows only
that function; "auto" lets the model first write text, any text without the layout's
opening (the call, if any, starts there, unless the layout's calls must open the
reply), or the response format when one is given.

A request's grammar is named by its spec (chat_spec, completion_spec: the parts of
the request it depends on, as JSON text) and compiled by compile_spec, which keeps
the CACHE_SIZE most recently used grammars by spec: a repeated schema costs nothing,
a new one milliseconds, a huge one seconds (so the server compiles on a thread of
its own, llmd.api.grammar_queue, and takes cached grammars at once). A schema outside
the supported subset (llmd/structured/jsonschema.py) is a 400 naming the keyword,
before any response byte.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from typing import Any, Callable, Protocol, Sequence

from llmd import errors
from llmd.prompt import reasoning
from llmd.prompt.tool_calls import GEMMA_QUOTE, HERMES_LAYOUT, CallLayout
from llmd.structured.grammar import (
    EMPTY, Expr, GrammarError, GrammarTooLarge, accepts_text, alt, compile_grammar, lit, one_of, opt, repeat, seq,
    star, text_without, token,
)
from llmd.structured.jsonschema import (
    GemmaSchemaCompiler, GlmParameterCompiler, MarkedJsonCompiler, SchemaCompiler, SchemaError, XmlParameterCompiler,
)


# What constrained decoding reads of a validated request (llmd.api.validation's
# ChatRequest, CompletionRequest, ResponseFormat and Tool have these fields).
class ResponseFormat(Protocol):
    type: str                          # "text" | "json_object" | "json_schema"
    schema: Any                        # json_schema: the JSON Schema


class Tool(Protocol):
    name: str
    parameters: dict | None            # its arguments' JSON Schema


class CompletionRequest(Protocol):
    response_format: ResponseFormat | None


class ChatRequest(CompletionRequest, Protocol):
    tools: Sequence[Tool]
    tool_choice: str                   # "none" | "auto" | "required"
    tool_name: str | None              # the one function tool_choice names, if any
    parallel_tool_calls: bool


CACHE_SIZE = 64
_BLANKS_AFTER_THINKING = 4
_cache: OrderedDict[str, str] = OrderedDict()  # spec -> grammar text, the least recently used first
_cache_lock = threading.Lock()  # lookups on the event loop, compiles on the grammar thread


def chat_spec(req: ChatRequest, layout: CallLayout = HERMES_LAYOUT,
              controls: dict[str, int] | None = None, thinking: bool = False) -> str | None:
    """The spec of a chat request's grammar, or None when its output is free; calls in
    `layout` (templates.call_layout of the model's template). `controls`: the strings of
    the layout that are control tokens of the model, with their ids (Mistral's
    [TOOL_CALLS], Phi-4's <|tool_call|>); the grammar writes those as the token. With
    `thinking` (the prompt leaves a reasoning block open: templates.reasoning_start), the
    model thinks freely first; what the request constrains follows the block's close."""
    tools = [[t.name, t.parameters] for t in req.tools] if req.tool_choice != "none" else []
    if req.tool_name is not None:
        tools = [t for t in tools if t[0] == req.tool_name]
    fmt = _format_key(req.response_format)
    if fmt is None and not tools:
        return None
    indexes = {t.name: i for i, t in enumerate(req.tools)}
    key = {"format": fmt, "tools": tools, "indexes": [indexes[name] for name, _ in tools],
           "required": req.tool_choice == "required", "parallel": req.parallel_tool_calls,
           "layout": dataclasses.astuple(layout), "controls": sorted((controls or {}).items()),
           "thinking": thinking}
    return json.dumps(key)


def completion_spec(req: CompletionRequest) -> str | None:
    """The spec of a completion request's grammar, or None when its output is free."""
    fmt = _format_key(req.response_format)
    if fmt is None:
        return None
    return json.dumps({"format": fmt, "tools": [], "indexes": [], "required": False, "parallel": False,
                       "layout": dataclasses.astuple(HERMES_LAYOUT), "controls": [], "thinking": False})


def cached(spec: str) -> str | None:
    """The spec's grammar text if it is compiled already (a use: it stays cached longer)."""
    with _cache_lock:
        if (text := _cache.get(spec)) is not None:
            _cache.move_to_end(spec)
        return text


def compile_spec(spec: str) -> str:
    """The spec's grammar text, compiled unless cached (ApiError 400 for a schema it
    cannot follow); the server runs it on its grammar thread."""
    if (text := cached(spec)) is None:
        text = _compile(spec)
        with _cache_lock:
            _cache[spec] = text
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return text


def chat_grammar(req: ChatRequest, layout: CallLayout = HERMES_LAYOUT,
                 controls: dict[str, int] | None = None, thinking: bool = False) -> str | None:
    """A chat request's grammar text (chat_spec, compiled here), None when its output is free."""
    spec = chat_spec(req, layout, controls, thinking)
    return None if spec is None else compile_spec(spec)


def completion_grammar(req: CompletionRequest) -> str | None:
    """A completion request's grammar text, None when its output is free."""
    spec = completion_spec(req)
    return None if spec is None else compile_spec(spec)


def _format_key(rf: ResponseFormat | None) -> Any:
    if rf is None or rf.type == "text":
        return None
    return {"object": True} if rf.type == "json_object" else {"schema": rf.schema}


def _written(text: str, controls: dict[str, int]) -> Expr:
    """text as the model writes it: each control token's string in it as that token,
    the rest as bytes."""
    items, at = [], 0
    while at < len(text):
        found = min(((text.find(c, at), c) for c in controls if text.find(c, at) >= 0), default=None)
        if found is None:
            items.append(lit(text[at:]))
            break
        start, control = found
        items += [lit(text[at:start])] if start > at else []
        items.append(token(controls[control]))
        at = start + len(control)
    return seq(*items) if items else EMPTY


# How each CallLayout.arguments spelling compiles a tool's parameters schema: a
# SchemaCompiler over (rules, rule-name prefix, the layout's control tokens, its ends).
_ARGUMENTS: dict[str, Callable[[dict[str, Expr], str, dict[str, int], tuple[str, ...]], SchemaCompiler]] = {
    "json": lambda rules, prefix, controls, ends:
        MarkedJsonCompiler(rules, prefix, ends) if ends else SchemaCompiler(rules, prefix),
    "gemma4": lambda rules, prefix, controls, ends: GemmaSchemaCompiler(
        rules, prefix, _written(GEMMA_QUOTE, controls), ends),
    "xml": lambda rules, prefix, controls, ends: XmlParameterCompiler(rules, prefix, ends),
    "glm": lambda rules, prefix, controls, ends: GlmParameterCompiler(
        rules, prefix, ends, lambda text: _written(text, controls)),
}


def _compile(key: str) -> str:
    spec = json.loads(key)
    rules: dict[str, Expr] = {}
    fmt = None
    if spec["format"] is not None:
        compiler = SchemaCompiler(rules, "format:")
        if spec["format"].get("object"):
            fmt = compiler.any_object()
        else:
            fmt = _schema(compiler, spec["format"]["schema"], "response_format.json_schema.schema")
    calls = None
    layout = CallLayout(*spec["layout"])
    controls = dict(spec["controls"])
    if spec["tools"]:
        blocks = []
        for (name, parameters), index in zip(spec["tools"], spec["indexes"]):
            param = f"tools[{index}].function.parameters"
            if parameters and parameters.get("type", "object") != "object":
                raise errors.invalid_request("A tool's parameters must describe an object.", param)
            compiler = _ARGUMENTS[layout.arguments](rules, f"tool{index}:", controls, tuple(layout.ends))
            args = _schema(compiler, _object_schema(parameters), param)
            blocks.append(seq(_written(layout.head + name + layout.between, controls), args,
                              _written(layout.tail, controls)))
        block = alt(*blocks)
        if spec["parallel"]:  # a separator may also end the answer: a newline is no promise of a call
            separator = _written(layout.separator, controls)
            calls = seq(block, star(seq(separator, block)), opt(separator))
        else:
            calls = block
    if calls is None:
        rules["root"] = fmt
    elif spec["required"]:
        rules["root"] = calls
    else:
        free = fmt if fmt is not None else text_without((layout.opens,))
        rules["root"] = seq(free, opt(calls)) if fmt is None and layout.after_text else alt(free, calls)
    if spec["thinking"]:  # the reasoning, its close and the few blanks models put after it ("\n\n")
        rules["root"] = seq(text_without((reasoning.CLOSE,)), _written(reasoning.CLOSE, controls),
                            repeat(one_of(" \n"), 0, _BLANKS_AFTER_THINKING), rules["root"])
    param = "tools" if calls is not None else "response_format.json_schema.schema"
    try:
        return compile_grammar(rules, "root")
    except GrammarTooLarge as exc:
        raise errors.unsupported_parameter(
            param, f"The schema is too large to constrain output to: {exc}.") from None
    except GrammarError as exc:
        raise errors.invalid_request(f"The schema cannot constrain output: {exc}.", param) from None


def _object_schema(parameters: dict | None) -> Any:
    """Tool parameters as a schema of an object: none means any object."""
    if not parameters:
        return {"type": "object"}
    if "type" not in parameters and not {"$ref", "anyOf", "oneOf", "allOf"} & parameters.keys():
        return {**parameters, "type": "object"}
    return parameters


def _schema(compiler: SchemaCompiler, schema: Any, param: str) -> Expr:
    try:
        expr = compiler.compile_root(schema)
    except SchemaError as exc:
        if exc.unsupported:
            raise errors.unsupported_parameter(param, f"{exc} for constrained output.") from None
        raise errors.invalid_request(f"Invalid schema: {exc}.", param) from None
    # (also for a tool that "auto" may leave uncalled: a call to it could never end)
    if not accepts_text(compiler.rules, expr):
        raise errors.invalid_request("Invalid schema: no finite value satisfies it (a part it requires "
                                     "contains itself without end).", param)
    return expr
