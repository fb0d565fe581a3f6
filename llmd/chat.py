"""Chat templates: turn an OpenAI `messages` list into the prompt a model was trained on.

Theory of operation. A GGUF carries its chat format as a Jinja program
(`tokenizer.chat_template`). llmd does not run Jinja: `detect_template` reads the
program for robust markers and picks a built-in renderer, and `render_chat` writes
the prompt natively, byte for byte what that program would print for the same input
(checked against Jinja output in tests/data/chat_golden.json).

The prompt comes back as segments, not one string, because the two kinds of text
are tokenized differently: a template marker such as `<|im_start|>` must become its
control token, while message content never may (a user who types `<|im_end|>` gets
those characters, not an end of turn). Markers are exactly the special-token strings
the template itself writes; everything else (role names, newlines, content, the
tools block) is plain text. Adjacent plain text is merged so that the tokenizer sees
the same runs it would see when splitting the full string at control tokens, with one
exception: the text of an earlier assistant reply stands alone after its role header,
as the model's own output did, so that a session can put back the exact ids the model
generated for it (`Prompt.replies`) instead of re-tokenizing the text.

Tools follow the Hermes convention as Qwen2.5's template writes it, for every ChatML
model: a `# Tools` block in the system message, `<tool_call>` blocks for assistant
calls, and `<tool_response>` blocks (inside a user turn) for tool results.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TEMPLATE_NAMES: tuple[str, ...] = ("chatml", "llama3")

_IM_START, _IM_END = "<|im_start|>", "<|im_end|>"
_L3_BOS, _L3_HEAD, _L3_HEAD_END, _L3_EOT = (
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

# A ChatML template that writes a fixed system turn carries its default system prompt
# as a string literal: '<|im_start|>system\n<prompt><|im_end|>'. Anything built from
# variables has a quote right after `system\n`, so it does not match.
_CHATML_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\\n|\n)([^'\"\\<{}]+)<\|im_end\|>")

# Llama 3.1+ templates always add a dated system block and their own tool format;
# rendering them as Llama 3.0 would not be byte-exact, so they are not recognised.
_LLAMA31_MARKERS = ("Cutting Knowledge Date", "<|python_tag|>", "date_string")

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_TOOLS_OUTRO_DOUBLED = _TOOLS_OUTRO.replace("{", "{{").replace("}", "}}")
# Some Qwen2.5 GGUFs escaped that example's braces, so their prompt shows `{{...}}`.
_DOUBLED_BRACES = re.compile(r'\{\{\\"name\\": <function-name>')


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered by the chosen template (the API answers 400)."""


class UnsupportedToolsError(ChatTemplateError):
    """Tools, or assistant tool calls, were given to a template without a tool format."""


@dataclass(frozen=True)
class ChatTemplate:
    """A built-in renderer (`name` in TEMPLATE_NAMES) and, for ChatML, the system prompt
    the model's template inserts when the conversation does not start with one."""

    name: str
    default_system: str | None = None
    doubled_tool_braces: bool = False

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


def detect_template(template_text: str | None) -> ChatTemplate | None:
    """Recognise a GGUF `tokenizer.chat_template`; None when no built-in renderer fits."""
    if not template_text:
        return None
    if _IM_START in template_text and _IM_END in template_text:
        found = _CHATML_DEFAULT_SYSTEM.search(template_text)
        return ChatTemplate("chatml", found.group(1) if found else None,
                            bool(_DOUBLED_BRACES.search(template_text)))
    if all(m in template_text for m in (_L3_HEAD, _L3_HEAD_END, _L3_EOT)):
        if any(m in template_text for m in _LLAMA31_MARKERS):
            return None
        return ChatTemplate("llama3")
    return None


def render_chat(template: ChatTemplate, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None = None,
                add_generation_prompt: bool = True) -> Prompt:
    """Render validated messages (and OpenAI function tools) as `template` would.

    Messages and tools are OpenAI-shaped dicts; the flat records of llmd.openai
    (`dataclasses.asdict` of Message, ToolCall, Tool) are accepted as well.
    `developer` messages are system messages. Raises UnsupportedToolsError when the
    template has no tool format and tools or tool calls are present.
    """
    msgs = [_normalise(m) for m in messages]
    prompt = Prompt()
    if template.name == "llama3":
        _render_llama3(prompt, msgs, tools, add_generation_prompt)
    else:
        _render_chatml(prompt, template, msgs, tools, add_generation_prompt)
    return prompt


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
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # not JSON: the template would print it as a JSON string
    return ('\n<tool_call>\n{"name": "' + function["name"] + '", "arguments": '
            + _tojson(arguments) + "}\n</tool_call>")


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
