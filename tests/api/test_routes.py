"""The OpenAI routes through HTTP on the default model: the behaviour the black-box
conformance suite cannot see (disconnects, limits, pings, llmd's extension routes)."""
import http.client
import json
import os
import re
import socket
import struct
import time
from pathlib import Path

import pytest

from llmd.engine import fetch
from llmd.engine.native import kernel_variants
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import build_tiny_qwen35

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    aliases = ("--model-alias", "smol", "--model-alias", "org/smol")
    with running_llmd("--max-sessions", "3", "--ctx", "256", *aliases) as url:
        yield Client(url + "/v1", model=MODEL)


def port_of(client: Client) -> int:
    return int(client.base_url.rsplit(":", 1)[1].split("/")[0])


def test_health_is_ok_once_loaded(server):
    resp = server.request("GET", server.origin + "/health")
    assert resp.status == 200 and resp.json() == {"status": "ok"}


def test_model_alias_is_accepted(server):
    assert server.post_json("/chat/completions", {**server.chat_body([{"role": "user", "content": "Hi"}]),
                                                  "model": "smol", "max_tokens": 1}).status == 200


@pytest.mark.parametrize("path", ["/models/org/smol", "/models/org%2Fsmol"])
def test_a_model_id_with_a_slash_is_found_as_sent_or_percent_encoded(server, path):
    resp = server.request("GET", path)  # the openai client puts the id in the path as it is
    assert resp.status == 200 and resp.json()["id"] == "org/smol"


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


def test_a_collected_reply_whose_client_resets_is_counted_as_its_client_gone(server):
    body = json.dumps(server.chat_body([{"role": "user", "content": "Tell me a long story."}], max_tokens=200,
                                       logit_bias={"0": -100, "2": -100})).encode()
    sock = socket.create_connection(("127.0.0.1", port_of(server)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(0.2)  # generating: 200 tokens take longer
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not an end
    sock.close()
    gone = 'llmd_requests_total{route="/v1/chat/completions",status="499"}'
    deadline = time.monotonic() + 10
    while gone not in (text := server.request("GET", server.origin + "/metrics").body.decode()):
        assert time.monotonic() < deadline, [line for line in text.splitlines() if "chat/completions" in line]
        time.sleep(0.05)
    assert 'route="/v1/chat/completions",status="503"' not in text  # not the server's failure


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


SMOLLM2_GOLDEN = [c for c in json.loads((Path(__file__).parents[1] / "data" / "chat_golden.json").read_text("utf-8"))
                  ["cases"] if c["template"] == "smollm2"]


@pytest.mark.parametrize("case", SMOLLM2_GOLDEN, ids=lambda c: c["name"])
def test_apply_template_returns_the_default_models_exact_prompt(server, case):
    # the template's own rendering: a final assistant message is a turn like the others
    body = {"messages": case["messages"], "add_generation_prompt": case["add_generation_prompt"],
            "continue_final_message": False}
    if case["tools"]:
        body["tools"] = case["tools"]
    reply = server.post_json(server.origin + "/apply-template", body)
    assert reply.status == 200
    assert reply.json() == {"prompt": case["expected"]}


def test_apply_template_takes_add_generation_prompt_and_validates_the_body(server):
    messages = [{"role": "user", "content": "Hi"}]
    with_prompt = server.post_json(server.origin + "/apply-template", {"messages": messages}).json()["prompt"]
    without = server.post_json(server.origin + "/apply-template",
                               {"messages": messages, "add_generation_prompt": False}).json()["prompt"]
    assert with_prompt == without + "<|im_start|>assistant\n"
    assert without.endswith("<|im_start|>user\nHi<|im_end|>\n")
    bad = server.post_json(server.origin + "/apply-template", {"messages": messages, "add_generation_prompt": 1})
    assert bad.status == 400 and bad.json()["error"]["param"] == "add_generation_prompt"
    missing = server.post_json(server.origin + "/apply-template", {})
    assert missing.status == 400 and missing.json()["error"]["param"] == "messages"


PREFILL = [{"role": "user", "content": "List three colors."}, {"role": "assistant", "content": "1. Red\n2."}]


def test_a_final_assistant_message_is_continued_in_every_chat_api(server):
    """A prefill (as llama.cpp's server, Anthropic's API and Ollama read one): the model
    goes on from the final message's content, and the reply is what comes after it,
    exactly what a plain completion of the rendered prompt writes."""
    prompt = server.post_json(server.origin + "/apply-template", {"messages": PREFILL}).json()["prompt"]
    assert prompt.endswith("<|im_start|>user\nList three colors.<|im_end|>\n<|im_start|>assistant\n1. Red\n2.")
    plain = server.post_json("/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0})
    expected = plain.json()["choices"][0]["text"]
    chat = server.chat(PREFILL, max_tokens=8).json()
    assert chat["choices"][0]["message"]["content"] == expected
    assert chat["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]
    streamed = server.post_stream("/chat/completions", server.chat_body(PREFILL, max_tokens=8, stream=True))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed.chunks if c["choices"]) == expected
    anthropic = server.post_json(server.origin + "/v1/messages", {"model": MODEL, "max_tokens": 8, "temperature": 0,
                                                                  "messages": PREFILL}).json()
    assert anthropic["content"] == [{"type": "text", "text": expected, "citations": None}]
    count = server.post_json(server.origin + "/v1/messages/count_tokens", {"model": MODEL, "messages": PREFILL})
    assert count.json()["input_tokens"] == chat["usage"]["prompt_tokens"]
    ollama = server.post_json(server.origin + "/api/chat", {"model": MODEL, "messages": PREFILL, "stream": False,
                                                            "options": {"temperature": 0, "num_predict": 8}})
    assert ollama.json()["message"]["content"] == expected
    # continue_final_message (vLLM's flag) false: the final message is a finished turn
    finished = server.post_json(server.origin + "/apply-template",
                                {"messages": PREFILL, "continue_final_message": False}).json()["prompt"]
    assert finished == prompt + "<|im_end|>\n<|im_start|>assistant\n"
    new_turn = server.chat(PREFILL, max_tokens=1, continue_final_message=False).json()
    assert new_turn["usage"]["prompt_tokens"] > chat["usage"]["prompt_tokens"]
    # with tools offered it is still continued: their grammar lets text come first
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = server.post_json(server.origin + "/apply-template", {"messages": PREFILL, "tools": [tool]})
    assert with_tools.json()["prompt"].endswith("<|im_start|>assistant\n1. Red\n2.")
    assert server.chat(PREFILL, max_tokens=1, tools=[tool]).status == 200


@pytest.mark.parametrize("params, param, code", [
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
    ({"tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "unsupported_parameter"),
    ({"continue_final_message": "yes"}, "continue_final_message", "invalid_type"),
])
def test_a_continued_reply_refuses_output_constrained_from_its_start(server, params, param, code):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    reply = server.chat(PREFILL, max_tokens=1, tools=[tool], **params)
    error = reply.json()["error"]
    assert (reply.status, error["param"], error["code"]) == (400, param, code)
    # the same request without the prefill is served
    if param != "continue_final_message":
        assert server.chat(PREFILL[:1], max_tokens=1, tools=[tool], **params).status == 200


@pytest.mark.parametrize("last, param", [
    ({"role": "user", "content": "x"}, "continue_final_message"),
    ({"role": "assistant", "content": None,
      "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, "messages[1]"),
    ({"role": "assistant", "content": "x", "reasoning_content": "because"}, "messages[1]"),
])
def test_continue_final_message_refuses_what_cannot_be_continued(server, last, param):
    reply = server.chat([PREFILL[0], last], max_tokens=1, continue_final_message=True)
    assert (reply.status, reply.json()["error"]["param"]) == (400, param)
    # unasked, such a conversation gets a new assistant turn
    assert server.chat([PREFILL[0], last], max_tokens=1).status == 200
    shown = server.post_json(server.origin + "/apply-template", {"messages": PREFILL, "add_generation_prompt": False,
                                                                 "continue_final_message": True})
    assert (shown.status, shown.json()["error"]["param"]) == (400, "continue_final_message")
    unasked = server.post_json(server.origin + "/apply-template", {"messages": PREFILL, "add_generation_prompt": False})
    assert unasked.json()["prompt"].endswith("assistant\n1. Red\n2.<|im_end|>\n")


def test_props_shows_the_template_and_special_tokens_as_llama_cpp_does(server):
    props = server.get_json(server.origin + "/props").json()
    assert props["chat_template"].startswith("{% for message in messages %}")
    assert "You are a helpful AI assistant named SmolLM" in props["chat_template"]
    assert (props["bos_token"], props["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert props["chat_template_renderer"] == "builtin:chatml"
    assert props["default_generation_settings"] == {"n_ctx": 256}
    assert props["total_slots"] == 3
    assert props["model_alias"] == "SmolLM2-135M-Instruct"


def test_a_template_the_interpreter_cannot_parse_is_named_and_overridable(tiny_llama_factory, tmp_path):
    broken = tiny_llama_factory(chat_template="{% for m in messages %}{{ m.content }}")
    with running_llmd("--model", str(broken.path)) as url:
        client = Client(url + "/v1", model="model")
        reply = client.post_json("/chat/completions", {"model": "model", "messages": [{"role": "user", "content": "x"}]})
        error = reply.json()["error"]
        assert reply.status == 400 and error["param"] == "messages"
        assert "cannot be run by llmd's template interpreter: missing {% endfor %}" in error["message"]
        assert "no chat template" not in error["message"]
        assert client.get_json(url + "/props").json()["chat_template_renderer"] == "unavailable"
    override = tmp_path / "override.jinja"
    override.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "utf-8")
    with running_llmd("--model", str(broken.path), "--chat-template", str(override)) as url:
        client = Client(url + "/v1", model="model")
        prompt = client.post_json(url + "/apply-template", {"messages": [{"role": "user", "content": "x"}]})
        assert prompt.json() == {"prompt": "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"}
        reply = client.post_json("/chat/completions", {"model": "model", "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "x"}]})
        assert reply.status == 200 and reply.json()["usage"]["completion_tokens"] >= 1
        props = client.get_json(url + "/props").json()
        assert props["chat_template_renderer"] == "jinja" and props["chat_template"] == override.read_text("utf-8")


def test_a_template_refusing_the_conversation_is_400_with_its_message(tiny_llama_factory):
    strict = tiny_llama_factory(chat_template="{% if messages[0].role != 'system' %}"
                                              "{{ raise_exception('a system message must come first') }}{% endif %}ok")
    with running_llmd("--model", str(strict.path)) as url:
        client = Client(url + "/v1", model="model")
        reply = client.post_json(url + "/apply-template", {"messages": [{"role": "user", "content": "x"}]})
        assert reply.status == 400
        assert reply.json()["error"]["message"].endswith("refused this conversation: a system message must come first")
        ok = client.post_json(url + "/apply-template", {"messages": [{"role": "system", "content": "s"}]})
        assert ok.json() == {"prompt": "ok"}


def test_template_kwargs_the_template_does_not_read_are_refused_by_name(server):
    body = server.chat_body([{"role": "user", "content": "x"}], max_tokens=1,
                            chat_template_kwargs={"enable_thinking": False})
    reply = server.post_json("/chat/completions", body)
    assert reply.status == 400
    assert reply.json()["error"]["param"] == "chat_template_kwargs.enable_thinking"
    effort = server.post_json(server.origin + "/apply-template",
                              {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "low"})
    assert (effort.status, effort.json()["error"]["param"]) == (400, "reasoning_effort")


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}


@pytest.fixture(scope="module")
def roomy_server():
    """The default model with room for a tools block."""
    with running_llmd("--max-sessions", "5", "--ctx", "1024") as url:
        yield Client(url + "/v1", model="SmolLM2-135M-Instruct")


@pytest.mark.parametrize("reserialise", [
    lambda a: a,
    lambda a: json.dumps(json.loads(a), separators=(",", ":")),  # JSON.stringify
    lambda a: json.dumps(json.loads(a), indent=2),
])
def test_tool_call_arguments_sent_back_in_any_json_form_keep_the_session_warm(roomy_server, reserialise):
    server = roomy_server
    sid = f"canonical-{id(reserialise)}"
    user = {"role": "user", "content": "What is the weather in Paris for 3 days?"}
    first = server.post_json("/chat/completions", server.chat_body(
        [user], tools=[WEATHER_TOOL], tool_choice="required", max_tokens=60, session_id=sid)).json()
    call = first["choices"][0]["message"]["tool_calls"][0]
    sent_back = {**call, "function": {**call["function"], "arguments": reserialise(call["function"]["arguments"])}}
    second = server.post_json("/chat/completions", server.chat_body(
        [user, {"role": "assistant", "content": None, "tool_calls": [sent_back]},
         {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}],
        tools=[WEATHER_TOOL], max_tokens=1, session_id=sid)).json()
    assert "usage" in second, second
    resident = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    # everything the first request left in the cache is reused, up to the end-of-turn token
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= resident - 1


def test_llama3_family_json_reply_comes_back_as_a_tool_call_end_to_end(tiny_llama_factory):
    """A random-weight model with Llama 3.1's real template; the reply is forced by a JSON
    schema into the Llama 3.x call shape, and the server returns it as a tool call."""
    from tests.reference_data import require
    source = require("models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja").read_text("utf-8")
    model = tiny_llama_factory(chat_template=source, n_ctx=4096)
    call_shape = {"type": "object", "required": ["name", "parameters"], "additionalProperties": False,
                  "properties": {"name": {"const": "get_weather"},
                                 "parameters": {"type": "object", "required": ["city"], "additionalProperties": False,
                                                "properties": {"city": {"const": "Paris"}}}}}
    with running_llmd("--model", str(model.path), "--ctx", "4096") as url:
        client = Client(url + "/v1", model="model")
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        prompt = client.post_json(url + "/apply-template", {"messages": messages, "tools": [WEATHER_TOOL]})
        # the template writes bos_token first: the tiny vocab's is <|im_start|>
        assert prompt.json()["prompt"].startswith("<|im_start|><|start_header_id|>system<|end_header_id|>\n\n")
        assert "Cutting Knowledge Date: December 2023" in prompt.json()["prompt"]
        assert '"name": "get_weather"' in prompt.json()["prompt"]
        reply = client.post_json("/chat/completions", {
            "model": "model", "messages": messages, "tools": [WEATHER_TOOL], "max_tokens": 400, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "call", "schema": call_shape}}})
        body = reply.json()
        assert reply.status == 200, body
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] is None
        call = choice["message"]["tool_calls"][0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})


def test_refused_request_access_log_says_why(tmp_path):
    with open(tmp_path / "log", "w") as log, running_llmd("--ctx", "256", stderr=log) as url:
        client = Client(url + "/v1", model=MODEL)
        resp = client.post_json("/chat/completions", {**client.chat_body([{"role": "user", "content": "Hi"}]),
                                                      "temperature": 9})
        assert resp.status == 400
    line = next(x for x in (tmp_path / "log").read_text().splitlines() if "/v1/chat/completions 400" in x)
    assert "error=invalid_value param=temperature reason=\"Invalid value for 'temperature'" in line


# ---- log-probabilities ----------------------------------------------------------------

PPL_TEXT = ("The old lighthouse keeper climbed the spiral stairs every evening to light the lamp. "
            "Ships passing in the night relied on its steady beam to avoid the rocks below. "
            "One stormy night the power failed, and he lit the oil lamps by hand, one by one, "
            "until the whole tower glowed again. In the morning the fishermen came to thank him, "
            "bringing bread, cheese and a basket of apples from the village on the hill. ") * 2


def test_echoed_prompt_logprobs_reproduce_the_perplexity_command(server, tmp_path):
    import math
    import subprocess
    import sys
    ctx = 64
    (tmp_path / "text.txt").write_text(PPL_TEXT)
    run = subprocess.run([sys.executable, "-m", "llmd", "perplexity", "--ctx", str(ctx), "--file",
                          str(tmp_path / "text.txt")], capture_output=True, text=True, timeout=300)
    expected = json.loads(run.stdout)["ppl"]
    ids = [t for t in server.request("POST", server.origin + "/tokenize", {"content": PPL_TEXT}).json()["tokens"]]
    total, n = 0.0, 0
    for w in range(len(ids) // ctx):
        window = ids[w * ctx:(w + 1) * ctx]
        resp = server.post_json("/completions", {"model": MODEL, "prompt": window, "max_tokens": 0,
                                                 "echo": True, "logprobs": 0})
        assert resp.status == 200, resp.body
        lp = resp.json()["choices"][0]["logprobs"]
        assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == ctx
        scored = lp["token_logprobs"][ctx // 2 + 1:]
        total -= sum(scored)
        n += len(scored)
    assert math.exp(total / n) == pytest.approx(expected, rel=1e-3, abs=1e-3)


def test_echo_stream_gives_the_prompt_and_its_logprobs_first(server):
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2, "echo": True,
            "logprobs": 2, "temperature": 0}
    whole = server.post_json("/completions", body).json()["choices"][0]
    chunks = server.post_stream("/completions", {**body, "stream": True}).chunks
    first = chunks[0]["choices"][0]
    assert first["text"] == "The capital of France is"
    streamed = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in streamed) == whole["text"]
    tokens = [t for c in streamed if c["logprobs"] for t in c["logprobs"]["tokens"]]
    offsets = [o for c in streamed if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert tokens == whole["logprobs"]["tokens"] and offsets == whole["logprobs"]["text_offset"]
    assert whole["logprobs"]["top_logprobs"][0] is None and len(whole["logprobs"]["top_logprobs"][1]) == 2


def test_greedy_chat_tokens_are_their_steps_top_logprob(server):
    body = {**server.chat_body([{"role": "user", "content": "Name a colour."}]), "max_tokens": 5,
            "temperature": 0, "logprobs": True, "top_logprobs": 3}
    choice = server.post_json("/chat/completions", body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for e in content:
        assert [t["token"] for t in e["top_logprobs"]][0] == e["token"]
        assert e["logprob"] == e["top_logprobs"][0]["logprob"] <= 0
        assert [t["logprob"] for t in e["top_logprobs"]] == sorted((t["logprob"] for t in e["top_logprobs"]),
                                                                  reverse=True)
    chunks = server.post_stream("/chat/completions", {**body, "stream": True}).chunks
    streamed = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content


def test_n_probs_gives_top_logprobs_on_completions(server):
    choice = server.post_json("/completions", {"model": MODEL, "prompt": "One, two,", "max_tokens": 2,
                                               "n_probs": 4}).json()["choices"][0]
    assert [len(t) for t in choice["logprobs"]["top_logprobs"]] == [4, 4]


# ---- n > 1 --------------------------------------------------------------------------

def test_n_choices_each_sample_with_their_own_seed_and_share_the_prompt(server):
    body = {**server.chat_body([{"role": "user", "content": "Tell me a word."}]), "max_tokens": 6,
            "temperature": 1.0, "seed": 11, "n": 3}
    resp = server.post_json("/chat/completions", body).json()
    choices = resp["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    # choice i is what a single request with seed 11 + i gives
    for c in choices:
        alone = server.post_json("/chat/completions", {**body, "n": 1, "seed": 11 + c["index"]}).json()
        assert alone["choices"][0]["message"]["content"] == c["message"]["content"]
    assert len({c["message"]["content"] for c in choices}) > 1
    assert resp["usage"]["completion_tokens"] == sum(
        server.post_json("/chat/completions", {**body, "n": 1, "seed": 11 + i}).json()["usage"]["completion_tokens"]
        for i in range(3))
    assert resp["timings"]["prompt_n"] == resp["usage"]["prompt_tokens"] - resp["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_n_choices_stream_one_after_another_with_their_index(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 1.0, "seed": 3, "n": 2,
            "stream_options": {"include_usage": True}}
    whole = server.post_json("/completions", {**body, "cache_salt": "whole"}).json()
    chunks = server.post_stream("/completions", {**body, "stream": True, "cache_salt": "streamed"}).chunks
    texts = ["".join(c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i)
             for i in range(2)]
    assert texts == [c["text"] for c in whole["choices"]]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == [0, 1] and chunks[-1]["usage"] == whole["usage"]


# ---- fields real clients send ----------------------------------------------------------

def test_prompt_cache_key_routes_to_a_session_so_the_next_turn_is_warm(server):
    body = {**server.chat_body([{"role": "user", "content": "Remember the number 7."}]), "max_tokens": 2,
            "prompt_cache_key": "user-42 conversation"}
    server.post_json("/chat/completions", body)
    again = server.post_json("/chat/completions", body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    sessions = server.request("GET", server.origin + "/v1/sessions").json()["data"]
    assert any(s["id"].startswith("pck-") for s in sessions)


def test_timings_per_token_puts_timings_on_every_chunk(server):
    chunks = server.post_stream("/chat/completions", {**server.chat_body([{"role": "user", "content": "Hi"}]),
                                                      "max_tokens": 3, "stream": True,
                                                      "timings_per_token": True}).chunks
    assert chunks and all("timings" in c for c in chunks)
    assert chunks[-1]["timings"]["predicted_n"] >= 1


def test_id_slot_is_refused_pointing_to_session_id(server):
    resp = server.post_json("/completions", {"model": MODEL, "prompt": "x", "id_slot": 1})
    assert resp.status == 400 and resp.json()["error"]["param"] == "id_slot"
    assert "session_id" in resp.json()["error"]["message"]


def test_anthropic_routes_answer_unknown_routes_and_methods_in_their_shape(server):
    resp = server.request("GET", server.origin + "/v1/messages")
    assert resp.status == 405 and resp.json()["type"] == "error"


def test_embeddings_on_a_model_without_pooling_is_400_saying_so(server):
    resp = server.post_json("/embeddings", {"model": MODEL, "input": ["a", "b"]})
    assert resp.status == 400
    err = resp.json()["error"]
    assert err["code"] == "model_has_no_pooling" and "no pooling" in err["message"] and err["param"] == "model"
    assert server.post_json("/embeddings", {"model": MODEL, "input": "a", "encoding_format": "hex"}).json()[
        "error"]["param"] == "encoding_format"


# ---- responses ----------------------------------------------------------------------------

def test_a_stored_response_is_continued_warm_from_its_own_session(server):
    body = {"model": MODEL, "input": "My name is Alice.", "max_output_tokens": 5, "temperature": 0}
    first = server.post_json("/responses", body).json()
    second = server.post_json("/responses", {**body, "input": "What is my name?",
                                             "previous_response_id": first["id"]}).json()
    reused = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert reused >= first["usage"]["input_tokens"] + first["usage"]["output_tokens"] - 2
    sessions = server.request("GET", server.origin + "/v1/sessions").json()["data"]
    assert any(s["id"].startswith("resp-") for s in sessions)


def test_an_unstored_response_cannot_be_continued(server):
    first = server.post_json("/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 2,
                                            "store": False}).json()
    assert first["store"] is False
    resp = server.post_json("/responses", {"model": MODEL, "input": "Again", "max_output_tokens": 2,
                                           "previous_response_id": first["id"]})
    assert resp.status == 400 and resp.json()["error"]["code"] == "previous_response_not_found"


def test_responses_output_text_logprobs_streamed_and_not(server):
    body = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4, "temperature": 0, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    part = server.post_json("/responses", body).json()["output"][0]["content"][0]
    assert "".join(e["token"] for e in part["logprobs"]) == part["text"]
    assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["token"] == e["token"] for e in part["logprobs"])
    events = server.post_events("/responses", {**body, "stream": True}).chunks
    streamed = [e for name, ev in events if name == "response.output_text.delta" for e in ev["logprobs"]]
    assert streamed == part["logprobs"]


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


def test_n_choices_hold_their_session_until_the_last_and_free_it_when_the_client_leaves(server):
    done = server.chat([{"role": "user", "content": "Hi"}], session_id="several", max_tokens=3, n=3,
                       temperature=1.0)
    assert done.status == 200 and len(done.json()["choices"]) == 3
    assert server.get_json("/sessions/several").json()["in_flight"] == 0
    body = json.dumps(server.chat_body([{"role": "user", "content": "Tell me a long story."}], stream=True,
                                       max_tokens=200, n=3, session_id="left")).encode()
    sock = socket.create_connection(("127.0.0.1", port_of(server)))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while received.count(b"data: ") < 4:  # inside the first of three choices
        received += sock.recv(4096)
    sock.close()
    deadline = time.monotonic() + 10
    while (info := server.get_json("/sessions/left").json())["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert info["in_flight"] == 0 and info["resident_tokens"] < 200
    assert server.chat([{"role": "user", "content": "Hi"}], session_id="left", max_tokens=2).status == 200


# ---- reasoning asked of a model without it ---------------------------------------------------

@pytest.mark.parametrize("path, fields, param", [
    ("/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2000,
                   "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ("/responses", {"input": "Hi", "reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ("/responses", {"input": "Hi", "reasoning": {"effort": "low"}}, "reasoning.effort"),
])
def test_reasoning_asked_of_a_model_that_does_not_reason_is_400_naming_the_field(server, path, fields, param):
    reply = server.post_json(path, {"model": MODEL, **fields})
    error = reply.json()["error"]
    assert reply.status == 400 and error.get("param", param) == param and param in json.dumps(error), error


def test_thinking_disabled_on_a_model_that_does_not_reason_is_accepted(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "thinking": {"type": "disabled"}}
    reply = server.post_json("/messages", body)
    assert reply.status == 200 and [b["type"] for b in reply.json()["content"]] == ["text"]


# ---- return_progress (llama.cpp's prompt_progress chunks) ---------------------------------------

def test_return_progress_streams_prompt_progress_before_the_reply(server):
    messages = [{"role": "user", "content": "Count the words: " + "one two three " * 30}]
    cache = {}
    for attempt in ("cold", "warm"):  # the second request reuses the session's cache
        stream = server.post_stream("/chat/completions", server.chat_body(
            messages, stream=True, max_tokens=3, return_progress=True, session_id="progress"))
        progress = [c["prompt_progress"] for c in stream.chunks if "prompt_progress" in c]
        first, last = progress[0], progress[-1]
        assert first["processed"] == first["cache"] and last["processed"] == last["total"] > 100, progress
        assert all(p["total"] == last["total"] and p["cache"] == first["cache"] for p in progress)
        assert all(p["time_ms"] >= 0 for p in progress)
        cache[attempt] = first["cache"]
        text = [c for c in stream.chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert text and stream.chunks.index(text[0]) > max(i for i, c in enumerate(stream.chunks)
                                                            if "prompt_progress" in c)
    # Cold, only the chat template's opening may come from the prefix cache.
    assert cache["cold"] < 40 and cache["warm"] > 100, cache
    plain = server.post_stream("/completions", server.completion_body("Hello", stream=True, max_tokens=2))
    assert not [c for c in plain.chunks if "prompt_progress" in c]
    completion = server.post_stream("/completions", server.completion_body(
        "Hello", stream=True, max_tokens=2, return_progress=True))
    assert [c["choices"][0]["text"] for c in completion.chunks if "prompt_progress" in c] == ["", ""]


# ---- responses/compact: llmd's compaction holds the model's own summary ------------------------

def test_compaction_content_is_the_models_greedy_summary_of_the_conversation(server):
    import base64
    from llmd.api.responses import COMPACTION_PREFIX
    body = {"model": MODEL, "input": [{"role": "user", "content": "We launch on Tuesday."},
                                      {"role": "assistant", "content": "Noted: Tuesday."}]}
    first, again = (server.post_json("/responses/compact", body).json() for _ in range(2))
    content = first["output"][-1]["encrypted_content"]
    assert content.startswith(COMPACTION_PREFIX) and again["output"][-1]["encrypted_content"] == content
    summary = base64.b64decode(content[len(COMPACTION_PREFIX):]).decode()
    assert summary.strip() and first["usage"]["output_tokens"] > 0


MISTRAL_SHAPED_TEMPLATE = ("{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}"
                           "{% if false %}[TOOL_CALLS]{% endif %}")


def test_a_familys_control_token_opens_a_constrained_call_under_auto(tmp_path):
    """A random-weight model whose vocabulary has Mistral's [TOOL_CALLS] as a control
    token and whose template writes it: with tool_choice "auto" the model may write the
    token, which opens a call the grammar then holds to (Nemo's layout here), and it
    reaches the parser as text; free text never spells it."""
    from tests.support.gguf_writer import ARRAY, STRING, build_tiny_llama
    w = build_tiny_llama(n_vocab=300, reserved=2, chat_template=MISTRAL_SHAPED_TEMPLATE)
    tokens = list(w.get("tokenizer.ggml.tokens").value[1])
    marker = tokens.index("<|reserved_0|>")
    tokens[marker] = "[TOOL_CALLS]"
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    path = w.write(tmp_path / "mistral-shaped.gguf")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with running_llmd("--model", str(path), "--ctx", "128", "--max-sessions", "2") as url:
        client = Client(url + "/v1", model="mistral-shaped")
        body = client.chat_body([{"role": "user", "content": "hi"}], max_tokens=40, tools=[tool],
                                logit_bias={str(marker): 100}, parallel_tool_calls=False)
        choice = client.post_json("/chat/completions", body).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
            ("f", "{}")]
        body.update(logit_bias={str(marker): -100}, max_tokens=8)  # no call: text, never the marker's spelling
        message = client.post_json("/chat/completions", body).json()["choices"][0]["message"]
        assert "tool_calls" not in message or not message["tool_calls"]
        assert "[TOOL_CALLS]" not in message["content"]


def test_a_reasoning_template_sends_the_thinking_to_reasoning_content(tmp_path):
    """A generation prompt that opens <think> (as DeepSeek-R1 distills' does): what a
    random-weight model writes is all reasoning, none of it content."""
    from tests.support.gguf_writer import build_tiny_llama
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n<think>\n{% if false %}</think>{% endif %}")
    path = build_tiny_llama(chat_template=template).write(tmp_path / "thinker.gguf")
    with running_llmd("--model", str(path), "--ctx", "128", "--max-sessions", "2") as url:
        client = Client(url + "/v1", model="thinker")
        body = client.chat_body([{"role": "user", "content": "hi"}], max_tokens=6, temperature=0,
                                logit_bias={"65": 100})  # "A", over and over
        message = client.post_json("/chat/completions", body).json()["choices"][0]["message"]
        assert message["reasoning_content"] == "AAAAAA" and not message["content"]


def _family_model(tmp_path, template_name: str, controls: tuple[str, ...]) -> Path:
    """A random-weight model carrying a family's real template (tests/support/phi4_template.py
    for "phi4"), with that family's markers as control tokens of its vocabulary."""
    from tests.support.gguf_writer import ARRAY, STRING, build_tiny_llama
    from tests.support.phi4_template import PHI4_MINI_TEMPLATE
    from tests.reference_data import require
    template = PHI4_MINI_TEMPLATE if template_name == "phi4" else \
        require(f"models/templates/{template_name}").read_text("utf-8")
    w = build_tiny_llama(chat_template=template, n_ctx=4096, reserved=len(controls))  # Mistral's system prompt is long
    tokens = list(w.get("tokenizer.ggml.tokens").value[1])
    for i, marker in enumerate(controls):
        tokens[tokens.index(f"<|reserved_{i}|>")] = marker
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    return w.write(tmp_path / "family.gguf")


GEMMA4_MARKERS = ("<|tool_call>", "<tool_call|>", '<|"|>')
GLM_MARKERS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def _question(template_name: str) -> list[dict]:
    """The user's question; Nemotron Nano v2's template thinks unless asked not to (a
    random model would think on past max_tokens before its call)."""
    no_think = " /no_think" if template_name == "NVIDIA-Nemotron-Nano-v2.jinja" else ""
    return [{"role": "user", "content": "Weather in Rome?" + no_think}]


@pytest.mark.parametrize("template_name, written_as, controls", [
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", '{"name": "get_weather", "parameters": {', ()),  # Llama's JSON reply
    # Llama 3.1 and 3.3: the same JSON, as the template renders a custom tool's call back
    # (its <|python_tag|> opens built-in tools' calls only)
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", '{"name": "get_weather", "parameters": {', ()),
    ("openai-gpt-oss-120b.jinja", " to=functions.get_weather<|channel|>commentary json<|message|>{", ()),  # harmony
    # Mistral Small 3.2 and Phi-4: their markers are control tokens of the vocabulary
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "[TOOL_CALLS]get_weather[ARGS]{", ("[TOOL_CALLS]", "[ARGS]")),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", '[TOOL_CALLS][{"name": "get_weather", "arguments": {',
     ("[TOOL_CALLS]",)),
    ("phi4", '<|tool_call|>[{"name": "get_weather", "arguments": {', ("<|tool_call|>", "<|/tool_call|>")),
    ("google-gemma-4-31B-it.jinja", '<|tool_call>call:get_weather{city:<|"|>', GEMMA4_MARKERS),
    ("Qwen3-Coder.jinja", "<tool_call>\n<function=get_weather>\n<parameter=city>\n", ()),
    # GLM-4.5 and 4.6: their tags are control tokens of the vocabulary
    ("GLM-4.6.jinja", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>", GLM_MARKERS),
    ("NVIDIA-Nemotron-Nano-v2.jinja", '<TOOLCALL>[{"name": "get_weather", "arguments": {', ()),
])
def test_a_required_call_is_written_in_the_familys_own_layout(tmp_path, template_name, written_as, controls):
    """A family's real template on a random-weight model: a required call is written in
    the layout that family's model writes calls in (its markers as the control tokens
    they are), and comes back as a tool call."""
    path = _family_model(tmp_path, template_name, controls)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather now.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}
    with running_llmd("--model", str(path), "--ctx", "4096", "--max-sessions", "2") as url:
        client = Client(url + "/v1", model="family")
        body = client.chat_body(_question(template_name), max_tokens=160, tools=[tool],
                                tool_choice="required", parallel_tool_calls=False, logprobs=True)
        answer = client.post_json("/chat/completions", body).json()
        assert "choices" in answer, answer
        choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"])["city"], str)
    written = [t["token"] for t in choice["logprobs"]["content"]]
    assert "".join(written).startswith(written_as)
    assert all(marker in written for marker in controls)  # each marker one token


def test_a_thinking_model_s_constrained_reply_follows_its_reasoning(tmp_path):
    """Qwen3.5's generation prompt opens a <think> block: a constrained reply thinks
    first, and the JSON or the call follows </think> as content. (Here </think> is one
    token of the vocabulary, as in Qwen's, and logit_bias has the model close the block
    as soon as the grammar lets it.)"""
    from tests.support.gguf_writer import ARRAY, I32, STRING, build_tiny_llama
    from tests.reference_data import require
    w = build_tiny_llama(chat_template=require("models/templates/Qwen3.5-4B.jinja").read_text("utf-8"), n_ctx=4096,
                         reserved=1)
    tokens, types = list(w.get("tokenizer.ggml.tokens").value[1]), list(w.get("tokenizer.ggml.token_type").value[1])
    close = tokens.index("<|reserved_0|>")
    tokens[close], types[close] = "</think>", 4  # a user-defined token, written as its text
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, types))
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
              "additionalProperties": False}
    with running_llmd("--model", str(w.write(tmp_path / "thinks.gguf")), "--ctx", "4096") as url:
        client = Client(url + "/v1", model="thinks")
        for extra in ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
                      {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                       "tool_choice": "required"}):
            body = client.chat_body([{"role": "user", "content": "JSON, please."}], max_tokens=200,
                                    logit_bias={str(close): 100}, **extra)
            message = client.post_json("/chat/completions", body).json()["choices"][0]["message"]
            assert message.get("reasoning_content") in (None, ""), message
            if "tools" in extra:
                (call,) = message["tool_calls"]
                assert isinstance(json.loads(call["function"]["arguments"])["a"], int)
            else:
                assert isinstance(json.loads(message["content"])["a"], int), message


# Every kind of value the argument syntaxes spell differently: raw and quoted text
# (bounded, unbounded, enum), bounded integers, numbers, booleans, nested objects,
# arrays, optional members.
STRICT_WEATHER = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"], "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "note": {"type": "string"},
        "metric": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2},
        "where": {"type": "object", "additionalProperties": False, "required": ["lat"], "properties": {
            "lat": {"type": "number", "minimum": -90, "maximum": 90}, "label": {"type": "string"}}}}}}}
STRICT_TIME = {"type": "function", "function": {"name": "get_time", "strict": True, "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}}}}


@pytest.mark.parametrize("template_name, controls", [
    ("google-gemma-4-31B-it.jinja", GEMMA4_MARKERS),
    ("Qwen3-Coder.jinja", ()),
    ("GLM-4.6.jinja", GLM_MARKERS),
    ("NVIDIA-Nemotron-Nano-v2.jinja", ()),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", ("<|python_tag|>",)),
])
def test_constrained_calls_in_a_familys_layout_parse_and_validate_for_any_sampling(tmp_path, template_name,
                                                                                  controls):
    """Whatever a random-weight model samples under the grammar of a family's own layout
    (tool_choice "required" or a named function, strict schemas, streamed or not,
    several seeds) reads back through that family's parser as calls of the tools it
    allows, whose arguments satisfy the tool's schema: the grammar admits nothing the
    parser cannot read. The bias towards the bytes markers are made of (`<`, `|`, `/`,
    `"`, `,`) has strings try to spell them and objects take their optional members."""
    from tests.support.schema_validator import errors
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (STRICT_WEATHER, STRICT_TIME)}
    path = _family_model(tmp_path, template_name, controls)
    with running_llmd("--model", str(path), "--ctx", "4096", "--max-sessions", "2") as url:
        client = Client(url + "/v1", model="family")
        for seed in range(6):
            named = seed % 3 == 2
            choice = {"type": "function", "function": {"name": "get_time"}} if named else "required"
            tools = [STRICT_WEATHER] if seed % 3 == 0 else [STRICT_WEATHER, STRICT_TIME]
            body = client.chat_body(_question(template_name), max_tokens=160,
                                    temperature=1.0, seed=seed, tools=tools, tool_choice=choice,
                                    parallel_tool_calls=seed % 2 == 0, logit_bias={str(ord(c)): 4 for c in '<|/",'})
            if seed % 2:
                stream = client.post_stream("/chat/completions", {**body, "stream": True})
                assert stream.status == 200, stream.body
                deltas = [c["choices"][0] for c in stream.chunks if c.get("choices")]
                parts = [p for d in deltas for p in d["delta"].get("tool_calls") or []]
                calls = {}
                for p in parts:
                    call = calls.setdefault(p["index"], {"name": p["function"].get("name"), "arguments": ""})
                    call["arguments"] += p["function"]["arguments"]
                content = "".join(d["delta"].get("content") or "" for d in deltas)
                finish = deltas[-1]["finish_reason"]
                calls = [calls[i] for i in sorted(calls)]
            else:
                answer = client.post_json("/chat/completions", body).json()
                assert "choices" in answer, answer
                finish = answer["choices"][0]["finish_reason"]
                content = answer["choices"][0]["message"]["content"] or ""
                calls = [c["function"] for c in answer["choices"][0]["message"]["tool_calls"]]
            assert finish == "tool_calls" and not content, (seed, content)
            assert calls and (len(calls) == 1 or seed % 2 == 0), (seed, calls)
            for call in calls:
                assert call["name"] == "get_time" or not named, (seed, call)
                arguments = json.loads(call["arguments"])
                assert errors(arguments, schemas[call["name"]]) == [], (seed, call)


def test_models_meta_names_the_kernel_variant_the_engine_runs(server):
    """/v1/models says which kernel variant computes the answers (native/src/kernels/):
    the fastest this CPU runs, unless LLMD_KERNELS chose another."""
    fastest = [v.name for v in kernel_variants() if v.runs][-1]
    for path in ("/models", "/models/smol"):
        resp = server.request("GET", path)
        assert resp.status == 200
        body = resp.json()
        meta = (body["data"][0] if "data" in body else body)["meta"]
        assert meta["kernels"] == (os.environ.get("LLMD_KERNELS") or fastest)
        # and how the KV cache is stored (the default: f16 keys and values, 64 bytes per 32 values)
        assert (meta["kv_type_k"], meta["kv_type_v"]) == ("f16", "f16")
        assert meta["kv_bytes_per_token"] == 23040 and meta["bytes_per_session"] > 23040 * 256


def test_speculative_decoding_shows_in_timings_and_metrics_and_changes_no_token(server):
    """The server speculates by default (prompt lookup): a reply that copies its prompt
    has drafts accepted, its tokens equal a request's that turns speculation off, and
    /metrics counts the drafts."""
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu " * 2
    body = server.completion_body(text, max_tokens=40, logprobs=2)
    on = server.post_json("/completions", body).json()
    off = server.post_json("/completions", {**body, "speculative": False}).json()
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    assert on["choices"][0]["logprobs"] == off["choices"][0]["logprobs"]
    assert 0 < on["timings"]["draft_n_accepted"] <= on["timings"]["draft_n"]
    assert off["timings"]["draft_n"] == 0
    metrics = server.request("GET", server.origin + "/metrics").body.decode()
    accepted = re.search(r'^llmd_draft_tokens_accepted_total\{drafter="ngram"\} (\S+)$', metrics, re.M)
    assert accepted and float(accepted.group(1)) >= on["timings"]["draft_n_accepted"]


def test_speculative_bounds_past_the_servers_are_400(server):
    body = {**server.completion_body("Hi", max_tokens=2), "speculative.n_max": 8, "speculative.n_min": 20}
    resp = server.post_json("/completions", body)
    assert resp.status == 400 and resp.json()["error"]["param"] == "speculative.n_min"
    body = {**server.completion_body("Hi", max_tokens=2), "speculative.n_max": 4, "speculative.n_min": 4}
    assert server.post_json("/completions", body).status == 200


def test_a_draft_model_drafts_and_changes_no_token_greedy_or_seeded():
    """--draft-model (here the model itself, so that greedy drafts are all accepted and a
    sampled reply's are not): /v1/models names it, replies equal those without
    speculation, and timings and /metrics count its drafts. A draft model as slow as the
    model never pays: the server's first reply drafts until its costs are timed, and
    pacing may leave the next without drafts."""
    path = str(fetch.default_model(fetch=False))
    with running_llmd("--max-sessions", "3", "--ctx", "512", "--draft-model", path) as url:
        client = Client(url + "/v1", model=MODEL)
        meta = client.get_json("/models").json()["data"][0]["meta"]
        assert meta["speculative"] == "draft" and meta["draft_model"] == "SmolLM2-135M-Instruct.Q4_1"
        messages = [{"role": "user", "content": "Write a short poem about the sea."}]
        for extra in ({}, {"temperature": 0.9, "seed": 3}):
            body = client.chat_body(messages, max_tokens=40, logprobs=True, top_logprobs=2, **extra)
            on = client.post_json("/chat/completions", body).json()
            off = client.post_json("/chat/completions", {**body, "speculative": False}).json()
            assert on["choices"][0] == off["choices"][0], extra
            assert off["timings"]["draft_n"] == 0
            if not extra:
                assert 0 < on["timings"]["draft_n_accepted"] == on["timings"]["draft_n"]
        metrics = client.request("GET", client.origin + "/metrics").body.decode()
        assert re.search(r'^llmd_draft_tokens_total\{drafter="draft"\} [1-9]', metrics, re.M)


def test_the_model_s_prediction_block_drafts_and_changes_no_token_greedy_or_seeded(tmp_path):
    """--speculative mtp on a tiny Qwen3.5 with a multi-token-prediction block: /v1/models
    names the drafter, replies equal those without speculation, and timings and
    /metrics count its drafts (a logit bias narrows the model and the block alike to
    three ids, so that random weights agree now and then)."""
    path = build_tiny_qwen35(n_ctx=512, nextn=1).write(tmp_path / "qwen35-nextn.gguf")
    with running_llmd("--model", str(path), "--max-sessions", "3", "--ctx", "512", "--speculative", "mtp") as url:
        client = Client(url + "/v1", model="qwen35-nextn")
        assert client.get_json("/models").json()["data"][0]["meta"]["speculative"] == "mtp"
        drafted = 0
        for extra in ({}, {"temperature": 0.9, "seed": 3}):
            body = client.completion_body("the lighthouse keeper", max_tokens=40, logprobs=2,
                                          logit_bias={str(i): 6 for i in range(40, 43)}, **extra)
            on = client.post_json("/completions", body).json()
            off = client.post_json("/completions", {**body, "speculative": False}).json()
            assert on["choices"][0] == off["choices"][0], extra
            assert off["timings"]["draft_n"] == 0
            drafted += on["timings"]["draft_n"]
        metrics = client.request("GET", client.origin + "/metrics").body.decode()
        assert drafted > 0 and re.search(r'^llmd_draft_tokens_total\{drafter="mtp"\} [1-9]', metrics, re.M)


def test_streams_with_stop_strings_and_n_choices_are_the_same_with_speculation(server):
    """Each speculated token goes through the plain path: streamed deltas, a stop string
    cut, seeded choices and their finish reasons equal a request's without speculation."""
    text = "one two three four five six seven eight nine ten " * 3
    for extra in ({"stop": ["seven"]}, {"n": 2, "temperature": 0.9, "seed": 5}):
        replies = []
        for flag in (True, False):
            stream = server.completion_stream(text, max_tokens=30, speculative=flag, **extra)
            deltas = [(c["choices"][0]["index"], c["choices"][0]["text"], c["choices"][0].get("finish_reason"))
                      for c in stream.chunks if isinstance(c, dict) and c.get("choices")]
            replies.append(deltas)
        joined = "".join(t for _, t, _ in replies[0])
        assert replies[0] == replies[1] and joined
        if "stop" in extra:
            assert "seven" not in joined and replies[0][-1][2] == "stop"
