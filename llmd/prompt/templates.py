"""Chat templates: turn an OpenAI `messages` list into the prompt a model was trained on.

Theory of operation. A GGUF carries its chat format as a Jinja program
(`tokenizer.chat_template`). llmd runs it with its own interpreter (llmd.prompt.jinja) as a
`JinjaTemplate`. The few programs it knows exactly (SmolLM2's and Qwen2.5's ChatML
variants, Llama 3.0's) also have a built-in renderer, `ChatTemplate`, which writes the same
bytes natively (tests/prompt/test_templates.py proves it against the interpreter and against
Jinja output in tests/data/chat_golden.json) and knows where each earlier reply,
tool calls included, sits in the prompt; `detect_template` picks it only for those
exact programs.

The prompt comes back as segments, not one string, because the two kinds of text
are tokenized differently: a template marker such as `<|im_start|>` must become its
control token, while message content never may (a user who types `<|im_end|>` gets
those characters, not an end of turn). Markers are exactly the special-token strings
the template itself writes; everything else (role names, newlines, content, the
tools block) is plain text. `tokenize_prompt` tokenizes the whole prompt in one call,
with control tokens allowed only inside the markers' byte ranges, so that the rest is
tokenized as llama.cpp tokenizes the rendered string: a BPE word or SentencePiece's
space prefix does not stop at the seam between template text and content. Adjacent
plain text is merged, except that the text of an earlier assistant reply stands
alone, so that where it starts and ends on token boundaries a session can put back
the exact ids the model generated for it (`Prompt.replies`, `PromptTokens.replies`)
instead of the re-tokenized text.

For a Jinja template the interpreter reports which output characters came from the
conversation; markers are the control-token strings (found through the model's vocab
at start-up, `template_markers`) in the template's own text only. A reply part is an
assistant message's content when the template wrote it unchanged.

What a template writes also says how the model answers: `tool_format` (Hermes blocks,
Qwen3-Coder's XML in them, Llama 3.x's JSON reply or <|python_tag|>, Mistral's [TOOL_CALLS],
Gemma 4's <|tool_call>, Granite's <|tool_call|>, Phi-4's <|tool_call|> blocks, gpt-oss's
harmony channels), `call_layout` (how constrained decoding writes calls), `output_markers`
(the strings that format is read by) and `reasoning_start` (whether replies carry a
<think> block, and whether the prompt already opened it).

The built-in ChatML renderer writes tools as Qwen2.5's template does: a `# Tools`
block in the system message, `<tool_call>` blocks for assistant calls, and
`<tool_response>` blocks (inside a user turn) for tool results.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from llmd.prompt import harmony
from llmd.prompt import jinja
from llmd.prompt import reasoning
from llmd.prompt.tool_calls import (FORMAT_MARKERS, GEMMA4_LAYOUT, GEMMA_CALL, GLM_KEY, GLM_LAYOUT, HERMES_LAYOUT,
                        LLAMA3_LAYOUT, MISTRAL_ARGS, MISTRAL_CALLS, MISTRAL_LAYOUT, MISTRAL_NEMO_LAYOUT,
                        NEMOTRON_CALLS, NEMOTRON_LAYOUT, OPEN_TAG, PHI4_LAYOUT, PHI4_TOOLS, QWEN3_CODER_LAYOUT,
                        TAGGED_CALLS, CallLayout)

TEMPLATE_NAMES: tuple[str, ...] = ("chatml", "llama3")

_IM_START, _IM_END = "<|im_start|>", "<|im_end|>"
_L3_BOS, _L3_HEAD, _L3_HEAD_END, _L3_EOT = (
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_TOOLS_OUTRO_DOUBLED = _TOOLS_OUTRO.replace("{", "{{").replace("}", "}}")


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered by the chosen template (the API answers 400)."""


class UnsupportedToolsError(ChatTemplateError):
    """Tools, or assistant tool calls, were given to a template without a tool format."""


class UnusedVariableError(ChatTemplateError):
    """A template variable the caller set (chat_template_kwargs, reasoning_effort) that
    the template never reads, or one it may not set; `name` is the variable."""

    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(message)


# Variables llmd itself gives every template; a caller's kwargs may not replace them.
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"})


@dataclass(frozen=True)
class ChatTemplate:
    """A built-in renderer (`name` in TEMPLATE_NAMES) and, for ChatML, the system prompt
    the model's template inserts when the conversation does not start with one."""

    name: str
    default_system: str | None = None
    doubled_tool_braces: bool = False
    source: str = field(default="", compare=False, repr=False)  # the Jinja program it stands for

    def __post_init__(self) -> None:
        if self.name not in TEMPLATE_NAMES:
            raise ValueError(f"unknown chat template {self.name!r}; choose one of "
                             + ", ".join(TEMPLATE_NAMES))


@dataclass
class Prompt:
    """A rendered prompt: `parts` are (text, is_marker) in order; markers are the
    template's control-token strings, to be tokenized as control tokens. `replies`
    maps the index of an assistant message to the index of the part holding its
    reply (the text the model generated after the generation prompt)."""

    parts: list[tuple[str, bool]] = field(default_factory=list)
    replies: dict[int, int] = field(default_factory=dict)
    prefill: str = ""  # the text that ends the prompt as the start of the reply (render_chat's continue_final)

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.parts)

    def _marker(self, marker: str) -> None:
        self.parts.append((marker, True))

    def _text(self, text: str) -> None:
        if not text:
            return
        last = len(self.parts) - 1
        if last >= 0 and not self.parts[last][1] and last not in self.replies.values():
            self.parts[last] = (self.parts[last][0] + text, False)
        else:
            self.parts.append((text, False))

    def _reply(self, message_index: int, text: str) -> None:
        """An assistant reply, in a part of its own (see the module docstring)."""
        if text:
            self.parts.append((text, False))
            self.replies[message_index] = len(self.parts) - 1


@dataclass
class PromptTokens:
    """A rendered prompt as token ids (no BOS). `replies` maps the index of an assistant
    message to the token span [start, end) of its reply, for each reply whose text
    starts and ends where tokens do."""

    ids: list[int]
    replies: dict[int, tuple[int, int]] = field(default_factory=dict)


def tokenize_prompt(prompt: Prompt,
                    tokenize_marked: Callable[[bytes, list[tuple[int, int]]], tuple[list[int], list[int]]]
                    ) -> PromptTokens:
    """The whole prompt tokenized in one call, as llama.cpp tokenizes a rendered chat
    (special tokens parsed, so words and SentencePiece's space prefix run across the
    seams between template text and content), except that control tokens match only
    inside the markers. `tokenize_marked(text, marker_byte_ranges)` is
    Engine.tokenize_marked: ids and the byte offset where each starts (-1: unknown)."""
    chunks = [text.encode("utf-8", "surrogatepass") for text, _ in prompt.parts]
    starts = [0]
    for chunk in chunks:
        starts.append(starts[-1] + len(chunk))
    markers = [(starts[i], starts[i + 1]) for i, (_, is_marker) in enumerate(prompt.parts) if is_marker]
    ids, offsets = tokenize_marked(b"".join(chunks), markers)
    first_at: dict[int, int] = {starts[-1]: len(ids)}  # byte offset -> the first token starting there
    for i, offset in enumerate(offsets):
        if offset >= 0:
            first_at.setdefault(offset, i)
    replies = {}
    for message, part in prompt.replies.items():
        start, end = first_at.get(starts[part]), first_at.get(starts[part + 1])
        if start is not None and end is not None and start < end:
            replies[message] = (start, end)
    return PromptTokens(ids, replies)


_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# The programs a built-in renderer reproduces exactly, by jinja.Template.fingerprint
# (their tokens, so escapes and spacing inside tags do not matter): the templates of
# tests/data/chat_golden.json. Some Qwen2.5 GGUFs escaped the tool example's braces.
_BUILTIN: dict[str, ChatTemplate] = {
    "4b74231105edc190936e0e1d5af5f0cd7e959b52eee318828aab2e702cf0127b": ChatTemplate("chatml", _SMOLLM2_SYSTEM),
    "22b232bc90b9b0ca4da6e506e3bf4ec0c755e6875ad36c8054bb6421234d8bf8": ChatTemplate("chatml", _SMOLLM2_SYSTEM),
    "70c570327beeec84569774e1fbe7edaf0da6e9e5d89891f29dd93a48423cf9af": ChatTemplate("chatml", _QWEN_SYSTEM),
    "0cf3f6d4febde3dc4f1f9f3d971d9062dff42e334a09e68b0c3b323282f10945": ChatTemplate(
        "chatml", _QWEN_SYSTEM, doubled_tool_braces=True),
    "e8297caafba83f7f3a56e25ff8702df2d9989262f55839fcd15d646caf6eb9d5": ChatTemplate("llama3"),
}


def detect_template(template_text: str | None) -> ChatTemplate | None:
    """The built-in renderer that writes exactly what this Jinja program does, if any."""
    if not template_text:
        return None
    try:
        return _BUILTIN.get(jinja.Template(template_text).fingerprint)
    except jinja.TemplateError:
        return None


@dataclass(frozen=True)
class Unavailable:
    """No usable template; `reason` is what start-up logs and chat requests are told."""

    reason: str


class JinjaTemplate:
    """A Jinja chat template run by llmd.prompt.jinja. `markers` are the control-token strings
    (longest first) that become control tokens where the template itself writes them."""

    name = "jinja"

    def __init__(self, template: jinja.Template, bos_token: str = "", eos_token: str = "",
                 markers: tuple[str, ...] = ()):
        self.template, self.bos_token, self.eos_token = template, bos_token, eos_token
        self.source = template.source
        # A template that writes </think> is a reasoning model's: its output is split.
        literals = template.literals()
        self.thinks = any(reasoning.CLOSE in literal for literal in literals)
        self.tool_format = next((name for name, sign in _TOOL_FORMAT_SIGNS
                                 if any(sign in literal for literal in literals)), "hermes")
        self.markers = tuple(sorted(set(markers), key=len, reverse=True))
        self._marker_re = re.compile("|".join(map(re.escape, self.markers))) if self.markers else None

    def split_markers(self, text: str) -> list[tuple[str, bool]]:
        """Template text as (text, is_marker) pieces."""
        if self._marker_re is None:
            return [(text, False)]
        pieces, at = [], 0
        for m in self._marker_re.finditer(text):
            if m.start() > at:
                pieces.append((text[at:m.start()], False))
            pieces.append((m.group(0), True))
            at = m.end()
        if at < len(text):
            pieces.append((text[at:], False))
        return pieces


def renderer_name(template: ChatTemplate | JinjaTemplate | Unavailable) -> str:
    """How prompts are made: "builtin:<name>", "jinja", or "unavailable"."""
    if isinstance(template, Unavailable):
        return "unavailable"
    return "jinja" if isinstance(template, JinjaTemplate) else f"builtin:{template.name}"


# What a template writes, in its instructions or in the earlier calls it renders, says
# how its model writes calls (llmd.prompt.tool_calls.FORMAT_MARKERS, llmd.prompt.harmony): the first match decides.
_TOOL_FORMAT_SIGNS = (
    ("harmony", harmony.TEMPLATE_SIGN),
    # the instruction Llama 3.1-3.3 templates give with tools
    ("llama3_json", '"parameters": dictionary of argument name and its value'),
    ("gemma4", GEMMA_CALL + "call:"),
    # Nemo: [TOOL_CALLS] then a JSON array; Small 3.x, Magistral, Devstral: name[ARGS]{...}
    ("mistral", MISTRAL_CALLS),
    # Phi-4-mini declares its tools between <|tool|> and <|/tool|>; it closes each
    # <|tool_call|> block, which Granite (below) does not
    ("phi4", PHI4_TOOLS),
    # Nemotron Nano v2 asks for <TOOLCALL> and a JSON list, closed by </TOOLCALL>
    ("nemotron", NEMOTRON_CALLS),
    # Granite 3.3 asks for <|tool_call|> and a JSON list
    ("tagged_json", TAGGED_CALLS),
    # Qwen3-Coder, Qwen3.5 (and Nemotron 3, Step 3.5): Hermes blocks holding <function=NAME>
    ("qwen3_coder", OPEN_TAG + "\n<function="),
    # GLM-4.5 and 4.6: Hermes blocks holding NAME and <arg_key>/<arg_value> pairs
    ("glm", GLM_KEY),
)


def tool_format(template: ChatTemplate | JinjaTemplate) -> str:
    """How the model writes tool calls, by the name llmd.prompt.tool_calls.call_stream takes or
    "harmony" (gpt-oss's channels, llmd.prompt.harmony); "hermes" (`<tool_call>` blocks) for
    the built-in renderers and templates without another sign."""
    if isinstance(template, JinjaTemplate):
        return template.tool_format
    return "hermes"


def output_markers(template: ChatTemplate | JinjaTemplate) -> tuple[str, ...]:
    """The strings the model's replies are parsed by (tool calls, channels), the one
    that opens a tool call first."""
    fmt = tool_format(template)
    return harmony.MARKERS if fmt == "harmony" else FORMAT_MARKERS[fmt]


def call_layout(template: ChatTemplate | JinjaTemplate) -> CallLayout:
    """The layout constrained calls are written in: the family's own (Llama 3.x's JSON
    reply, as their templates render a custom tool's call back into the prompt: Llama
    3.1's <|python_tag|> opens only built-in tools' `name.call(...)`; gpt-oss's messages
    to functions.NAME; Mistral's [TOOL_CALLS] as its template writes them; Phi-4's
    <|tool_call|> blocks and Nemotron Nano v2's <TOOLCALL> blocks; Gemma 4's <|tool_call>
    blocks in its call syntax; Qwen3-Coder's and GLM-4.5's XML), else Hermes blocks,
    which every format's parser also reads (Granite's unclosed <|tool_call|> list cannot
    be followed by another call)."""
    fmt = tool_format(template)
    if fmt == "mistral":
        return MISTRAL_LAYOUT if any(MISTRAL_ARGS in s for s in template.template.literals()) else MISTRAL_NEMO_LAYOUT
    layouts = {"llama3_json": LLAMA3_LAYOUT, "harmony": harmony.CALL_LAYOUT, "phi4": PHI4_LAYOUT,
               "gemma4": GEMMA4_LAYOUT, "qwen3_coder": QWEN3_CODER_LAYOUT, "glm": GLM_LAYOUT,
               "nemotron": NEMOTRON_LAYOUT}
    return layouts.get(fmt, HERMES_LAYOUT)


def control_pieces(engine: Any, texts: tuple[str, ...]) -> dict[int, bytes]:
    """The control tokens among `texts` (each a whole token's text), by id, with that
    text: where a parser reads them in replies they must reach it as text, while a
    control token's piece is otherwise empty. `engine` gives tokenize and piece."""
    pieces = {}
    for text in texts:
        ids = engine.tokenize(text, special=True)
        if len(ids) == 1 and not engine.piece(ids[0]):
            pieces[ids[0]] = engine.piece(ids[0], special=True)
    return pieces


def reasoning_start(template: ChatTemplate | JinjaTemplate, prompt_text: str, prefill: str = "") -> bool | None:
    """None when the template has no `<think>` reasoning block (its output is all
    content); else whether the prompt leaves the block open, so the output starts
    inside it (DeepSeek-R1 distills end their generation prompt with `<think>\n`).
    `prefill` is the end of the prompt that begins the reply (Prompt.prefill): its own
    tags open and close the block after the generation prompt."""
    if not isinstance(template, JinjaTemplate) or not template.thinks:
        return None
    inside = prompt_text[:len(prompt_text) - len(prefill)].rstrip().endswith(reasoning.OPEN)
    for tag in _THINK_TAGS.findall(prefill):
        inside = tag == reasoning.OPEN
    return inside


_THINK_TAGS = re.compile(f"{re.escape(reasoning.OPEN)}|{re.escape(reasoning.CLOSE)}")


def template_markers(template: jinja.Template, extra: tuple[str, ...],
                     controls_in: Callable[[str], list[str]]) -> tuple[str, ...]:
    """The control-token strings the template can write: `controls_in(text)` lists those
    the model's tokenizer finds in a text (special parsing on); it is asked about every
    literal of the template and about `extra` (bos/eos token strings)."""
    found: set[str] = set()
    for literal in (*template.literals(), *extra):
        if literal:
            found.update(controls_in(literal))
    return tuple(sorted(found, key=len, reverse=True))


def load_template(model_template: str | None, override: str | None, engine: Any) -> ChatTemplate | JinjaTemplate:
    """The chat template to serve with: `override` (a built-in name or a Jinja file, from
    --chat-template) or the model's own. `engine` gives the vocab (tokenize, piece,
    info.bos_id / eos_id). Raises ChatTemplateError with a start-up message when there
    is no template or the interpreter cannot parse it."""
    if override in TEMPLATE_NAMES:
        return ChatTemplate(override)
    if override:
        try:
            with open(override, encoding="utf-8") as f:
                source, origin = f.read(), f"--chat-template {override}"
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"--chat-template {override!r} is neither a built-in name ("
                                    f"{', '.join(TEMPLATE_NAMES)}) nor a readable template file: {exc}") from None
    elif model_template:
        source, origin = model_template, "the model's chat template"
    else:
        raise ChatTemplateError("this model has no chat template; use /v1/completions or start llmd with "
                                f"--chat-template FILE or one of: {', '.join(TEMPLATE_NAMES)}")
    try:
        template = jinja.Template(source)
    except jinja.TemplateError as exc:
        raise ChatTemplateError(f"{origin} cannot be run by llmd's template interpreter: {exc}; "
                                "start llmd with --chat-template FILE or NAME") from None
    builtin = _BUILTIN.get(template.fingerprint)
    if builtin is not None:
        return dataclasses.replace(builtin, source=source)
    info = engine.info

    def token(token_id: int) -> str:
        return engine.piece(token_id, special=True).decode("utf-8", "replace") if token_id >= 0 else ""

    def controls_in(text: str) -> list[str]:
        return [token(i) for i in engine.tokenize(text, special=True)
                if not engine.piece(i, special=False) and engine.piece(i, special=True)]
    bos, eos = token(info.bos_id), token(info.eos_id)
    return JinjaTemplate(template, bos, eos, template_markers(template, (bos, eos), controls_in))


def render_chat(template: ChatTemplate | JinjaTemplate, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None,
                continue_final: bool = False) -> Prompt:
    """Render validated messages (and OpenAI function tools) as `template` would.

    Messages and tools are OpenAI-shaped dicts; the flat records of llmd.api.validation
    (`dataclasses.asdict` of Message, ToolCall, Tool) are accepted as well.
    `developer` messages are system messages. An assistant message's `reasoning` is
    the `thinking` of a harmony template (gpt-oss's, which renders it before the turn's
    tool call), as llama.cpp passes it; other templates do not get it. `template_kwargs` are extra variables
    (such as enable_thinking) for a Jinja template that reads them. Raises
    UnsupportedToolsError when a built-in template has no tool format and tools or tool
    calls are present, UnusedVariableError for a kwarg the template does not read, and
    ChatTemplateError when a Jinja template refuses the conversation or fails on it.

    With `continue_final`, the last message is an assistant's reply that the client began
    (a prefill, as llama.cpp's server and Anthropic's API read one): the messages before
    it are rendered with the generation prompt, and its content follows as plain text
    (Prompt.prefill), so that the model goes on from where it stops. The reply begins
    with the generation prompt's own text, so the one format this cannot write is
    harmony's (gpt-oss), whose reply opens with a channel of the model's choosing:
    ChatTemplateError.
    """
    msgs = [_normalise(m) for m in messages]
    prefill = ""
    if continue_final:
        if tool_format(template) == "harmony":
            raise ChatTemplateError("gpt-oss's replies open with a channel of the model's choosing, so a final "
                                    "assistant message cannot be continued; end the conversation with a user or "
                                    "tool message.")
        *msgs, last = msgs
        prefill, add_generation_prompt = last["content"], True
    prompt = Prompt(prefill=prefill)
    _check_kwargs(template, template_kwargs or {})
    if isinstance(template, JinjaTemplate):
        _render_jinja(prompt, template, msgs, tools, add_generation_prompt, template_kwargs or {})
    elif template.name == "llama3":
        _render_llama3(prompt, msgs, tools, add_generation_prompt)
    else:
        _render_chatml(prompt, template, msgs, tools, add_generation_prompt)
    prompt._text(prefill)
    return prompt


def _check_kwargs(template: ChatTemplate | JinjaTemplate, kwargs: dict[str, Any]) -> None:
    read = template.template.variables() if isinstance(template, JinjaTemplate) else set()
    for name in kwargs:
        if name in _RESERVED:
            raise UnusedVariableError(name, f"the template variable {name!r} is set by llmd and cannot be given")
        if name not in read:
            raise UnusedVariableError(name, f"this model's chat template does not use {name!r}, so it would "
                                            "have no effect")


def _render_jinja(p: Prompt, template: JinjaTemplate, msgs: list[dict[str, Any]],
                  tools: list[dict[str, Any]] | None, add_generation_prompt: bool,
                  kwargs: dict[str, Any]) -> None:
    """Run the template over the conversation, then cut its output into parts: the
    template's own text split at markers, the conversation's text as plain text, and
    an assistant's content, when written unchanged, as that reply's part."""
    messages = []
    harmony = tool_format(template) == "harmony"
    for i, msg in enumerate(msgs):
        out: dict[str, Any] = {"role": msg["role"], "content": msg["content"]}
        calls = [_template_call(call) for call in msg.get("tool_calls") or ()]
        if msg["role"] == "assistant" and msg["content"] and not calls:
            out["content"] = jinja.data_text(msg["content"], i + 1)  # tag = message index + 1
        if calls:
            out["tool_calls"] = calls
        if msg.get("reasoning") and harmony:  # gpt-oss's template renders it before a call
            out["thinking"] = msg["reasoning"]
        for key in ("name", "tool_call_id"):
            if msg.get(key) is not None:
                out[key] = msg[key]
        messages.append(out)
    # Without tools, `tools` is left undefined, as llama.cpp does (transformers passes
    # None, which templates such as Hermes-2-Pro's cannot iterate).
    data = {**kwargs, "messages": messages, **({"tools": [_openai_tool(t) for t in tools]} if tools else {})}
    variables = {"bos_token": template.bos_token, "eos_token": template.eos_token,
                 "add_generation_prompt": add_generation_prompt}
    try:
        runs = template.template.render_parts(variables, data)
    except jinja.TemplateRaised as exc:
        raise ChatTemplateError(f"the model's chat template refused this conversation: {exc}") from None
    except jinja.TemplateError as exc:
        raise ChatTemplateError(f"the chat template failed on this conversation: {exc}") from None
    for text, source in runs:
        if source is None:
            for piece, is_marker in template.split_markers(text):
                if is_marker:
                    p._marker(piece)
                else:
                    p._text(piece)
        elif source > 0 and text == msgs[source - 1]["content"] and source - 1 not in p.replies:
            p._reply(source - 1, text)
        else:
            p._text(text)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call in OpenAI's shape with its arguments as an object, as templates expect
    (arguments that are not JSON stay the string they were)."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    out = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    return {"id": call["id"], **out} if call.get("id") is not None else out


def _normalise(message: dict[str, Any]) -> dict[str, Any]:
    """Map developer to system and flatten content to one string, as llama.cpp does
    for templates that take plain-string content (text parts joined by newlines)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(part.get("text", "") for part in content
                            if part.get("type") == "text")
    role = "system" if message["role"] == "developer" else message["role"]
    return {**message, "role": role, "content": content or ""}


def _tojson(value: Any) -> str:
    # The `tojson` that transformers and llama.cpp give templates: insertion order,
    # ", " and ": " separators, non-ASCII kept as is.
    return json.dumps(value, ensure_ascii=False)


def _render_chatml(p: Prompt, template: ChatTemplate, msgs: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, add_generation_prompt: bool) -> None:
    default_system = template.default_system
    starts_with_system = bool(msgs) and msgs[0]["role"] == "system"
    if tools:
        system = msgs[0]["content"] if starts_with_system else default_system
        p._marker(_IM_START)
        p._text("system\n" + ("" if system is None else system + "\n\n") + _TOOLS_INTRO
                + "".join("\n" + _tojson(_openai_tool(tool)) for tool in tools)
                + (_TOOLS_OUTRO_DOUBLED if template.doubled_tool_braces else _TOOLS_OUTRO))
        p._marker(_IM_END)
        p._text("\n")
    elif msgs and not starts_with_system and default_system is not None:
        _chatml_turn(p, "system", default_system)

    for i, msg in enumerate(msgs):
        role = msg["role"]
        if i == 0 and role == "system" and tools:
            continue  # already written with the tools block
        if role == "assistant":
            # Every tool-call block starts with a newline, so the template's
            # "assistant" + ("\n" + content if content else "") + calls is always
            # the generation prompt "assistant\n" followed by the reply.
            calls = "".join(_render_tool_call(call) for call in msg.get("tool_calls") or ())
            p._marker(_IM_START)
            p._text("assistant\n")
            p._reply(i, msg["content"] + calls if msg["content"] else calls[1:])
            p._marker(_IM_END)
            p._text("\n")
        elif role == "tool":
            # Consecutive tool results share one user turn.
            if i == 0 or msgs[i - 1]["role"] != "tool":
                p._marker(_IM_START)
                p._text("user")
            p._text("\n<tool_response>\n" + msg["content"] + "\n</tool_response>")
            if i == len(msgs) - 1 or msgs[i + 1]["role"] != "tool":
                p._marker(_IM_END)
                p._text("\n")
        else:
            _chatml_turn(p, role, msg["content"])

    if add_generation_prompt:
        p._marker(_IM_START)
        p._text("assistant\n")


def _chatml_turn(p: Prompt, role: str, content: str) -> None:
    p._marker(_IM_START)
    p._text(role + "\n" + content)
    p._marker(_IM_END)
    p._text("\n")


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool in OpenAI's wire shape, as templates print it; a flat record
    {name, description, parameters} is wrapped, leaving out fields that are None."""
    if "function" in tool:
        return tool
    function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _render_tool_call(call: dict[str, Any]) -> str:
    """One Hermes block; arguments (a JSON string on the wire) are re-serialised as
    the object the template receives, so the text matches what the model wrote."""
    function = _template_call(call)["function"]
    return ('\n<tool_call>\n{"name": "' + function["name"] + '", "arguments": '
            + _tojson(function["arguments"]) + "}\n</tool_call>")


def _render_llama3(p: Prompt, msgs: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, add_generation_prompt: bool) -> None:
    if tools or any(m.get("tool_calls") for m in msgs):
        raise UnsupportedToolsError("tool calling is not supported with the llama3 chat template")
    for i, msg in enumerate(msgs):
        if i == 0:
            p._marker(_L3_BOS)
        p._marker(_L3_HEAD)
        p._text(msg["role"])
        p._marker(_L3_HEAD_END)
        p._text("\n\n")
        content = msg["content"].strip()  # Jinja's `trim` is str.strip()
        if msg["role"] == "assistant":
            p._reply(i, content)
        else:
            p._text(content)
        p._marker(_L3_EOT)
    if add_generation_prompt:
        p._marker(_L3_HEAD)
        p._text("assistant")
        p._marker(_L3_HEAD_END)
        p._text("\n\n")
