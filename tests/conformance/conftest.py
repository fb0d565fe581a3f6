"""Conformance suite: black-box checks against any OpenAI-compatible server.

Environment:
  OPENAI_BASE_URL  the base URL including /v1, e.g. http://127.0.0.1:8000/v1
                   (unset: every test here is skipped)
  OPENAI_MODEL     the model id to use (default: the first id from GET /models)
  OPENAI_API_KEY   sent as `Authorization: Bearer ...` when set

The variables are read when the first test here runs (not at import). A session
fixture named `openai_server`, if one is defined in a parent conftest, is set up first,
so it can start a server and set OPENAI_BASE_URL (and friends) in os.environ.
"""
from __future__ import annotations

import os

import pytest

from .client import Client

SKIP_REASON = ("OPENAI_BASE_URL is not set: the conformance suite needs a running "
               "OpenAI-compatible server, e.g. OPENAI_BASE_URL=http://127.0.0.1:8000/v1")


@pytest.fixture(scope="session")
def client(request: pytest.FixtureRequest) -> Client:
    try:
        request.getfixturevalue("openai_server")
    except pytest.FixtureLookupError:
        pass
    base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
    if not base_url:
        pytest.skip(SKIP_REASON)
    api = Client(base_url, os.environ.get("OPENAI_API_KEY") or None)
    try:
        resp = api.get_json("/models")
    except OSError as exc:
        pytest.fail(f"cannot reach OPENAI_BASE_URL={base_url}: {exc}", pytrace=False)
    if resp.status != 200:
        pytest.fail(f"GET {base_url}/models answered HTTP {resp.status}: {resp.body[:300]!r}",
                    pytrace=False)
    model = os.environ.get("OPENAI_MODEL", "").strip()
    if not model:
        data = resp.json().get("data") or []
        if not data:
            pytest.fail(f"GET {base_url}/models lists no model and OPENAI_MODEL is unset",
                        pytrace=False)
        model = data[0]["id"]
    api.model = model
    return api


@pytest.fixture(autouse=True)
def _requires_server(client: Client) -> None:
    """Every test here needs the server, so every test is skipped without one."""
