"""The tokenizer routes in llama.cpp's shape (POST /tokenize, POST /detokenize), and
the bound on text length that every route which tokenizes text checks first."""
from __future__ import annotations

from llmd import errors
from llmd.api import validation
from llmd.api.answers import json_response
from llmd.api.validation import parse
from llmd.engine.native import Engine
from llmd.http.server import HttpRequest, Response
from llmd.serving.runtime import Runtime

DETOKENIZE_CHUNK = 4096  # ids turned into text per executor call, so other streams step in between


class TextLimit:
    """No token covers more text than the model's longest piece, so text longer than the
    context times that cannot fit: it is refused before the executor spends seconds
    tokenizing it while every stream waits."""

    def __init__(self, engine: Engine):
        longest = max((len(engine.piece(i, special=True)) for i in range(engine.info.n_vocab)), default=1)
        self.n_ctx = engine.info.n_ctx
        self.max_bytes = self.n_ctx * max(longest, 1)

    def check(self, text: str, param: str) -> None:
        if len(text) * 4 > self.max_bytes:  # else it fits: no need to encode it
            n_bytes = len(text.encode("utf-8", "surrogatepass"))
            if n_bytes > self.max_bytes:
                raise errors.text_too_long(n_bytes, self.max_bytes, self.n_ctx, param)


class TokenizerRoutes:
    """Text to token ids (optionally with each id's piece) and ids back to text."""

    def __init__(self, engine: Engine, runtime: Runtime, text_limit: TextLimit):
        self.engine, self.info, self.runtime, self.text_limit = engine, engine.info, runtime, text_limit

    async def tokenize(self, request: HttpRequest) -> Response:
        req = await parse(validation.parse_tokenize_request, request.body)
        self.text_limit.check(req.content, "content")
        ids = await self.runtime.call(self.engine.tokenize, req.content, True)
        if req.add_special:  # as llama-server: BOS and EOS where the model adds them
            bos = [self.info.bos_id] if self.info.add_bos else []
            ids = bos + ids + ([self.info.eos_id] if self.info.add_eos else [])
        if not req.with_pieces:
            return json_response({"tokens": ids})
        pieces = []
        for i in range(0, len(ids), DETOKENIZE_CHUNK):
            pieces += await self.runtime.call(self._pieces, ids[i:i + DETOKENIZE_CHUNK])
        return json_response({"tokens": pieces})

    def _pieces(self, ids: list[int]) -> list[dict]:
        pieces = []
        for i in ids:
            raw = self.engine.piece(i, special=True)
            try:
                pieces.append({"id": i, "piece": raw.decode("utf-8")})
            except UnicodeDecodeError:
                pieces.append({"id": i, "piece": list(raw)})
        return pieces

    async def detokenize(self, request: HttpRequest) -> Response:
        req = await parse(self._parse_detokenize, request.body)
        data = b"".join([await self.runtime.call(self.engine.detokenize, req.tokens[i:i + DETOKENIZE_CHUNK], True)
                         for i in range(0, len(req.tokens), DETOKENIZE_CHUNK)])
        return json_response({"content": data.decode("utf-8", "replace")})

    def _parse_detokenize(self, body: bytes) -> validation.DetokenizeRequest:
        req = validation.parse_detokenize_request(body)
        validation.check_vocab(req, self.info.n_vocab)  # a pass over every id: with the parse
        return req
