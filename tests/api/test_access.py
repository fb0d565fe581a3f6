"""Access control (llmd/api/access.py) through a real server on the tiny model: every route
with no key, a wrong key and the right key; CORS preflight and response headers; the
bind-address warning; and that prompt text reaches the log only with --log-prompts."""
import json
import socket

import pytest

from llmd.api.access import AccessPolicy, exposure_warning, is_loopback
from tests.conformance.client import Client
from tests.conftest import llmd_process

KEY, OTHER_KEY = "sk-right-0123456789", "second-key"
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def server(tiny_model):
    flags = ("--model", str(tiny_model.path), "--api-key", KEY, "--api-key", OTHER_KEY,
             "--cors-origin", ORIGIN, "--max-sessions", "4")
    with llmd_process(*flags) as llmd:
        yield llmd.url


def chat_body(**extra) -> dict:
    return {"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


# (method, path, body, status with the right key); the session routes run after the
# chat that creates "guarded", and DELETE comes last.
ROUTES = [
    ("GET", "/v1/models", None, 200),
    ("GET", "/models", None, 200),
    ("GET", "/v1/models/model", None, 200),
    ("POST", "/v1/chat/completions", chat_body(session_id="guarded"), 200),
    ("POST", "/v1/completions", {"model": "model", "prompt": "hi", "max_tokens": 2}, 200),
    ("POST", "/tokenize", {"content": "hi"}, 200),
    ("POST", "/detokenize", {"tokens": [1, 2]}, 200),
    ("GET", "/v1/sessions", None, 200),
    ("GET", "/metrics", None, 200),
    ("GET", "/v1/sessions/guarded", None, 200),
    ("POST", "/v1/sessions/guarded/reset", None, 200),
    ("POST", "/v1/responses", {"model": "model", "input": "hi", "max_output_tokens": 2}, 200),
    ("POST", "/v1/messages", {"model": "model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
     200),
    ("POST", "/v1/messages/count_tokens", {"model": "model", "messages": [{"role": "user", "content": "hi"}]}, 200),
    ("GET", "/no/such/route", None, 404),
    ("DELETE", "/v1/sessions/guarded", None, 200),
]

NO_KEY = {}
WRONG_KEYS = [{"Authorization": "Bearer sk-wrong"}, {"X-Api-Key": KEY[:-1]},
              {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"},
              {"Authorization": "Bearer"}]


def assert_401(resp) -> None:
    assert resp.status == 401, (resp.status, resp.body[:200])
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert resp.json()["error"]["type"] == "authentication_error"  # both shapes name it so


def test_every_route_but_health_needs_a_key(server):
    client = Client(server)
    for i, (method, path, body, status) in enumerate(ROUTES):
        assert_401(client.request(method, path, body, NO_KEY))
        for wrong in WRONG_KEYS:
            assert_401(client.request(method, path, body, wrong))
        # Both header forms, both configured keys, any case of "Bearer".
        right = [{"Authorization": f"Bearer {KEY}"}, {"X-Api-Key": OTHER_KEY},
                 {"Authorization": f"bearer  {OTHER_KEY}"}][i % 3]
        resp = client.request(method, path, body, right)
        assert resp.status == status, (method, path, resp.status, resp.body[:200])


def test_health_and_the_status_page_need_no_key(server):
    for method in ("GET", "HEAD"):
        assert Client(server).request(method, "/health").status == 200
        page = Client(server).request(method, "/")
        assert page.status == 200 and page.content_type == "text/html"
    assert_401(Client(server).request("POST", "/"))


def test_a_session_cannot_be_listed_or_deleted_without_the_key(server):
    client, keyed = Client(server), Client(server, api_key=KEY)
    assert keyed.post_json("/v1/chat/completions", chat_body(session_id="kept")).status == 200
    assert_401(client.request("DELETE", "/v1/sessions/kept"))
    assert_401(client.request("GET", "/v1/sessions"))
    listed = keyed.get_json("/v1/sessions").json()["data"]
    assert "kept" in [s["id"] for s in listed]  # the unauthenticated DELETE changed nothing


def test_preflight_from_an_allowed_origin_is_answered_without_a_key(server):
    resp = Client(server).request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
    assert resp.status == 204 and resp.body == b""
    assert resp.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    assert resp.headers["Access-Control-Allow-Headers"] == "authorization, content-type, x-stainless-os"
    assert resp.headers["Vary"] == "Origin"


def test_preflight_from_another_origin_gets_no_cors_headers(server):
    resp = Client(server).request("OPTIONS", "/v1/chat/completions", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert resp.status == 401
    assert "Access-Control-Allow-Origin" not in resp.headers


def test_responses_carry_cors_headers_for_the_allowed_origin_only(server):
    client = Client(server, api_key=KEY)
    ok = client.request("GET", "/v1/models", headers={"Origin": ORIGIN})
    assert ok.status == 200 and ok.headers["Access-Control-Allow-Origin"] == ORIGIN
    refused = Client(server).request("GET", "/v1/models", headers={"Origin": ORIGIN})
    assert refused.status == 401 and refused.headers["Access-Control-Allow-Origin"] == ORIGIN
    other = client.request("GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert other.status == 200 and "Access-Control-Allow-Origin" not in other.headers
    plain = client.request("GET", "/v1/models")
    assert "Access-Control-Allow-Origin" not in plain.headers


def test_keys_from_the_environment_and_cors_off_by_default(tiny_model):
    with llmd_process("--model", str(tiny_model.path), env={"LLMD_API_KEY": "env-one,env-two"}) as llmd:
        client = Client(llmd.url)
        assert_401(client.request("GET", "/v1/models"))
        for key in ("env-one", "env-two"):
            assert client.request("GET", "/v1/models", headers={"X-Api-Key": key}).status == 200
        preflight = client.request("OPTIONS", "/v1/models", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
        assert preflight.status == 401 and "Access-Control-Allow-Origin" not in preflight.headers


def test_any_origin_with_a_star(tiny_model):
    with llmd_process("--model", str(tiny_model.path), "--cors-origin", "*") as llmd:
        resp = Client(llmd.url).request("GET", "/v1/models", headers={"Origin": "https://x.example"})
        assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "*"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("llm.example", False)])
def test_loopback_hosts_are_recognised(host, loopback):
    assert is_loopback(host) is loopback


def test_binding_beyond_loopback_without_a_key_warns():
    warning = exposure_warning("0.0.0.0", AccessPolicy())
    assert warning is not None and "--api-key" in warning and "0.0.0.0" in warning
    assert exposure_warning("0.0.0.0", AccessPolicy(api_keys=("k",))) is None
    assert exposure_warning("127.0.0.1", AccessPolicy()) is None


# ---- prompt text in the log -----------------------------------------------------------

SECRET = "zebracorn-7731"


def chat_and_read_log(tiny_model, tmp_path, *flags: str) -> tuple[str, str]:
    log_path = tmp_path / "llmd.log"
    with open(log_path, "w") as log, llmd_process("--model", str(tiny_model.path), *flags,
                                                  stderr=log) as llmd:
        body = {"model": "model", "messages": [{"role": "user", "content": f"my secret is {SECRET}"}],
                "max_tokens": 6, "temperature": 0}
        reply = Client(llmd.url).post_json("/v1/chat/completions", body).json()
    return reply["choices"][0]["message"]["content"], log_path.read_text()


def test_prompts_and_completions_are_not_logged_by_default(tiny_model, tmp_path):
    content, log = chat_and_read_log(tiny_model, tmp_path)
    assert "POST /v1/chat/completions 200" in log  # the access log is there
    assert SECRET not in log and "prompt_text=" not in log
    if content.strip():
        assert json.dumps(content, ensure_ascii=False) not in log


def test_log_prompts_logs_both_texts(tiny_model, tmp_path):
    content, log = chat_and_read_log(tiny_model, tmp_path, "--log-prompts")
    line = next(line for line in log.splitlines() if "prompt_text=" in line)
    assert SECRET in line
    assert line.endswith("completion_text=" + json.dumps(content, ensure_ascii=False))


def test_a_stored_response_is_found_only_with_the_key_that_made_it(server):
    mine = Client(server + "/v1", api_key=KEY)
    first = mine.post_json("/responses", {"model": "model", "input": "hi", "max_output_tokens": 2}).json()
    follow = {"model": "model", "input": "more", "max_output_tokens": 2, "previous_response_id": first["id"]}
    assert mine.post_json("/responses", follow).status == 200
    other = Client(server + "/v1", api_key=OTHER_KEY).post_json("/responses", follow)
    assert other.status == 400 and other.json()["error"]["code"] == "previous_response_not_found"


def test_anthropic_clients_authenticate_with_x_api_key(server):
    body = {"model": "model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    ok = Client(server + "/v1").request("POST", "/messages", body, {"x-api-key": KEY,
                                                                     "anthropic-version": "2023-06-01"})
    assert ok.status == 200 and ok.json()["type"] == "message"
    refused = Client(server + "/v1").request("POST", "/messages", body, {"x-api-key": "wrong"})
    assert refused.status == 401 and refused.json()["type"] == "error"


# ---- browsers on a server without a key (DNS rebinding, cross-site requests) ----------

EVIL = "https://evil.example"


@pytest.fixture(scope="module")
def keyless(tiny_model):
    flags = ("--model", str(tiny_model.path), "--max-sessions", "4", "--allowed-host", "llmd.lan")
    with llmd_process(*flags) as llmd:
        yield Client(llmd.url)


def test_a_foreign_host_name_is_refused_without_a_key(keyless):
    for path in ("/v1/sessions", "/v1/models", "/health"):
        resp = keyless.request("GET", path, headers={"Host": f"evil.example:{keyless.origin.rsplit(':', 1)[1]}"})
        assert resp.status == 403, (path, resp.status)
        assert resp.json()["error"]["code"] == "host_not_allowed" and "--allowed-host" in resp.json()["error"]["message"]


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8000", "127.0.0.1:1", "[::1]:8000", "llmd.lan",
                                  "192.168.1.20:8000", "[fe80::1]"])
def test_this_servers_own_names_and_ip_addresses_are_served(keyless, host):
    assert keyless.request("GET", "/v1/sessions", headers={"Host": host}).status == 200


def test_this_machines_own_name_is_served(keyless):
    assert keyless.request("GET", "/v1/sessions", headers={"Host": f"{socket.gethostname()}:8000"}).status == 200


def test_a_foreign_host_is_served_with_a_key(server):
    resp = Client(server, api_key=KEY).request("GET", "/v1/models", headers={"Host": "evil.example"})
    assert resp.status == 200  # a page cannot present the key, so the name does not matter


def test_a_page_from_another_origin_cannot_reset_or_drive_a_session(keyless):
    assert keyless.request("POST", "/v1/chat/completions", chat_body(session_id="mine")).status == 200
    for method, path, body in [("POST", "/v1/sessions/mine/reset", None), ("DELETE", "/v1/sessions/mine", None),
                               ("POST", "/v1/chat/completions", chat_body(session_id="mine"))]:
        resp = keyless.request(method, path, body, headers={"Origin": EVIL})
        assert resp.status == 403 and resp.json()["error"]["code"] == "origin_not_allowed", (method, path)
    assert keyless.get_json("/v1/sessions/mine").json()["resident_tokens"] > 0  # untouched
    same_origin = keyless.request("POST", "/v1/sessions/mine/reset", headers={"Origin": keyless.origin})
    assert same_origin.status == 200  # the status page's own requests


@pytest.mark.parametrize("origin", ["http://[::1", "http://[", "https://[v1.x]:99999"])
def test_an_origin_that_is_not_a_url_is_refused_not_failed(keyless, origin):
    resp = keyless.request("DELETE", "/v1/sessions/mine", headers={"Origin": origin})
    assert resp.status == 403 and resp.json()["error"]["code"] == "origin_not_allowed"


def test_a_body_not_declared_as_json_is_415(keyless):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        resp = keyless.request("POST", "/v1/sessions/x/reset", json.dumps(chat_body()).encode(),
                               headers={"Content-Type": content_type})
        assert resp.status == 415, content_type
        assert resp.json()["error"]["code"] == "unsupported_media_type"
    ok = keyless.request("POST", "/tokenize", b'{"content": "hi"}',
                         headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status == 200


def test_an_empty_x_api_key_next_to_a_valid_bearer_token_is_accepted(server):
    resp = Client(server, api_key=KEY).request("GET", "/v1/models", headers={"X-Api-Key": ""})
    assert resp.status == 200
    assert_401(Client(server).request("GET", "/v1/models", headers={"X-Api-Key": ""}))
