"""The one place that maps failures to an HTTP status and an OpenAI error body.

Every refusal in llmd is an `ApiError`. The HTTP layer turns one into a response
with `err.status`, `err.headers` and `error_body(err)`; after SSE headers have gone
out it sends `error_body(err)` as one `data:` event instead. Anything that is not
an `ApiError` (a bug, a native engine failure) goes through `as_api_error` and
becomes a 500 `server_error`.

Body shape, always with all four keys (OpenAI clients index them unconditionally):

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

The Anthropic Messages routes answer in Anthropic's shape instead, from the same
ApiError (`error_body(err, ANTHROPIC)`):

    {"type": "error", "error": {"type": str, "message": str}}

and Ollama's /api/ routes in Ollama's (`error_body(err, OLLAMA)`): {"error": str}.
"""

from __future__ import annotations

import json
from typing import Iterable


class ApiError(Exception):
    """A request failure with its HTTP status, OpenAI error fields and extra headers."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers: dict[str, str] = dict(headers or {})

    def __repr__(self) -> str:
        return (f"ApiError({self.status}, {self.message!r}, type={self.type!r}, "
                f"param={self.param!r}, code={self.code!r})")


OPENAI, ANTHROPIC, OLLAMA = "openai", "anthropic", "ollama"  # the error shapes a route may answer in

# Anthropic names its error types by status; 503 is its "overloaded_error".
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def error_body(err: ApiError, shape: str = OPENAI) -> dict:
    """Return the error envelope for `err` in `shape`: OpenAI's (all four inner keys
    present), Anthropic's or Ollama's (the message alone)."""
    if shape == OLLAMA:
        return {"error": err.message}
    if shape == ANTHROPIC:
        kind = _ANTHROPIC_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}}
    if shape != OPENAI:
        raise ValueError(f"unknown error shape {shape!r}")
    return {"error": {"message": err.message, "type": err.type,
                      "param": err.param, "code": err.code}}


def refusal_log(err: ApiError) -> dict:
    """Access-log fields saying why a request was refused: its code, the parameter
    and the message (quoted, so the line stays one line of key=value pairs)."""
    fields = {"error": err.code or err.type}
    if err.param:
        fields["param"] = err.param
    fields["reason"] = json.dumps(err.message[:200], ensure_ascii=False)
    return fields


def as_api_error(exc: BaseException) -> ApiError:
    """Return `exc` itself if it is an ApiError, else a 500 server_error describing it.

    The exception's text is kept (truncated) because native errors carry the engine's
    own reason, which is what an operator needs; llmd serves one machine, not tenants.
    """
    if isinstance(exc, ApiError):
        return exc
    detail = str(exc).strip()[:500] or type(exc).__name__
    return server_error(f"internal server error: {detail}")


# --- 400 invalid_request_error -------------------------------------------------

def invalid_request(message: str, param: str | None = None,
                    code: str | None = "invalid_value") -> ApiError:
    """400 invalid_request_error; `code` defaults to invalid_value."""
    return ApiError(400, message, "invalid_request_error", param, code)


def invalid_json(message: str = "request body is not valid JSON") -> ApiError:
    """400 with code invalid_json: the body could not be read as a JSON object."""
    return invalid_request(message, None, "invalid_json")


def invalid_type(param: str, expected: str, value: object) -> ApiError:
    """400 with code invalid_type: `param` holds a value of the wrong JSON type."""
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {json_type_name(value)}.",
        param, "invalid_type")


def missing_parameter(param: str) -> ApiError:
    """400 with code missing_required_parameter."""
    return invalid_request(f"Missing required parameter: '{param}'.", param,
                           "missing_required_parameter")


def unknown_parameter(param: str) -> ApiError:
    """400 with code unknown_parameter: a field llmd does not know at all."""
    return invalid_request(f"Unrecognized request argument supplied: '{param}'.", param,
                           "unknown_parameter")


def unsupported_parameter(param: str, message: str | None = None) -> ApiError:
    """400 with code unsupported_parameter: a known field (or value) llmd cannot honour."""
    return invalid_request(
        message or f"Unsupported parameter: '{param}' is not supported by this server.",
        param, "unsupported_parameter")


def context_length_exceeded(n_prompt: int, n_ctx: int, param: str | None = "messages") -> ApiError:
    """400 with code context_length_exceeded: the prompt alone does not fit the context."""
    return invalid_request(
        f"This model's maximum context length is {n_ctx} tokens, but the prompt has "
        f"{n_prompt} tokens. Please shorten the input.",
        param, "context_length_exceeded")


def text_too_long(n_bytes: int, limit: int, n_ctx: int, param: str) -> ApiError:
    """400 context_length_exceeded for text refused by its size, before tokenizing."""
    return invalid_request(
        f"The {param} text is {n_bytes} bytes; this model's context of {n_ctx} tokens holds at most "
        f"{limit} bytes of text, so it cannot fit. Please shorten the input.",
        param, "context_length_exceeded")


def invalid_session_id(message: str, param: str | None = "session_id") -> ApiError:
    """400 with code invalid_session_id."""
    return invalid_request(message, param, "invalid_session_id")


def unsupported_session(message: str = "this engine serves a single session; "
                        "named sessions are not available") -> ApiError:
    """400 with code unsupported_session: named sessions on a single-session engine."""
    return invalid_request(message, "session_id", "unsupported_session")


# --- other statuses -------------------------------------------------------------

def authentication(message: str = "Invalid or missing API key.") -> ApiError:
    """401 authentication_error with `WWW-Authenticate: Bearer`."""
    return ApiError(401, message, "authentication_error", None, "invalid_api_key",
                    {"WWW-Authenticate": "Bearer"})


def forbidden(message: str, code: str) -> ApiError:
    """403 permission_error: the request may not be served to where it came from."""
    return ApiError(403, message, "permission_error", None, code)


def unsupported_media_type(message: str) -> ApiError:
    """415 with code unsupported_media_type: the body is not declared as JSON."""
    return ApiError(415, message, "invalid_request_error", None, "unsupported_media_type")


def not_found(message: str, code: str = "not_found", param: str | None = None) -> ApiError:
    """404 not_found_error; codes used: not_found, model_not_found, session_not_found."""
    return ApiError(404, message, "not_found_error", param, code)


def model_not_found(model: str) -> ApiError:
    """404 for a model id this server does not serve."""
    return not_found(f"The model '{model}' does not exist.", "model_not_found", "model")


def session_not_found(session_id: str) -> ApiError:
    """404 for a session id with no session behind it."""
    return not_found(f"No session with id '{session_id}'.", "session_not_found", "session_id")


def method_not_allowed(allowed: Iterable[str]) -> ApiError:
    """405 with an `Allow` header listing the methods the route accepts."""
    methods = ", ".join(allowed)
    return ApiError(405, f"Method not allowed; allowed: {methods}.", "invalid_request_error",
                    None, "method_not_allowed", {"Allow": methods})


def capacity_exhausted(retry_after: int = 1,
                       message: str = "All session slots are in use; retry later.") -> ApiError:
    """429 capacity_error with `Retry-After` (whole seconds, at least 0)."""
    return ApiError(429, message, "capacity_error", None, "capacity_exhausted",
                    {"Retry-After": str(max(0, int(retry_after)))})


def client_closed() -> ApiError:
    """499 (nginx's "client closed request"): the client went away before its answer
    was ready. Nobody reads it; the access log and the request count show it."""
    return ApiError(499, "The client closed the connection before its answer was ready.", "invalid_request_error",
                    None, "client_closed_request")


def unavailable(message: str = "The server is not ready.",
                retry_after: int | None = None) -> ApiError:
    """503 unavailable_error, with `Retry-After` when `retry_after` is given."""
    headers = {} if retry_after is None else {"Retry-After": str(max(0, int(retry_after)))}
    return ApiError(503, message, "unavailable_error", None, "unavailable", headers)


def server_error(message: str = "internal server error") -> ApiError:
    """500 server_error."""
    return ApiError(500, message, "server_error", None, "server_error")


def json_type_name(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
