"""Who may call llmd: API keys, browser origins (CORS), and the bind-address warning.

`Guard` wraps the HTTP application. With API keys configured, every request except
`GET /health` and `GET /` (the status page, which asks for the key itself; both with
their HEAD) must present one, as `Authorization: Bearer KEY` or
`X-Api-Key: KEY`, else it gets 401 `authentication_error` with `WWW-Authenticate`;
unknown paths are refused the same way, so an anonymous caller learns nothing about
the routes. Keys are compared through their SHA-256 digests with
`hmac.compare_digest`, against every configured key, so neither the key's content
nor its length shows in the time an answer takes.

Browsers. A web page the user visits can make the browser send requests to llmd,
so without an API key three checks keep pages from using it: the Host header must
name this server (the bound address, localhost, an IP literal, or one of the
allowed hosts: the machine's name and each `--allowed-host`), which defeats DNS rebinding, where a page's own name is made
to resolve to 127.0.0.1 (an IP literal cannot be rebound); a POST, DELETE, PUT or
PATCH from a browser page (an Origin header) must come from this server's own
origin or a configured CORS origin; and a request body must be declared
`application/json`, which a page cannot send cross-origin without a preflight.
The last check holds with API keys too, so that clients behave the same everywhere.

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
from urllib.parse import urlsplit

from llmd import errors
from llmd.api.answers import error_response, error_shape
from llmd.http.server import App, HttpRequest, Response, StreamResponse
from llmd.serving.session_store import KEY_TAG

OPEN_PATHS = ("/health", "/")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_UNSAFE_METHODS = ("POST", "DELETE", "PUT", "PATCH")
PREFLIGHT_MAX_AGE = "600"
_CORS_METHODS = "GET, POST, DELETE, OPTIONS"


@dataclass(frozen=True)
class AccessPolicy:
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()     # "*" allows any origin
    bound_host: str = "127.0.0.1"          # the --host the server listens on
    allowed_hosts: tuple[str, ...] = ()    # more Host names accepted without an API key


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class Guard:
    """The HTTP application behind API-key checks and CORS (see module doc)."""

    def __init__(self, app: App, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy
        self._keys = [_digest(k.encode("utf-8")) for k in policy.api_keys]
        self._hosts = {h.lower().strip("[]") for h in (*LOCAL_HOSTS, policy.bound_host, *policy.allowed_hosts)}

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        origin = self._allowed_origin(request.headers.get("origin"))
        if (origin is not None and request.method == "OPTIONS"
                and "access-control-request-method" in request.headers):
            return Response(204, headers=self._preflight_headers(origin, request))
        refusal = self._refusal(request, origin)
        principal = self._principal(request) if self._keys else ""
        if refusal is not None:
            response: Response | StreamResponse = error_response(refusal, error_shape(request.path))
        elif self._keys and not self._is_open(request) and principal is None:
            response = error_response(errors.authentication(), error_shape(request.path))
        else:
            request.principal = principal or ""
            if principal:  # the key in the access log, as session logs name it (shown)
                request.log["key"] = principal[:KEY_TAG]
            response = await self.app(request)
        if origin is not None:
            response.headers += [("Access-Control-Allow-Origin", origin), ("Vary", "Origin"),
                                 ("Access-Control-Expose-Headers", "Retry-After")]
        return response

    def _refusal(self, request: HttpRequest, cors_origin: str | None) -> errors.ApiError | None:
        """Why a browser-borne request is refused (see the module doc), or None."""
        host = request.headers.get("host")
        if not self._keys and host is not None and not self._known_host(host):
            return errors.forbidden(
                f"Host {host!r} is not this server's name; start llmd with --allowed-host "
                "NAME to serve it (or with --api-key).", "host_not_allowed")
        origin = request.headers.get("origin")
        if (origin is not None and request.method in _UNSAFE_METHODS and cors_origin is None
                and _netloc(origin) != (host or "").lower()):
            return errors.forbidden(
                f"requests from pages of {origin} are not allowed; start llmd with "
                "--cors-origin to allow them", "origin_not_allowed")
        media = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
        if request.body and media != "application/json":
            return errors.unsupported_media_type(
                "the request body must be JSON, sent with Content-Type: application/json")
        return None

    def _known_host(self, host: str) -> bool:
        try:
            name = urlsplit("//" + host).hostname
        except ValueError:
            return False
        if not name:
            return False
        try:
            ipaddress.ip_address(name)
            return True  # an address, not a name: nothing to rebind
        except ValueError:
            return name in self._hosts

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

    def _principal(self, request: HttpRequest) -> str | None:
        """The configured key the request presents, as its digest in hex (what the
        prefix cache's "key" scope compares), or None when it presents none of them."""
        presented = [request.headers.get("x-api-key") or ""]
        scheme, _, token = (request.headers.get("authorization") or "").strip().partition(" ")
        if scheme.lower() == "bearer":
            presented.append(token.strip())
        matched = None
        for value in filter(None, presented):  # an empty header is no key, not a wrong one
            # Header values arrive decoded as latin-1: encoding back gives the bytes sent.
            digest = _digest(value.encode("latin-1"))
            for key in self._keys:  # no early exit: the time does not say which key matched
                if hmac.compare_digest(digest, key) and matched is None:
                    matched = key.hex()
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


def _netloc(origin: str) -> str | None:
    """An Origin's host and port, lowercased; None for one that is not a URL (an
    unclosed IPv6 bracket, say), which matches no host."""
    try:
        return urlsplit(origin).netloc.lower()
    except ValueError:
        return None
