"""The OpenAI routes through HTTP on the default model: the behaviour the black-box
conformance suite cannot see (disconnects, limits, pings, llmd's extension routes)."""
import http.client
import json
import socket
import time

import pytest

from tests.conformance.client import Client
from tests.conftest import running_llmd

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    with running_llmd("--max-sessions", "3", "--ctx", "256", "--model-alias", "smol") as url:
        yield Client(url + "/v1", model=MODEL)


def port_of(client: Client) -> int:
    return int(client.base_url.rsplit(":", 1)[1].split("/")[0])


def test_health_is_ok_once_loaded(server):
    resp = server.request("GET", server.origin + "/health")
    assert resp.status == 200 and resp.json() == {"status": "ok"}


def test_model_alias_is_accepted(server):
    assert server.post_json("/chat/completions", {**server.chat_body([{"role": "user", "content": "Hi"}]),
                                                  "model": "smol", "max_tokens": 1}).status == 200


def test_unknown_model_lists_the_served_ids(server):
    resp = server.post_json("/chat/completions", {**server.chat_body([{"role": "user", "content": "Hi"}]),
                                                  "model": "gpt-4"})
    assert resp.status == 404
    assert "SmolLM2-135M-Instruct" in resp.json()["error"]["message"]


def test_prompt_over_the_context_is_400_with_counts(server):
    resp = server.completion("word " * 400)
    error = resp.json()["error"]
    assert resp.status == 400 and error["code"] == "context_length_exceeded"
    assert "256" in error["message"]


def test_max_tokens_beyond_the_room_left_is_clamped_to_length(server):
    prompt = "one two three " * 60  # about 180 tokens of a 256-token context
    body = server.completion_body(prompt, max_tokens=100000, logit_bias={"0": -100, "2": -100})
    reply = server.post_json("/completions", body).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"] == 256


def test_tokenize_and_detokenize_round_trip(server):
    ids = server.post_json(server.origin + "/tokenize", {"content": "Hello world"}).json()["tokens"]
    assert ids == [19556, 905]
    pieces = server.post_json(server.origin + "/tokenize", {"content": "Hi", "with_pieces": True}).json()
    assert pieces["tokens"] == [{"id": 26843, "piece": "Hi"}]
    text = server.post_json(server.origin + "/detokenize", {"tokens": ids}).json()["content"]
    assert text == "Hello world"
    bad = server.post_json(server.origin + "/detokenize", {"tokens": [49152]})
    assert bad.status == 400 and bad.json()["error"]["param"] == "tokens[0]"


def test_control_tokens_in_user_content_stay_text(server):
    body = server.chat_body([{"role": "user", "content": "<|im_end|>"}], max_tokens=1)
    plain = server.post_json("/chat/completions", body).json()["usage"]["prompt_tokens"]
    body = server.chat_body([{"role": "user", "content": "x"}], max_tokens=1)
    one = server.post_json("/chat/completions", body).json()["usage"]["prompt_tokens"]
    assert plain > one  # "<|im_end|>" became several text tokens, not the one control id


def test_client_disconnect_mid_stream_frees_the_session(server):
    body = json.dumps(server.chat_body([{"role": "user", "content": "Tell me a long story."}],
                                       stream=True, max_tokens=200, session_id="gone")).encode()
    sock = socket.create_connection(("127.0.0.1", port_of(server)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while received.count(b"data: ") < 4:
        received += sock.recv(4096)
    sock.close()
    deadline = time.monotonic() + 10
    while (info := server.get_json("/sessions/gone").json())["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert info["in_flight"] == 0
    assert info["resident_tokens"] < 200  # cancelled long before max_tokens
    follow_up = server.chat([{"role": "user", "content": "Hi"}], session_id="gone", max_tokens=2)
    assert follow_up.status == 200


def test_pipelined_keep_alive_requests_are_answered_in_order(server):
    conn = http.client.HTTPConnection("127.0.0.1", port_of(server), timeout=60)
    for n in (1, 2, 3):
        conn.request("POST", "/v1/completions", json.dumps(server.completion_body("Count:", max_tokens=n)),
                     {"Content-Type": "application/json"})
        reply = json.loads(conn.getresponse().read())
        assert reply["usage"]["completion_tokens"] <= n
    conn.close()


# ---- constrained output (response_format, tool_choice) ------------------------------

CITY_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}


def test_json_object_answer_parses(server):
    body = server.chat_body([{"role": "user", "content": "Describe a dog."}], max_tokens=40,
                            response_format={"type": "json_object"})
    reply = server.post_json("/chat/completions", body).json()
    assert isinstance(json.loads(reply["choices"][0]["message"]["content"]), dict)
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


def test_json_schema_on_completions_is_followed(server):
    schema = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "maxItems": 4}
    body = server.completion_body("Numbers:", max_tokens=20, response_format={
        "type": "json_schema", "json_schema": {"name": "numbers", "schema": schema}})
    value = json.loads(server.post_json("/completions", body).json()["choices"][0]["text"])
    assert len(value) <= 4 and all(isinstance(v, int) and 1 <= v <= 9 for v in value)


def test_required_tool_choice_returns_a_call_with_schema_valid_arguments(server):
    body = server.chat_body([{"role": "user", "content": "Weather in Rome?"}], max_tokens=40,
                            tools=[CITY_TOOL], tool_choice="required", parallel_tool_calls=False)
    choice = server.post_json("/chat/completions", body).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 20


def test_named_tool_call_streams_its_arguments_in_pieces(server):
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = server.chat_stream([{"role": "user", "content": "Weather in Rome?"}], max_tokens=40,
                                tools=[CITY_TOOL], tool_choice=named, parallel_tool_calls=False)
    assert stream.status == 200
    parts = [p for c in stream.chunks if c.get("choices") for p in c["choices"][0]["delta"].get("tool_calls", [])]
    assert parts[0]["id"].startswith("call_") and parts[0]["function"]["name"] == "get_weather"
    assert len(parts) > 2 and all("id" not in p and p["index"] == 0 for p in parts[1:])
    assert "city" in json.loads("".join(p["function"]["arguments"] for p in parts))
    assert stream.chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_schema_keyword_outside_the_subset_is_400_naming_it(server):
    body = server.chat_body([{"role": "user", "content": "Hi"}], response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "pattern": "^a"}}})
    resp = server.post_json("/chat/completions", body)
    error = resp.json()["error"]
    assert resp.status == 400 and error["code"] == "unsupported_parameter" and "'pattern'" in error["message"]


# ---- big inputs never hold the engine thread for long ---------------------------------

def test_text_too_long_for_the_context_is_refused_by_its_size_before_tokenizing(server):
    text = "word " * 5000  # 25000 bytes: more than 256 tokens of at most 81 bytes can hold
    for path, body, param in [
            (server.origin + "/tokenize", {"content": text}, "content"),
            ("/completions", server.completion_body(text), "prompt"),
            ("/chat/completions", server.chat_body([{"role": "user", "content": text}]), "messages")]:
        resp = server.post_json(path, body)
        error = resp.json()["error"]
        assert resp.status == 400 and error["code"] == "context_length_exceeded", (path, error)
        assert error["param"] == param and "at most 20736 bytes" in error["message"]
        assert ("25000 bytes" if param != "messages" else "bytes") in error["message"]
    fits = server.post_json(server.origin + "/tokenize", {"content": "word " * 4000}).json()["tokens"]
    assert len(fits) > 256  # under the size bound, text longer than the context still tokenizes


def test_detokenize_of_many_ids_is_done_in_pieces_and_equals_the_whole(server):
    ids = server.post_json(server.origin + "/tokenize", {"content": "Hello world, again. " * 1000}).json()["tokens"]
    assert len(ids) > 4096  # more than one piece of work for the engine thread
    text = server.post_json(server.origin + "/detokenize", {"tokens": ids}).json()["content"]
    assert text == "Hello world, again. " * 1000
    pieces = server.post_json(server.origin + "/tokenize", {"content": "Hello world, again. " * 1000,
                                                           "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == text
