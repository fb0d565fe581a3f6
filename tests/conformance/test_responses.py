"""POST /v1/responses (OpenAI Responses): the Response object, its event stream,
function tools and continuation with previous_response_id. The served model may be
tiny: shapes are checked, not what it says."""
from __future__ import annotations

import json

import pytest

from .client import Client, assert_error, assert_ok, is_int

TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather for a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
MAX = 12


def body(client: Client, **params) -> dict:
    return {"model": client.model, "input": "Say hello.", "max_output_tokens": MAX, "temperature": 0, **params}


def assert_response(resp: dict, status: str | None = None) -> list[dict]:
    """A finished Response object; returns its output items."""
    assert resp["object"] == "response" and resp["id"].startswith("resp_"), resp
    assert resp["status"] in ("completed", "incomplete") and (status is None or resp["status"] == status), resp
    assert is_int(resp["created_at"]) and is_int(resp["completed_at"]), resp
    assert (resp["incomplete_details"] is None) == (resp["status"] == "completed"), resp
    usage = resp["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"], usage
    assert 0 <= usage["input_tokens_details"]["cached_tokens"] <= usage["input_tokens"], usage
    assert usage["output_tokens_details"]["reasoning_tokens"] == 0 and usage["output_tokens"] <= MAX, usage
    for item in resp["output"]:
        assert item["status"] == "completed", item
        if item["type"] == "message":
            assert item["role"] == "assistant" and item["id"].startswith("msg_"), item
            assert [p["type"] for p in item["content"]] == ["output_text"], item
            assert item["content"][0]["annotations"] == [], item
        else:
            assert item["type"] == "function_call" and item["name"] == "get_weather", item
            assert isinstance(json.loads(item["arguments"]), dict), item
            assert item["call_id"] and item["id"].startswith("fc_"), item
    assert resp["output"], resp
    return resp["output"]


def text_of(output: list[dict]) -> str:
    return "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])


@pytest.fixture(scope="module")
def reference(client: Client) -> dict:
    return assert_ok(client.post_json("/responses", body(client)))


@pytest.fixture(scope="module")
def streamed(client: Client):
    stream = client.post_events("/responses", body(client, stream=True))
    assert stream.status == 200, stream.body[:300]
    return stream.chunks


def test_response_object_has_the_documented_shape(reference):
    assert_response(reference)
    assert reference["model"] and reference["tools"] == [] and reference["text"] == {"format": {"type": "text"}}


def test_max_output_tokens_ends_incomplete(client: Client):
    resp = assert_ok(client.post_json("/responses", body(client, max_output_tokens=1, input="Count to ten.")))
    assert_response(resp, "incomplete")
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"} and resp["usage"]["output_tokens"] == 1


def test_stream_events_come_in_order_with_increasing_sequence_numbers(streamed):
    names = [name for name, _ in streamed]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] in ("response.completed", "response.incomplete")
    assert [e["sequence_number"] for _, e in streamed] == list(range(len(streamed)))
    assert names[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert names[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def test_streamed_text_equals_the_final_response_and_the_non_streamed_one(streamed, reference):
    deltas = "".join(e["delta"] for name, e in streamed if name == "response.output_text.delta")
    done = next(e for name, e in streamed if name == "response.output_text.done")
    final = streamed[-1][1]["response"]
    assert deltas == done["text"] == text_of(assert_response(final)) == text_of(reference["output"])
    assert streamed[0][1]["response"]["status"] == "in_progress" and streamed[0][1]["response"]["output"] == []


def test_input_items_with_a_function_call_and_its_output(client: Client):
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C and sunny"}]
    resp = assert_ok(client.post_json("/responses", body(client, input=items, tools=TOOLS,
                                                         instructions="Answer briefly.")))
    assert_response(resp)
    assert resp["instructions"] == "Answer briefly." and resp["tools"][0]["name"] == "get_weather"


def test_required_tool_choice_gives_a_function_call_item(client: Client):
    resp = assert_ok(client.post_json("/responses", body(client, input="Weather in Paris?", tools=TOOLS,
                                                         tool_choice="required", max_output_tokens=40)))
    calls = [i for i in resp["output"] if i["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and resp["usage"]["output_tokens"] <= 40
    assert isinstance(json.loads(calls[0]["arguments"])["city"], str)


def test_streamed_function_call_arguments_add_up(client: Client):
    stream = client.post_events("/responses", body(client, input="Weather in Paris?", tools=TOOLS,
                                                   tool_choice="required", max_output_tokens=40, stream=True))
    events = stream.chunks
    added = [e["item"] for n, e in events if n == "response.output_item.added" and e["item"]["type"] == "function_call"]
    assert added and added[0]["arguments"] == "" and added[0]["status"] == "in_progress"
    deltas = "".join(e["delta"] for n, e in events if n == "response.function_call_arguments.delta")
    done = next(e for n, e in events if n == "response.function_call_arguments.done")
    assert deltas == done["arguments"] and isinstance(json.loads(deltas), dict)


def test_json_schema_text_format_is_followed(client: Client):
    schema = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 20}},
              "required": ["greeting"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "greeting", "schema": schema, "strict": True}
    resp = assert_ok(client.post_json("/responses", body(client, text={"format": fmt}, max_output_tokens=40)))
    assert isinstance(json.loads(text_of(resp["output"]))["greeting"], str)
    assert resp["text"]["format"]["type"] == "json_schema"


def test_previous_response_id_continues_the_conversation(client: Client):
    first = assert_ok(client.post_json("/responses", body(client, input="My name is Alice.")))
    second = assert_ok(client.post_json("/responses", body(client, input="What is my name?",
                                                           previous_response_id=first["id"])))
    assert_response(second)
    assert second["previous_response_id"] == first["id"]
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"] + first["usage"]["output_tokens"]


def test_unknown_previous_response_id_is_400_naming_it(client: Client):
    assert_error(client.post_json("/responses", body(client, previous_response_id="resp_nope")), 400,
                 param="previous_response_id")


def test_unsupported_tool_type_is_400_naming_it(client: Client):
    assert_error(client.post_json("/responses", body(client, tools=[{"type": "web_search"}])), 400,
                 param="tools[0].type")


def test_model_is_required(client: Client):
    b = body(client)
    del b["model"]
    assert_error(client.post_json("/responses", b), 400, param="model")


# ---- POST /responses/compact ------------------------------------------------------------------

CONVERSATION = [{"type": "message", "role": "user", "content": "We launch on Tuesday and tell support first."},
                {"type": "message", "role": "assistant", "content": "Understood: Tuesday, support first."}]


def assert_compaction(resp: dict, user_texts: list[str]) -> dict:
    """A compacted conversation: the user's messages as they were, then one compaction
    item (returned)."""
    assert resp["object"] == "response.compaction" and resp["id"] and is_int(resp["created_at"]), resp
    *messages, compaction = resp["output"]
    assert [(m["type"], m["role"]) for m in messages] == [("message", "user")] * len(user_texts), resp
    assert ["".join(p["text"] for p in m["content"]) for m in messages] == user_texts, resp
    assert compaction["type"] == "compaction" and compaction["encrypted_content"], resp
    usage = resp["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0, usage
    return compaction


def test_compact_keeps_the_user_messages_and_adds_one_compaction_item(client: Client):
    resp = assert_ok(client.post_json("/responses/compact", {"model": client.model, "input": CONVERSATION}))
    assert_compaction(resp, [CONVERSATION[0]["content"]])


def test_a_compacted_conversation_continues_as_input(client: Client):
    compacted = assert_ok(client.post_json("/responses/compact", {"model": client.model, "input": CONVERSATION}))
    follow_up = {"type": "message", "role": "user", "content": "When do we launch?"}
    assert_response(assert_ok(client.post_json("/responses", body(client, input=compacted["output"] + [follow_up]))))


def test_compact_continues_a_stored_response(client: Client):
    first = assert_ok(client.post_json("/responses", body(client, input="My name is Alice.")))
    resp = assert_ok(client.post_json("/responses/compact", {"model": client.model,
                                                             "previous_response_id": first["id"]}))
    assert_compaction(resp, ["My name is Alice."])


def test_compact_needs_a_model(client: Client):
    assert_error(client.post_json("/responses/compact", {"input": CONVERSATION}), 400, param="model")
