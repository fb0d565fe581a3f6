"""Log-probabilities as the OpenAI surfaces show them, from what the engine gives:
a token's logprob and its step's top list of (id, logprob), most likely first.

Pure: token ids become text through the `piece` function the caller passes (raw
bytes of a token; a token may hold part of a UTF-8 character, so its text is
decoded with replacement and its `bytes` are given as OpenAI does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Piece = Callable[[int], bytes]
Top = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class TokenLogprob:
    id: int
    logprob: float | None  # None: the prompt's first token, which nothing predicts
    top: Top | None        # None where logprob is None


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def chat_content(tokens: list[TokenLogprob], piece: Piece) -> list[dict]:
    """Chat completions `logprobs.content` entries."""
    out = []
    for t in tokens:
        raw = piece(t.id)
        top = [{"token": _text(piece(i)), "logprob": lp, "bytes": list(piece(i))} for i, lp in t.top or ()]
        out.append({"token": _text(raw), "logprob": t.logprob, "bytes": list(raw), "top_logprobs": top})
    return out


def legacy(tokens: list[TokenLogprob], piece: Piece, offset: int) -> dict:
    """Legacy completions `logprobs`: parallel lists, `text_offset` counting characters
    from `offset` (where the first token's text starts in the choice's text)."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        text = _text(piece(t.id))
        out["tokens"].append(text)
        out["token_logprobs"].append(t.logprob)
        out["top_logprobs"].append(None if t.top is None else {_text(piece(i)): lp for i, lp in t.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def prompt_tokens(ids: list[int], scores: list[tuple[float, Top]]) -> list[TokenLogprob]:
    """The prompt's tokens with the engine's scores of ids[1:]; the first has none."""
    first = [TokenLogprob(ids[0], None, None)] if ids else []
    return first + [TokenLogprob(i, lp, top) for i, (lp, top) in zip(ids[1:], scores)]
