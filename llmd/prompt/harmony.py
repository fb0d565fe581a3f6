"""gpt-oss output in OpenAI's harmony format: messages on channels, split into
reasoning, content and tool calls.

Theory of operation. After the generation prompt `<|start|>assistant`, gpt-oss writes
one or more messages, each a header up to MESSAGE, a body, and END before the next
message's `<|start|>assistant`:

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}

The last message is ended by <|return|> or <|call|>, which end generation (they are
end-of-generation ids and never reach the text). A header names the message's channel
and, for a tool call, its recipient (` to=functions.NAME`, written before or after the
channel). An `analysis` message is reasoning; a message to `functions.NAME` of a
declared tool whose body is a JSON object is a call of NAME with that object; any
other message (final, or commentary without a recipient) is content. Text that never
reaches a MESSAGE is content, read by the Hermes parser, since constrained decoding
writes required calls as Hermes blocks for every family.

`HarmonyStream` works on text deltas: a header is held until its MESSAGE; a reasoning
or content body is released as it comes, except a tail that may begin END; a call's
body is held to its end.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Iterable, Union

from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.text import partial_suffix
from llmd.prompt.tool_calls import CallLayout, ContentDelta, ToolCallDelta, ToolCallStream, new_call_id, tool_names

CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
# What only a harmony template writes; the strings its replies are read by.
TEMPLATE_SIGN = CHANNEL + "analysis" + MESSAGE
MARKERS = (START, CHANNEL, MESSAGE, END)

# Constrained calls: a message to functions.NAME, a JSON body; <|call|> (an end-of-
# generation id) closes it, and parallel calls are messages of their own. A body ends
# at END in HarmonyStream's eyes, so no string of it spells END.
CALL_LAYOUT = CallLayout(" to=functions.", " to=functions.", CHANNEL + "commentary json" + MESSAGE, "",
                         END + START + "assistant", ends=(END,))

HarmonyEvent = Union[ReasoningDelta, ContentDelta, ToolCallDelta]

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class HarmonyStream:
    """Incremental harmony parser: `feed` text deltas, then `finish` once."""

    def __init__(self, tools: Iterable[dict[str, Any]] | None, new_id: Callable[[], str] = new_call_id) -> None:
        self._tools, self._names, self._new_id = tools, tool_names(tools), new_id
        self._buf = ""
        self._header = ""       # the current message's header, kept for a body that is no call
        self._kind = "header"   # header, or the body being read: reasoning, content, call
        self._call = ""         # the tool a call body is for
        self.calls = 0

    def feed(self, text: str) -> list[HarmonyEvent]:
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[HarmonyEvent]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[HarmonyEvent]:
        events: list[HarmonyEvent] = []
        while True:
            if self._kind == "header":
                at = self._buf.find(MESSAGE)
                if at < 0:
                    if final and self._buf:  # no message: plain text, or the Hermes blocks of constrained calls
                        hermes = ToolCallStream(self._tools, self._new_id)
                        hermes.calls = self.calls
                        events += hermes.feed(self._buf) + hermes.finish()
                        self.calls, self._buf = hermes.calls, ""
                    return events
                self._header, self._buf = self._buf[:at], self._buf[at + len(MESSAGE):]
                self._kind = self._body_kind(self._header)
                continue
            at = self._buf.find(END)
            if at < 0 and not final:
                if self._kind != "call":
                    cut = len(self._buf) - partial_suffix(self._buf, END)
                    self._emit(events, self._buf[:cut])
                    self._buf = self._buf[cut:]
                return events
            body = self._buf if at < 0 else self._buf[:at]
            self._buf = "" if at < 0 else self._buf[at + len(END):]
            if self._kind == "call":
                self._end_call(events, body)
            else:
                self._emit(events, body)
            self._kind = "header"
            if at < 0:
                return events

    def _body_kind(self, header: str) -> str:
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient is not None and recipient.group(1).startswith("functions."):
            self._call = recipient.group(1)[len("functions."):]
            return "call"
        return "reasoning" if channel is not None and channel.group(1) == "analysis" else "content"

    def _emit(self, events: list[HarmonyEvent], text: str) -> None:
        if not text:
            return
        if self._kind == "reasoning":
            events.append(ReasoningDelta(text))
        elif events and isinstance(events[-1], ContentDelta):
            events[-1] = ContentDelta(events[-1].text + text)
        else:
            events.append(ContentDelta(text))

    def _end_call(self, events: list[HarmonyEvent], body: str) -> None:
        """A call body is complete: a call if it names a declared tool with a JSON object,
        else its message as written is content."""
        try:
            arguments = json.loads(body)
        except ValueError:
            arguments = None
        if self._call in self._names and isinstance(arguments, dict):
            events.append(ToolCallDelta(self.calls, self._new_id(), self._call,
                                        json.dumps(arguments, ensure_ascii=False)))
            self.calls += 1
        else:
            self._kind = "content"
            self._emit(events, self._header + MESSAGE + body)
