"""Fill-in-the-middle prompts: the code before a gap and after it, laid out with the
model's FIM markers (`Markers`) so that what it writes next is the middle.

The layout is llama.cpp's server's (/infill), so a code model answers as it does there:

    [REP] "myproject\n"                 if the model has a repository marker
    [SEP] name "\n" text                per extra file (input_extra); without a file
                                        separator "\n\n--- snippet ---\n\n" text
    [SEP] "filename\n"                  the current file, with a file separator
    [BOS] [PRE] prefix middle [SUF] suffix [MID]

`middle` is text typed after the prefix that the completion continues (llama.cpp's
`prompt`). Where llama.cpp puts the extra files before BOS, llmd puts BOS first (the
caller's PromptIds adds it).

Every text is tokenized as plain text: marker text inside the code stays text.

`LineLimits` ends a completion as llama.cpp's `n_indent` and `t_max_predict_ms` do.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

REPOSITORY = "myproject\n"       # llama.cpp's placeholders for the repository and file names
CURRENT_FILE = "filename\n"
SNIPPET = "\n\n--- snippet ---\n\n"  # what separates extra files for a model without a file separator
WINDOW = 2048  # the most tokens prefix, middle and suffix take together (3:1 prefix to suffix)
PREDICT = 128  # the tokens a request that does not say how many may make, for fitting its prompt


class Markers(Protocol):
    """A model's fill-in-the-middle token ids (the engine's info.fim)."""
    pre: int
    suf: int
    mid: int
    rep: int | None  # the repository name's, if it has one
    sep: int | None  # the file separator, if it has one


@dataclass(frozen=True)
class ExtraFile:
    """Context from another file, put before the current one."""
    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class FimPrompt:
    ids: list[int]
    truncated: bool  # the prefix, the suffix or the extra files lost tokens to fit


def build(fim: Markers, tokenize: Callable[[str], list[int]], prefix: str | list[int], suffix: str,
          middle: str = "", extra: Sequence[ExtraFile] = (), room: int | None = None) -> FimPrompt:
    """The prompt's ids. `tokenize(text)` gives a text's ids (no control tokens); the
    prefix may come as ids already. With `room` (the tokens the prompt may take) the
    prompt is fitted as llama.cpp fits it: the end of the prefix and the start of the
    suffix within a window of WINDOW tokens (at most half the room), 3:1, the middle
    whole; the newest extra files' tokens in the room beyond a whole window, so that
    where they start does not move with the prefix and suffix (a session's cache keeps
    them from one request to the next). Without `room` nothing is cut."""
    pre = tokenize(prefix) if isinstance(prefix, str) else list(prefix)
    suf, mid = tokenize(suffix), tokenize(middle)
    head = _files(fim, tokenize, extra)
    truncated = False
    if room is not None:
        window = max(0, min(WINDOW, room // 2))
        keep_pre = min(len(pre), 3 * (window // 4))
        keep_suf = min(len(suf), max(0, window // 4 - 2 - len(mid)))
        keep_head = min(len(head), max(0, room - window - 3))  # 3: the markers
        truncated = (keep_pre, keep_suf, keep_head) != (len(pre), len(suf), len(head))
        pre, suf, head = pre[len(pre) - keep_pre:], suf[:keep_suf], head[len(head) - keep_head:]
    return FimPrompt(head + [fim.pre] + pre + mid + [fim.suf] + suf + [fim.mid], truncated)


def clip(prefix: str, suffix: str, extra: Sequence[ExtraFile], chars: int) -> tuple[str, str, list[ExtraFile], bool]:
    """The last `chars` characters of the prefix, the first of the suffix and the last
    of the extra files' text together (the newest files'), and whether anything was
    cut. When `chars` is at least the room times the longest token's bytes, fitting
    could keep no more of any of them, so what is cut here is never tokenized."""
    kept, left = [], chars
    for f in reversed(extra):
        if left <= 0:
            break
        kept.insert(0, ExtraFile(f.text[-left:], f.filename) if len(f.text) > left else f)
        left -= len(f.text)
    cut = len(prefix) > chars or len(suffix) > chars or len(kept) < len(extra) or left < 0
    return prefix[-chars:], suffix[:chars], kept, cut


def _files(fim: Markers, tokenize: Callable[[str], list[int]], extra: Sequence[ExtraFile]) -> list[int]:
    """The repository and extra files' part, before the current file's markers."""
    ids = [fim.rep] + tokenize(REPOSITORY) if fim.rep is not None else []
    for f in extra:
        ids += [fim.sep] + tokenize(f.filename + "\n") if fim.sep is not None else tokenize(SNIPPET)
        ids += tokenize(f.text)
    if fim.sep is not None:
        ids += [fim.sep] + tokenize(CURRENT_FILE)
    return ids


class LineLimits:
    """Where a code completion's lines end it, as llama.cpp's server ends them:
    - `indent`: a line after the first whose indentation (spaces and tabs) is shorter
      ends the text just before its first other character (an empty line too);
    - `max_ms`: a piece of text holding a newline, once that long has passed since
      the first piece, is the last.
    Same contract as StopMatcher.feed: (the text to emit, whether it ended here)."""

    def __init__(self, indent: int = 0, max_ms: int = 0, clock: Callable[[], float] = time.monotonic):
        self.indent, self.max_ms, self.clock = indent, max_ms, clock
        self.hit = False
        self._started: float | None = None
        self._column: int | None = None  # indentation so far of a line after the first; None past it

    def feed(self, text: str) -> tuple[str, bool]:
        if self.hit:
            return "", True
        now = self.clock()
        if self._started is None:
            self._started = now
        if self.indent:
            for i, ch in enumerate(text):
                if self._column is not None and ch not in " \t":
                    if self._column < self.indent:
                        self.hit = True
                        return text[:i], True
                    self._column = None
                if ch == "\n":
                    self._column = 0
                elif self._column is not None:
                    self._column += 1
        if self.max_ms and "\n" in text and (now - self._started) * 1000 > self.max_ms:
            self.hit = True
        return text, self.hit
