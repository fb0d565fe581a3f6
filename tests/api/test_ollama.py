"""Ollama's API (llmd/api/ollama.py): requests as the chat and completion requests they
become, and the routes on a server of a tiny model, against the OpenAI routes' answers
to the same requests."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmd.api import ollama
from llmd.api.validation import ChatRequest, CompletionRequest
from llmd.errors import ApiError
from tests.api.test_embeddings import build as build_embedding_model
from tests.conformance.client import Client
from tests.conftest import running_llmd


def refused(parse, body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(json.dumps(body).encode())
    return caught.value


# ---- requests -----------------------------------------------------------------------------

def test_options_start_from_ollamas_defaults_and_map_to_the_sampling_fields():
    plain = ollama.parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert plain.stream and plain.sampling == ollama.DEFAULTS and plain.max_tokens is None
    req = ollama.parse_chat_request(json.dumps({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False, "keep_alive": "5m",
        "options": {"temperature": 0.2, "top_k": 5, "top_p": 0.5, "min_p": 0.1, "seed": 7, "repeat_penalty": 1.3,
                    "presence_penalty": 0.5, "frequency_penalty": 0.25, "num_predict": 12, "stop": ["\n\n"],
                    "num_ctx": 4096, "num_thread": 8, "mirostat": 0, "typical_p": 1.0, "repeat_last_n": 64}}).encode())
    s = req.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.2, 5, 0.5, 0.1, 7)
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.3, 0.5, 0.25)
    assert (req.stream, req.max_tokens, req.stop) == (False, 12, ["\n\n"])
    assert ollama.parse_chat_request(b'{"model": "m", "messages": [], "options": {"num_predict": -1}}').max_tokens \
        is None


def test_options_are_read_as_ollama_reads_them():
    req = ollama.parse_chat_request(json.dumps({"model": "m", "messages": [], "logprobs": False,
                                                "options": {"seed": -1, "top_k": 40.0, "repeat_last_n": -1,
                                                            "stop": [f"<|{i}|>" for i in range(10)],
                                                            "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
                                                            "penalize_newline": True, "f16_kv": True}}).encode())
    assert (req.sampling.seed, req.sampling.top_k, req.sampling.repeat_last_n) == (None, 40, -1)  # -1: random
    assert len(req.stop) == 10
    empty = ollama.parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "x", "images": []}]}')
    assert empty.messages[0].content == "x"


@pytest.mark.parametrize("options, param", [
    ({"mirostat": 2}, "options.mirostat"),
    ({"typical_p": True}, "options.typical_p"),
    ({"repeat_last_n": -2}, "options.repeat_last_n"),
    ({"temperature": "hot"}, "options.temperature"),
    ({"top_k": 40.5}, "options.top_k"),
    ({"num_predict": 0}, "options.num_predict"),
    ({"stop": ["x"] * 65}, "options.stop"),
    ({"stop": ["x", ""]}, "options.stop[1]"),
    ({"nmu_predict": 5}, "options.nmu_predict"),
])
def test_options_llmd_cannot_honour_are_refused_by_name(options, param):
    err = refused(ollama.parse_chat_request, {"model": "m", "messages": [], "options": options})
    assert (err.status, err.param) == (400, param)


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "model"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images"),
    ({"model": "m", "messages": [], "keep_alive": True}, "keep_alive"),
    ({"model": "m", "messages": [], "logprobs": True}, "logprobs"),
    ({"model": "m", "messages": [], "think": "very"}, "think"),
    ({"model": "m", "messages": [], "format": "yaml"}, "format"),
    ({"model": "m", "messages": [], "keep_alive": []}, "keep_alive"),
    ({"model": "m", "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"model": "m", "messages": [], "context": [1, 2]}, "context"),
])
def test_bad_chat_requests_are_400_naming_the_field(body, param):
    err = refused(ollama.parse_chat_request, body)
    assert (err.status, err.param) == (400, param)


def test_tool_calls_get_ids_in_order_and_results_answer_the_call_of_their_name():
    req = ollama.parse_chat_request(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "content": "", "thinking": "two tools", "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "time", "arguments": {}}}]},
        {"role": "tool", "content": "12:00", "tool_name": "time"},
        {"role": "tool", "content": "sunny"}]}).encode())
    call = req.messages[1]
    assert call.reasoning == "two tools"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in call.tool_calls] == [
        ("call_1", "weather", {"city": "Paris"}), ("call_2", "time", {})]
    assert [(m.tool_call_id, m.content) for m in req.messages[2:]] == [("call_2", "12:00"), ("call_1", "sunny")]


def test_format_and_think_become_the_response_format_and_the_reasoning_asked_for():
    req = ollama.parse_chat_request(b'{"model": "m", "messages": [], "format": "json", "think": false}')
    assert req.response_format.type == "json_object" and req.reasoning is False
    req = ollama.parse_chat_request(b'{"model": "m", "messages": [], "format": {"type": "object"}, "think": "low"}')
    assert (req.response_format.type, req.response_format.schema) == ("json_schema", {"type": "object"})
    assert req.reasoning is True and req.template_kwargs == {"reasoning_effort": "low"}


@pytest.mark.parametrize("body, param", [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": ["a", 5]}, "input[1]"),
    ({"model": "m", "input": ["a", ""]}, "input[1]"),
    ({"model": "m", "input": ["a"] * 2049}, "input"),
    ({"model": "m", "input": "a", "truncate": True}, "truncate"),
    ({"model": "m", "input": "a", "options": {"bogus": 1}}, "options.bogus"),
])
def test_bad_embed_requests_are_400_naming_the_field(body, param):
    err = refused(ollama.parse_embed_request, body)
    assert (err.status, err.param) == (400, param)


def test_stream_lines_escape_what_line_readers_also_end_lines_at_and_pings_are_lines_of_nothing():
    line = ollama.OllamaFormat._encode({"response": "a\u2028b\u2029c\x85d é"})
    assert line.count(b"\n") == 1 and json.loads(line) == {"response": "a\u2028b\u2029c\x85d é"}
    assert "\u2028\u2029\x85" not in line.decode().replace("\n", "") and len(line.decode().splitlines()) == 1
    ping = json.loads(ollama.OllamaFormat(True, 0.0, "m").ping)
    assert ping["done"] is False and ping["message"] == {"role": "assistant", "content": ""}


def test_generate_is_a_chat_of_system_and_prompt_unless_raw_or_with_a_suffix():
    chat = ollama.parse_generate_request(b'{"model": "m", "prompt": "hi", "system": "be brief"}')
    assert isinstance(chat, ChatRequest) and [(m.role, m.content) for m in chat.messages] == [
        ("system", "be brief"), ("user", "hi")]
    raw = ollama.parse_generate_request(b'{"model": "m", "prompt": "def f(", "raw": true, "stream": false}')
    assert isinstance(raw, CompletionRequest) and (raw.prompt, raw.suffix, raw.stream) == ("def f(", "", False)
    fim = ollama.parse_generate_request(b'{"model": "m", "prompt": "def f(", "suffix": "  return x"}')
    assert isinstance(fim, CompletionRequest) and fim.suffix == "  return x"
    assert refused(ollama.parse_generate_request, {"model": "m", "prompt": "x", "raw": True, "system": "s"}).param \
        == "system"


# ---- the routes -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tiny_llama_factory):
    return tiny_llama_factory(n_ctx=512)


@pytest.fixture(scope="module")
def server(model):
    with running_llmd("--model", str(model.path), "--max-sessions", "2") as url:
        yield Client(url, model=Path(model.path).stem)


def lines(reply) -> list[dict]:
    assert reply.content_type == ollama.NDJSON, reply.headers
    return [json.loads(line) for line in reply.body.decode().splitlines()]


CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "options": {"temperature": 0, "num_predict": 12}}


def test_a_chat_streams_ndjson_lines_whose_text_is_the_collected_reply(server):
    streamed = lines(server.post_json("/api/chat", {"model": server.model + ":latest", **CHAT}))
    *parts, last = streamed
    assert all(not p["done"] and p["message"]["role"] == "assistant" for p in parts)
    assert last["done"] and last["done_reason"] in ("stop", "length") and last["message"]["content"] == ""
    assert last["eval_count"] >= len(parts) >= 1 and last["prompt_eval_count"] > 0  # a part of UTF-8 shows later
    assert last["total_duration"] >= last["eval_duration"] > 0
    whole = server.post_json("/api/chat", {"model": server.model, "stream": False, **CHAT}).json()
    assert whole["done"] and whole["message"]["content"] == "".join(p["message"]["content"] for p in parts)
    openai = server.post_json("/v1/chat/completions", {"model": server.model, "messages": CHAT["messages"],
                                                       "temperature": 0, "max_tokens": 12,
                                                       "repetition_penalty": 1.1}).json()  # Ollama's default
    assert openai["choices"][0]["message"]["content"] == whole["message"]["content"]


def test_generate_runs_the_template_or_with_raw_the_prompt_as_it_is(server):
    options = {"temperature": 0, "num_predict": 8}
    chat = server.post_json("/api/generate", {"model": server.model, "system": "Be brief.", "prompt": "Hi",
                                              "stream": False, "options": options}).json()
    openai = server.post_json("/v1/chat/completions", {
        "model": server.model, "temperature": 0, "max_tokens": 8, "repetition_penalty": 1.1,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}).json()
    assert chat["response"] == openai["choices"][0]["message"]["content"]
    raw = lines(server.post_json("/api/generate", {"model": server.model, "prompt": "Once upon", "raw": True,
                                                   "options": options}))
    completion = server.post_json("/v1/completions", {"model": server.model, "prompt": "Once upon",
                                                      "temperature": 0, "max_tokens": 8,
                                                      "repetition_penalty": 1.1}).json()
    assert "".join(p["response"] for p in raw) == completion["choices"][0]["text"]


def test_a_request_with_nothing_to_do_loads_the_model_as_ollama_answers(server):
    for path, field in (("/api/chat", "message"), ("/api/generate", "response")):
        reply = server.post_json(path, {"model": server.model}).json()
        assert reply["done"] and reply["done_reason"] == "load" and field in reply
        reply = server.post_json(path, {"model": server.model, "keep_alive": 0}).json()
        assert reply["done"] and reply["done_reason"] == "unload"


def test_errors_come_in_ollamas_shape(server):
    reply = server.post_json("/api/chat", {"model": "nope", **CHAT})
    assert reply.status == 404 and set(reply.json()) == {"error"} and "nope" in reply.json()["error"]
    reply = server.post_json("/api/chat", {"model": server.model, **CHAT, "options": {"mirostat": 1}})
    assert reply.status == 400 and "mirostat" in reply.json()["error"]


def test_the_served_model_is_listed_shown_and_running(server, model):
    tags = server.get_json("/api/tags").json()["models"]
    assert [m["name"] for m in tags] == [server.model]
    assert tags[0]["size"] == Path(model.path).stat().st_size and tags[0]["details"]["format"] == "gguf"
    running = server.get_json("/api/ps").json()["models"]
    assert [m["digest"] for m in running] == [tags[0]["digest"]]
    shown = server.post_json("/api/show", {"model": server.model + ":latest"}).json()
    assert shown["template"] == model.chat_template and "completion" in shown["capabilities"]
    assert shown["model_info"]["llama.context_length"] == 512
    assert server.post_json("/api/show", {"model": "nope"}).status == 404
    assert server.get_json("/api/version").json() == {"version": ollama.VERSION}


def test_embed_answers_the_normalised_vectors_of_v1_embeddings(tmp_path):
    path = build_embedding_model(tmp_path / "embedder.gguf", "last").path
    with running_llmd("--model", str(path), "--ctx", "128") as url:
        client = Client(url)
        texts = ["Hello world", "a"]
        ours = client.post_json("/api/embed", {"model": "embedder", "input": texts}).json()
        openai = client.post_json("/v1/embeddings", {"model": "embedder", "input": texts}).json()
        one = client.post_json("/api/embed", {"model": "embedder:latest", "input": texts[0]}).json()
        refused_truncate = client.post_json("/api/embed", {"model": "embedder", "input": "x", "truncate": True})
        older = client.post_json("/api/embeddings", {"model": "embedder:latest", "prompt": texts[0]}).json()
        nothing = client.post_json("/api/embeddings", {"model": "embedder", "prompt": ""}).json()
    assert ours["embeddings"] == [d["embedding"] for d in openai["data"]]
    assert one["embeddings"] == ours["embeddings"][:1]
    assert ours["prompt_eval_count"] == openai["usage"]["prompt_tokens"]
    assert refused_truncate.status == 400 and "truncate" in refused_truncate.json()["error"]
    norm = math.sqrt(math.fsum(x * x for x in older["embedding"]))  # the pooled vector, not normalised
    assert norm != pytest.approx(1.0) and [x / norm for x in older["embedding"]] == pytest.approx(ours["embeddings"][0])
    assert nothing == {"embedding": []}


def test_show_gives_the_template_served_and_the_context_served(tmp_path, model):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].split('</think>')[-1] }}"
                        "<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    with running_llmd("--model", str(model.path), "--chat-template", str(template), "--ctx", "256") as url:
        shown = Client(url).post_json("/api/show", {"model": Path(model.path).stem}).json()
    assert shown["template"] == template.read_text() and shown["model_info"]["llama.context_length"] == 256
    assert "thinking" in shown["capabilities"]
