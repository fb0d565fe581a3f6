"""JSON answers: a body, or an ApiError in the shape its route answers in (Anthropic's
on the Messages routes, Ollama's on its /api/ routes, OpenAI's everywhere else), with
its access-log fields.
"""
from __future__ import annotations

import json

from llmd import errors
from llmd.api import anthropic, ollama
from llmd.errors import ApiError, error_body, refusal_log
from llmd.http.server import Response


def json_response(obj: object, status: int = 200, headers: list[tuple[str, str]] | None = None,
                  log: dict | None = None) -> Response:
    return Response(status, json.dumps(obj, ensure_ascii=False).encode(), headers or [],
                    log=log if log is not None else {})


def error_shape(path: str) -> str:
    """The error shape a route answers in: Anthropic's on the Messages routes, Ollama's
    on its /api/ routes."""
    if path.startswith(anthropic.PATHS):
        return errors.ANTHROPIC
    return errors.OLLAMA if path.startswith(ollama.PATH) else errors.OPENAI


def error_response(err: ApiError, shape: str = errors.OPENAI) -> Response:
    """The JSON error answer for err, its access-log line saying why."""
    return json_response(error_body(err, shape), err.status, list(err.headers.items()), log=refusal_log(err))


def transport_refusal(status: int, message: str, code: str, kind: str, path: str | None) -> Response:
    """How the HTTP server words a refusal of its own (llmd.http.server.Refusal): in its
    route's shape where the path is known, else OpenAI's."""
    err = ApiError(status, message, kind, None, code)
    shape = errors.OPENAI if path is None else error_shape(path)
    return Response(status, json.dumps(error_body(err, shape)).encode(), log=refusal_log(err))
