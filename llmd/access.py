"""Who may call llmd: API keys, browser origins (CORS), and the bind-address warning.

`Guard` wraps the HTTP application. With API keys configured, every request except
`GET /health` and `GET /` (the status page, which asks for the key itself; both with
their HEAD) must present one, as `Authorization: Bearer KEY` or
`X-Api-Key: KEY`, else it gets 401 `authentication_error` with `WWW-Authenticate`;
unknown paths are refused the same way, so an anonymous caller learns nothing about
the routes. Keys are compared through their SHA-256 digests with
`hmac.compare_digest`, against every configured key, so neither the key's content
nor its length shows in the time an answer takes.

CORS is off unless origins are configured. For a configured origin (or any, with
"*"), a preflight (OPTIONS with Access-Control-Request-Method) is answered 204
before authentication, since browsers never send credentials on a preflight, and
every other response carries Access-Control-Allow-Origin. Other origins get no CORS
header at all, so the browser keeps the response from the page.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass

from llmd import errors
from llmd.api import error_response, error_shape
from llmd.server import App, HttpRequest, Response, StreamResponse

OPEN_PATHS = ("/health", "/")
PREFLIGHT_MAX_AGE = "600"
_CORS_METHODS = "GET, POST, DELETE, OPTIONS"


@dataclass(frozen=True)
class AccessPolicy:
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()     # "*" allows any origin


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class Guard:
    """The HTTP application behind API-key checks and CORS (see module doc)."""

    def __init__(self, app: App, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy
        self._keys = [_digest(k.encode("utf-8")) for k in policy.api_keys]

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        origin = self._allowed_origin(request.headers.get("origin"))
        if (origin is not None and request.method == "OPTIONS"
                and "access-control-request-method" in request.headers):
            return Response(204, headers=self._preflight_headers(origin, request))
        if self._keys and not self._is_open(request) and not self._authorized(request):
            response: Response | StreamResponse = error_response(errors.authentication(), error_shape(request.path))
        else:
            response = await self.app(request)
        if origin is not None:
            response.headers += [("Access-Control-Allow-Origin", origin), ("Vary", "Origin"),
                                 ("Access-Control-Expose-Headers", "Retry-After")]
        return response

    def _allowed_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for this request, or None for no CORS."""
        if origin is None or not self.policy.cors_origins:
            return None
        if "*" in self.policy.cors_origins:
            return "*"
        return origin if origin in self.policy.cors_origins else None

    def _preflight_headers(self, origin: str, request: HttpRequest) -> list[tuple[str, str]]:
        headers = [("Access-Control-Allow-Origin", origin), ("Vary", "Origin"),
                   ("Access-Control-Allow-Methods", _CORS_METHODS),
                   ("Access-Control-Max-Age", PREFLIGHT_MAX_AGE)]
        # OpenAI clients send headers of their own (x-stainless-*, openai-*): whatever
        # the browser asks for is allowed, since the key, not the header, is the check.
        asked = request.headers.get("access-control-request-headers")
        if asked:
            headers.append(("Access-Control-Allow-Headers", asked))
        return headers

    @staticmethod
    def _is_open(request: HttpRequest) -> bool:
        return request.method in ("GET", "HEAD") and request.path in OPEN_PATHS

    def _authorized(self, request: HttpRequest) -> bool:
        presented = request.headers.get("x-api-key")
        if presented is None:
            scheme, _, token = (request.headers.get("authorization") or "").strip().partition(" ")
            if scheme.lower() != "bearer":
                return False
            presented = token.strip()
        # Header values arrive decoded as latin-1: encoding back gives the bytes sent.
        digest = _digest(presented.encode("latin-1"))
        matched = False
        for key in self._keys:  # no early exit: the time does not say which key matched
            matched |= hmac.compare_digest(digest, key)
        return matched


def is_loopback(host: str) -> bool:
    """True if binding `host` accepts connections from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def exposure_warning(host: str, policy: AccessPolicy) -> str | None:
    """The start-up warning for serving other machines without an API key, if any."""
    if policy.api_keys or is_loopback(host):
        return None
    return (f"listening on {host}, which other machines can reach, with no API key: anyone "
            "who can connect may use the model and read or delete sessions. "
            "Pass --api-key (or LLMD_API_KEY), or bind 127.0.0.1.")
