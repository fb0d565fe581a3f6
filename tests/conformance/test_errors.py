"""Error answers: status codes and the OpenAI error body {"error": {message, type, param, code}}."""
from __future__ import annotations

import os

import pytest

from .client import Client, assert_error, assert_ok

HI = [{"role": "user", "content": "Hi"}]


def test_invalid_json_is_400(client):
    resp = client.post_json("/chat/completions", b'{"model": "x", "messages": [')
    assert_error(resp, 400)


def test_non_object_json_body_is_400(client):
    assert_error(client.post_json("/chat/completions", [1, 2, 3]), 400)


def test_missing_messages_is_400_naming_messages(client):
    body = client.chat_body(HI)
    del body["messages"]
    assert_error(client.post_json("/chat/completions", body), 400, param="messages")


def test_empty_messages_is_400_naming_messages(client):
    assert_error(client.chat([]), 400, param="messages")


def test_messages_not_a_list_is_400_naming_messages(client):
    assert_error(client.chat("Hi"), 400, param="messages")


def test_temperature_3_is_400_naming_temperature(client):
    assert_error(client.chat(HI, temperature=3), 400, param="temperature")


def test_temperature_wrong_type_is_400_naming_temperature(client):
    assert_error(client.chat(HI, temperature="hot"), 400, param="temperature")


def test_max_tokens_0_is_400_naming_max_tokens(client):
    assert_error(client.chat(HI, max_tokens=0), 400, param="max_tokens")


def test_negative_max_tokens_is_400_naming_max_tokens(client):
    assert_error(client.chat(HI, max_tokens=-5), 400, param="max_tokens")


def test_n_2_is_honoured_or_refused_never_ignored(client):
    """OpenAI honours n > 1; a server that cannot must refuse it with 400 naming `n`
    (llmd refuses), never answer with one choice."""
    resp = client.chat(HI, n=2, max_tokens=2)
    if resp.status == 200:
        assert [c["index"] for c in resp.json()["choices"]] == [0, 1]
    else:
        assert_error(resp, 400, param="n")


def test_unknown_model_is_404_model_not_found(client):
    body = client.chat_body(HI, model="no-such-model-conformance")
    assert_error(client.post_json("/chat/completions", body), 404, code="model_not_found")


def test_unknown_model_on_completions_is_404(client):
    body = client.completion_body("Hi", model="no-such-model-conformance")
    assert_error(client.post_json("/completions", body), 404, code="model_not_found")


def test_get_on_chat_completions_is_405_with_allow(client):
    resp = client.get_json("/chat/completions")
    assert_error(resp, 405)
    assert "POST" in (resp.headers.get("Allow") or ""), resp.headers.get("Allow")


def test_unknown_route_is_404(client):
    assert_error(client.get_json("/no-such-route"), 404)


def test_unknown_route_post_is_404(client):
    assert_error(client.post_json("/no-such-route", {"model": client.model}), 404)


def test_missing_prompt_on_completions_is_400_naming_prompt(client):
    body = client.completion_body("Hi")
    del body["prompt"]
    assert_error(client.post_json("/completions", body), 400, param="prompt")


def test_streaming_request_with_invalid_value_gets_json_400(client):
    stream = client.chat_stream(HI, temperature=3)
    assert stream.status == 400 and stream.content_type == "application/json"
    assert_error(stream, 400, param="temperature")


def test_streaming_request_without_messages_gets_json_400(client):
    body = client.chat_body(HI, stream=True)
    del body["messages"]
    stream = client.post_stream("/chat/completions", body)
    assert_error(stream, 400, param="messages")


def test_streaming_completion_with_invalid_value_gets_json_400(client):
    stream = client.completion_stream("Hi", max_tokens=0)
    assert_error(stream, 400, param="max_tokens")


def test_server_still_answers_after_errors(client):
    assert_ok(client.chat(HI, max_tokens=1))


@pytest.mark.skipif(not os.environ.get("OPENAI_API_KEY"),
                    reason="OPENAI_API_KEY unset: the server is assumed not to require a key")
def test_wrong_api_key_is_401(client):
    wrong = Client(client.base_url, "wrong-" + os.environ["OPENAI_API_KEY"], client.model)
    assert_error(wrong.chat(HI, max_tokens=1), 401)


# A text-only model refuses images (as llm-comply's Image Input test sends them) with a
# 400 naming the part, never a 500 or a reply that silently ignored the picture.
IMAGE = "data:image/jpeg;base64,/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAP////////////////////////////////////////" \
        "//////////////////////////////////////////////8AAEQgAAQABAwEiAAIRAQMRAf/EABQAAQAAAAAAAAAAAAAAAAAAAAn/"


@pytest.mark.parametrize("path, body, param", [
    ("/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe this image briefly."},
        {"type": "image_url", "image_url": {"url": IMAGE}}]}], "max_tokens": 5}, "messages[0].content[1].type"),
    ("/responses", {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Describe this image briefly."},
        {"type": "input_image", "image_url": IMAGE}]}]}, "input[0].content[1].type"),
])
def test_image_input_to_a_text_only_model_is_400_naming_the_part(client, path, body, param):
    err = assert_error(client.post_json(path, {"model": client.model, **body}), 400, param=param)
    assert "image" in err["message"] and "text only" in err["message"], err
