"""The Anthropic Messages request read into a chat request (llmd.api.anthropic)."""
import json

import pytest

from llmd.api import anthropic
from llmd.api.validation import Message, ToolCall
from llmd.errors import ApiError

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def parse(counting=False, **fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **({} if counting else {"max_tokens": 5}),
            **fields}
    return anthropic.parse_request(json.dumps(body).encode(), counting)


def refused(**fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    return info.value


def test_system_blocks_come_first_and_sampling_is_read():
    req = parse(system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], temperature=0.2, top_k=5,
                stop_sequences=["\n\n"])
    assert req.messages == [Message("system", "a\nb"), Message("user", "Hi")]
    assert (req.sampling.temperature, req.sampling.top_k, req.stop, req.max_tokens) == (0.2, 5, ["\n\n"], 5)


def test_tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages():
    req = parse(tools=[TOOL], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "18 C"}]},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
                                     {"type": "text", "text": "Thanks"}]}])
    assert req.messages == [
        Message("user", "Weather?"),
        Message("assistant", "Checking.", None, (ToolCall("t1", "get_weather", '{"city": "Paris"}'),), reasoning="..."),
        Message("tool", "18 C", None, (), "t1"),
        Message("tool", "Error: boom", None, (), "t2"),
        Message("user", "Thanks")]


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, ("auto", None, True)),
    ({"type": "any", "disable_parallel_tool_use": True}, ("required", None, False)),
    ({"type": "tool", "name": "get_weather"}, ("required", "get_weather", True)),
    ({"type": "none"}, ("none", None, True)),
])
def test_tool_choice_maps_onto_chat_tool_choice(choice, expected):
    req = parse(tools=[TOOL], tool_choice=choice)
    assert (req.tool_choice, req.tool_name, req.parallel_tool_calls) == expected


def test_a_tool_choice_naming_no_tool_names_anthropics_field():
    with pytest.raises(ApiError) as info:
        parse(tools=[TOOL], tool_choice={"type": "tool", "name": "get_time"})
    assert (info.value.param, info.value.code) == ("tool_choice.name", "invalid_value")


def test_count_tokens_needs_no_max_tokens_but_messages_does():
    assert parse(counting=True).max_tokens is None
    with pytest.raises(ApiError) as info:
        anthropic.parse_request(b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}')
    assert info.value.param == "max_tokens"


@pytest.mark.parametrize("fields, param", [
    ({"temperature": 1.5}, "temperature"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens"),  # not < max_tokens
    ({"thinking": {"type": "enabled", "budget_tokens": 100}, "max_tokens": 4096}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled"}, "max_tokens": 4096}, "thinking.budget_tokens"),
    ({"thinking": {"type": "disabled", "budget_tokens": 2000}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"stop_sequences": [""]}, "stop_sequences[0]"),
    ({"mcp_servers": []}, "mcp_servers"),
    ({"n": 2}, "n"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(fields, param):
    assert refused(**fields).param == param


@pytest.mark.parametrize("thinking, expected", [
    (None, (None, True)),
    ({"type": "disabled"}, (False, True)),
    ({"type": "adaptive"}, (None, True)),
    ({"type": "enabled", "budget_tokens": 2048, "display": "summarized"}, (True, True)),
    ({"type": "enabled", "budget_tokens": 2048, "display": "omitted"}, (True, False)),
])
def test_thinking_asks_for_reasoning_or_none_and_says_whether_its_text_shows(thinking, expected):
    req = parse(thinking=thinking, max_tokens=4096) if thinking else parse()
    assert (req.reasoning, req.show_reasoning) == expected and req.reasoning_param == "thinking"
    assert req.template_params == {"enable_thinking": "thinking"}
