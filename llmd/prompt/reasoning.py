"""Reasoning text in model output: the `<think>...</think>` block before the answer.

Theory of operation. Reasoning models (Qwen3, QwQ, DeepSeek-R1 and its distills) write
their thinking between OPEN and CLOSE ahead of the answer. Some templates open the block
in the generation prompt, so the output starts inside it (`inside=True`). The text of
the block is reasoning (`message.reasoning_content`), never content; whitespace at its
edges and between CLOSE and the answer is layout and is dropped, as llama.cpp does.

`ReasoningStream` works on text deltas: what is surely reasoning or content is released
at once; it holds back only what could still change meaning, namely the start of the
output while it could become OPEN, a tail that could be the start of CLOSE, and
whitespace that may turn out to be layout. A block is recognised only at the start of
the output; a never-closed block is all reasoning; text that never became OPEN is content.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmd.prompt.text import partial_suffix

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningDelta:
    """Text for `delta.reasoning_content`."""

    text: str


class ReasoningStream:
    """Splits output text into ("reasoning" | "content", text) pieces as it streams."""

    def __init__(self, inside: bool = False):
        self.state = "inside" if inside else "start"  # start, inside, after (layout), content
        self.held = ""
        self.started = False  # some reasoning text was released (leading layout is gone)

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.held += text
        out: list[tuple[str, str]] = []
        while True:
            state = self.state
            if state == "start":
                head = self.held.lstrip()
                if head.startswith(OPEN):
                    self.held, self.state = head[len(OPEN):], "inside"
                elif OPEN.startswith(head):
                    return out  # still could open a block (or is only whitespace so far)
                else:
                    self.state = "content"
            elif state == "inside":
                end = self.held.find(CLOSE)
                if end < 0:
                    keep = partial_suffix(self.held, CLOSE)
                    body = self.held[:len(self.held) - keep]
                    release = body.rstrip()  # trailing whitespace may be layout before CLOSE
                    self._reason(out, release)
                    self.held = self.held[len(release):]
                    return out
                self._reason(out, self.held[:end].rstrip())
                self.held, self.state = self.held[end + len(CLOSE):], "after"
            elif state == "after":
                self.held = self.held.lstrip()
                if not self.held:
                    return out
                self.state = "content"
            else:
                if self.held:
                    out.append(("content", self.held))
                self.held = ""
                return out

    def finish(self) -> list[tuple[str, str]]:
        """The held text at the end of the output."""
        out: list[tuple[str, str]] = []
        if self.state == "inside":
            self._reason(out, self.held.rstrip())
        elif self.state in ("start", "content") and self.held:
            out.append(("content", self.held))
        self.held = ""
        return out

    def _reason(self, out: list[tuple[str, str]], text: str) -> None:
        if not self.started:
            text = text.lstrip()
        if text:
            self.started = True
            out.append(("reasoning", text))
