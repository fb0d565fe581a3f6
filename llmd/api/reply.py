"""The reply core every API surface shares: a generation's tokens turned into text,
reasoning and tool calls (`Output`), and one response (`Reply`) that a surface's
`Format` shapes into its JSON object or its SSE frames. With n > 1 the choices after
the first run beside it on spare slots of their own while the session table has them
(SessionTable.spare; the prefix cache hands each the prompt the first one holds), else
one after another on the reply's slot; either way they are sent one after another, in
order.

A reply knows the rest of the API only through a `ReplyContext`: the runtime that
runs its generations, the model id it names, how a token shows in logprobs, which
control tokens the output parser reads as text, and whether prompts are logged.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Mapping, Protocol

from llmd import errors
from llmd.api.logprobs import TokenLogprob
from llmd.engine.native import Token
from llmd.errors import ApiError, as_api_error
from llmd.http.server import HttpRequest
from llmd.prompt.harmony import HarmonyStream
from llmd.prompt.infill import LineLimits
from llmd.prompt.reasoning import ReasoningDelta, ReasoningStream
from llmd.prompt.stops import StopMatcher
from llmd.prompt.text import Utf8Stream
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta, call_stream, merge_tool_calls
from llmd.serving.runtime import Generation, Runtime
from llmd.serving.sessions import Lease, Slot, reply_fingerprint

Delta = ContentDelta | ToolCallDelta | ReasoningDelta  # what a token adds to a reply
PING_SECONDS = 3.0  # `: ping` comments while the prompt is processed

log = logging.getLogger("llmd.api")


@dataclass
class ReplyContext:
    """What a reply needs of the API that made it."""
    runtime: Runtime
    model: str                            # the model id replies name
    piece: Callable[..., bytes]           # engine.piece: a token's bytes (special=True: control tokens by name)
    shown: Mapping[int, bytes]            # control tokens the output parser reads, with their text
    log_prompts: bool = False             # log prompt and completion text (never logged otherwise)
    # SessionTable.turn_ended: the reply is complete; what to await before its last bytes
    turn_ended: Callable[[Slot], Awaitable | None] = lambda slot: None


class Output:
    """Turns a generation's token pieces into response text: UTF-8 assembly,
    stop-string hold-back, then (for a reasoning model's chat) the reasoning block
    split off, then (for chat with tools) tool-call extraction from the content; or,
    for gpt-oss ("harmony"), its channels split into reasoning, content and calls.
    Keeps what it produced: `text`, `reasoning` and the tool `calls` pieces.
    `reasoning` None means the output has no reasoning block; True or False says
    whether it starts inside one. `tool_format` is templates.tool_format's. `limits`
    (a code completion's) end the text after the stop strings, like one."""

    def __init__(self, stops: list[str], tools: list[dict] | None, reasoning: bool | None = None,
                 tool_format: str = "hermes", limits: LineLimits | None = None):
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(stops)
        self.limits = limits
        self.harmony = HarmonyStream(tools) if tool_format == "harmony" else None
        self.thinking = ReasoningStream(reasoning) if reasoning is not None and self.harmony is None else None
        self.tools = call_stream(tool_format, tools) if tools and self.harmony is None else None
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_tokens = 0
        self.calls: list[ToolCallDelta] = []

    @property
    def reads_markers(self) -> bool:
        """Whether the tool format's markers (templates.output_markers) must reach `feed` as text."""
        return self.tools is not None or self.harmony is not None

    def content(self) -> str:
        return "".join(self.text)

    def tool_calls(self) -> list[dict]:
        """The OpenAI `tool_calls` entries the pieces so far add up to."""
        return merge_tool_calls(self.calls)

    def feed(self, piece: bytes) -> tuple[list[Delta], bool]:
        """One token's piece; counts it in `reasoning_tokens` if it was part of the
        reasoning (a `<think>` block's tags included)."""
        inside = self._inside()
        text, hit = self._limited(*self.stops.feed(self.utf8.feed(piece)))
        deltas = self._route(text, final=False)
        if inside or self._inside() or any(isinstance(d, ReasoningDelta) for d in deltas):
            self.reasoning_tokens += 1
        return deltas, hit

    def _inside(self) -> bool:
        return self.thinking is not None and self.thinking.state == "inside"

    def finish(self) -> list[Delta]:
        text, hit = self.stops.feed(self.utf8.flush())  # ("", True) once a stop was hit
        if not hit:
            text += self.stops.flush()
        return self._route(self._limited(text, hit)[0], final=True)

    def _limited(self, text: str, hit: bool) -> tuple[str, bool]:
        """Text past the stop strings, through the limits if there are any."""
        if self.limits is None or hit:
            return text, hit
        return self.limits.feed(text)

    def _route(self, text: str, final: bool) -> list[Delta]:
        out: list[Delta] = []
        if self.harmony is not None:
            out += (self.harmony.feed(text) if text else []) + (self.harmony.finish() if final else [])
            text = ""
        if self.thinking is not None:
            pieces = (self.thinking.feed(text) if text else []) + (self.thinking.finish() if final else [])
            text = ""
            for kind, piece in pieces:
                out += [ReasoningDelta(piece)] if kind == "reasoning" else self._content(piece)
        out += self._content(text)
        if final and self.tools is not None:
            out += self.tools.finish()
        for d in out:
            if isinstance(d, ContentDelta):
                self.text.append(d.text)
            elif isinstance(d, ToolCallDelta):
                self.calls.append(d)
            else:
                self.reasoning.append(d.text)
        return out

    def _content(self, text: str) -> list[ContentDelta | ToolCallDelta]:
        if not text:
            return []
        return self.tools.feed(text) if self.tools is not None else [ContentDelta(text)]


class Format(Protocol):
    """How one API surface (chat_completions, completions, responses, messages, llama.cpp's,
    Ollama's) shapes a reply: one object when collected, frames when streamed."""

    id: str
    prompt_param: str          # the parameter a prompt over the context is blamed on
    remembers_replies: bool    # the client sends the reply back: keep its generated ids
    shows_reasoning: bool      # reasoning deltas reach `deltas` (else only content and calls)
    stream_type: str           # the stream's media type (SSE's, or Ollama's NDJSON)
    ping: bytes | None         # what keeps a stream alive while the prompt is processed (None: nothing)

    def body(self, reply: Reply) -> dict: ...
    def start(self, reply: Reply) -> list[bytes]: ...
    def deltas(self, reply: Reply, deltas: list[Delta]) -> list[bytes]: ...
    def end(self, reply: Reply) -> list[bytes]: ...  # after each choice; the last also closes
    def error(self, reply: Reply, err: ApiError) -> list[bytes]: ...
    # prompt processing, for the surfaces whose requests can ask for it (return_progress)
    def progress(self, reply: Reply, progress: dict) -> list[bytes]: ...


@dataclass
class Choice:
    """One choice of a reply: its generation, output, finish reason and logprobs."""
    index: int
    g: Generation
    output: Output
    finish_reason: str | None
    logprobs: list[TokenLogprob]
    completion_tokens: int         # the tokens it took: up to its stop string, if one ended it


@dataclass
class Choices:
    """How many choices a reply has (n), and how the next one starts: its generation,
    on the reply's slot (`generation(index, None)`: the prompt is in its cache already)
    or on a spare slot (`generation(index, spare)`, a fork: Generation.fork), and a
    fresh output."""
    n: int
    generation: Callable[[int, Lease | None], Generation]
    output: Callable[[], Output]
    # The reply's hold on its slot: the last choice there holds it if it is the reply's
    # last; else Reply._settle_lease gives it back once the choices there have ended.
    lease: Lease
    # SessionTable.spare when the choices after the first may run beside it (None: after it)
    spare: Callable[[], Awaitable[Lease | None]] | None = None


class Reply:
    """One generation's response, streamed as SSE chunks or collected into one object;
    its format builds the surface's objects and frames. With n > 1 the choices are
    sent one after another (see the module doc); `g`, `output`, `finish_reason` and
    the logprobs are the current choice's, `done` holds the finished ones."""

    def __init__(self, ctx: ReplyContext, fmt: Format, g: Generation, output: Output,
                 session_id: str | None, prompt: str | list[int], choices: Choices | None = None):
        self.ctx, self.fmt, self.g, self.output = ctx, fmt, g, output
        self.more = choices
        self.n = choices.n if choices else 1
        self.index = 0                   # the current choice
        self.done: list[Choice] = []
        self.on_slot = g                 # the newest choice on the reply's own slot
        self.forks: dict[int, Generation] = {}  # choices started on spare slots, by index
        self._forking: asyncio.Task | None = None  # starting them
        self.session_id = session_id
        self.prompt = prompt  # as the client gave it (text or ids), for --log-prompts
        self.log: dict = {}  # access-log fields, shared with the HTTP response
        self.id = fmt.id
        self.created = int(time.time())
        self.model = ctx.model
        self.finish_reason: str | None = None
        self.generated_ids: list[int] = []  # the reply's ids, without a terminal token
        self.completion_tokens = 0  # tokens the current choice took (Choice.completion_tokens)
        self.logprobs: list[TokenLogprob] = []  # of the reply's tokens, when asked for
        self._logprobs_taken = 0
        self.stop_hit = False  # a stop string ended the reply (the generation is cancelled)
        self.closed = False

    def close(self) -> None:
        """Cancel every choice that still runs (each releases its slot as it ends) and
        the starting of forks, settle the reply's lease, and fill in the access-log
        fields. Never waits, so no interruption of the handler can leave a slot held."""
        if self.closed:
            return
        self.closed = True
        self._cancel()
        self._settle_lease()
        first = self.first
        self.log.update(session=self.session_id or "-", prompt=len(first.prompt), cached=first.timings()["cache_n"],
                        generated=self.usage()["completion_tokens"], ttft_ms=round(first.first_token_ms(), 1),
                        finish=self.finish_reason or "cancelled")
        if self.ctx.log_prompts:
            completion = self.output.content() + "".join(
                f"<tool_call>{json.dumps(c['function'], ensure_ascii=False)}</tool_call>"
                for c in self.output.tool_calls())
            log.info("%s prompt_text=%s completion_text=%s", self.id, json.dumps(self.prompt, ensure_ascii=False),
                     json.dumps(completion, ensure_ascii=False))

    def _settle_lease(self) -> None:
        """Give the reply's hold on its slot back, or hand it to the newest choice there
        if that one still runs (it gives the slot back as it ends). Run at the end of
        the last choice and again at close: a lease is released once however often."""
        lease = self.more.lease if self.more else None
        if lease is not None and self.on_slot.lease is not lease:
            if self.on_slot.finished:
                lease.release()
            else:
                self.on_slot.lease = lease

    def _cancel(self) -> None:
        """Cancel every choice of the reply that still runs, and the starting of forks."""
        if self._forking is not None:
            self._forking.cancel()
        for g in [self.g, *self.forks.values()]:
            if not g.finished:
                self.ctx.runtime.cancel(g)

    async def _events(self, ping: bool) -> AsyncIterator[tuple[str, object]]:
        """The current choice's events up to its end; ("ping", None) while nothing
        comes for a while. The first choice's first token (or end) starts the forks:
        its prompt is in its cache then."""
        while True:
            try:  # asyncio.timeout is a timer, where wait_for makes a task an event
                async with asyncio.timeout(PING_SECONDS if ping else None):
                    kind, value = await self.ctx.runtime.next_event(self.g)
            except TimeoutError:
                yield "ping", None
                continue
            if kind in ("token", "end") and self._forking is None and self.more and self.more.spare:
                self._forking = asyncio.ensure_future(self._fork())
            yield kind, value
            if kind not in ("token", "progress"):
                return

    def piece(self, token_id: int) -> bytes:
        """A token's bytes as logprobs show them (control tokens by name)."""
        return self.ctx.piece(token_id, special=True)

    def take_logprobs(self) -> list[TokenLogprob]:
        """The logprobs of tokens fed since the last call."""
        new = self.logprobs[self._logprobs_taken:]
        self._logprobs_taken = len(self.logprobs)
        return new

    def _feed(self, token: Token) -> list[Delta]:
        if self.stop_hit:  # tokens made past the stop string before its cancel took effect
            return []
        self.completion_tokens += 1
        if not token.is_terminal:
            self.generated_ids.append(token.id)
        # an end-of-turn token is no text; a control token the parser reads is
        if token.logprob is not None and (token.piece or token.id in self.ctx.shown):
            self.logprobs.append(TokenLogprob(token.id, token.logprob, token.top))
        piece = self.ctx.shown.get(token.id, token.piece) if self.output.reads_markers else token.piece
        deltas, hit = self.output.feed(piece)
        if hit:
            self.stop_hit = True
            self.ctx.runtime.cancel(self.g)
        return deltas

    def _shown(self, deltas: list[Delta]) -> list[Delta]:
        """The deltas the format shows: reasoning only where the surface has a field for it."""
        return deltas if self.fmt.shows_reasoning else [d for d in deltas if not isinstance(d, ReasoningDelta)]

    def _end(self, reason: str) -> list[Delta]:
        """The last deltas; sets finish_reason and remembers a complete chat reply.
        A generation cancelled for any reason but a stop string was cut short: that is
        an error, never a normal finish."""
        if self.stop_hit:  # (the generation may have come to an end of its own past it)
            reason = "cancelled"
        elif reason == "cancelled":
            raise errors.unavailable("the generation was cancelled before it finished")
        deltas = self.output.finish()
        self.finish_reason = "tool_calls" if self.output.calls else "stop" if reason == "cancelled" else reason
        # A reply cut by a stop string ("cancelled") holds ids the client never saw, and
        # one with reasoning holds ids of text the client does not send back.
        first = self.first
        if self.fmt.remembers_replies and first.reuse and reason in ("stop", "length") and not self.output.reasoning:
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in self.output.tool_calls()]
            first.slot.remember_reply(reply_fingerprint(self.output.content(), calls), self.generated_ids)
        return deltas

    @property
    def last(self) -> bool:
        """The current choice is the reply's last."""
        return self.index == self.n - 1

    def choices(self) -> list[Choice]:
        """The finished choices and the current one, in order."""
        return self.done + [Choice(self.index, self.g, self.output, self.finish_reason, self.logprobs,
                                   self.completion_tokens)]

    async def _fork(self) -> None:
        """Start the choices after the first on spare slots while the table has them;
        those left run after it on the reply's slot."""
        for index in range(1, self.n):
            try:
                lease = await self.more.spare()
            except Exception as exc:  # the engine could not open a session: after it, then
                log.warning("%s: choice %d runs after the first (%s)", self.id, index, exc)
                return
            if lease is None:
                return
            try:
                g = self.more.generation(index, lease)
                self.ctx.runtime.submit(g)  # from here g releases the lease when it ends
            except BaseException:
                lease.release()
                raise
            self.forks[index] = g

    async def _next_choice(self) -> None:
        if self._forking is not None:  # (cancelled only as the reply ends)
            await asyncio.gather(self._forking, return_exceptions=True)
        self.done = self.choices()
        self.index += 1
        fork = self.forks.get(self.index)
        self.g, self.output = fork or self.more.generation(self.index, None), self.more.output()
        self.finish_reason, self.generated_ids, self.logprobs, self._logprobs_taken = None, [], [], 0
        self.stop_hit, self.completion_tokens = False, 0
        if fork is None:
            self.on_slot = self.g
            self.ctx.runtime.submit(self.g)

    @property
    def first(self) -> Generation:
        """The first choice's generation: it prefilled (and scored) the prompt."""
        return self.done[0].g if self.done else self.g

    def usage(self) -> dict:
        prompt, done = len(self.g.prompt), sum(c.completion_tokens for c in self.choices())
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": self.first.plan.keep},
                "completion_tokens_details": {"reasoning_tokens": sum(c.output.reasoning_tokens
                                                                      for c in self.choices())}}

    def extensions(self) -> dict:
        return {"timings": self.first.timings(), "session_reset_reason": self.first.plan.reason}

    async def collect(self, request: HttpRequest) -> dict:
        watcher = asyncio.create_task(self._cancel_on_disconnect(request))
        try:
            for i in range(self.n):
                if i:
                    if request.disconnected.is_set():
                        break
                    await self._next_choice()
                async for kind, value in self._events(ping=False):
                    if kind == "token":
                        self._feed(value)
                    elif kind == "error":
                        raise as_api_error(value)
                    elif kind == "end":
                        if value == "cancelled" and request.disconnected.is_set():
                            raise errors.client_closed()  # the watcher cut it: nobody reads the answer
                        self._end(value)
            await self._turn_saved()
        finally:
            watcher.cancel()
        return self.fmt.body(self)

    async def _turn_saved(self) -> None:
        """Wait until the session's turn is saved, when the session store saves each turn
        (once the reply's slot is free: its last choice there may have ended before)."""
        self._settle_lease()
        if self.finish_reason is not None and (saving := self.ctx.turn_ended(self.on_slot.slot)) is not None:
            await asyncio.gather(saving, return_exceptions=True)

    async def _cancel_on_disconnect(self, request: HttpRequest) -> None:
        await request.disconnected.wait()
        self._cancel()

    async def stream(self, request: HttpRequest) -> AsyncIterator[bytes]:
        try:
            for i in range(self.n):
                if i:
                    await self._next_choice()
                for frame in self.fmt.start(self):
                    yield frame
                async for kind, value in self._events(ping=self.fmt.ping is not None):
                    if kind == "ping":
                        yield self.fmt.ping
                    elif kind == "progress":
                        for frame in self.fmt.progress(self, value):
                            yield frame
                    elif kind == "token":
                        for frame in self.fmt.deltas(self, self._shown(self._feed(value))):
                            yield frame
                    else:
                        try:
                            if kind == "error":
                                raise as_api_error(value)
                            frames = self.fmt.deltas(self, self._shown(self._end(value)))
                        except ApiError as err:
                            for frame in self.fmt.error(self, err):
                                yield frame
                            return
                        for frame in frames:
                            yield frame
                if i == self.n - 1:
                    await self._turn_saved()
                for frame in self.fmt.end(self):
                    yield frame
        finally:
            self.close()


class ReplyStream:
    """A Reply's SSE chunks for the HTTP layer. Closing it closes the reply even if the
    stream never started (a client that reset before the response head), which a
    bare async generator would not do."""

    def __init__(self, reply: Reply, request: HttpRequest):
        self.reply = reply
        self.chunks = reply.stream(request)

    def __aiter__(self) -> ReplyStream:
        return self

    async def __anext__(self) -> bytes:
        return await self.chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self.chunks.aclose()
        finally:
            self.reply.close()
