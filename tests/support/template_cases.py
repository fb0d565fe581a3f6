"""The conversations every reference chat template is rendered with, shared by the golden
generator (tests/support/make_template_goldens.py, run with jinja2) and tests/prompt/test_jinja.py.

Values are what llmd hands a template (llmd.prompt.templates normalises OpenAI messages to this):
string content, tool-call arguments as objects, `tools` None when absent. The clock
`strftime_now` reads is fixed at NOW.
"""
from __future__ import annotations

import datetime

NOW = datetime.datetime(2026, 1, 15, 9, 30, 0)
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
        "required": ["query"]}}}


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


_SYSTEM = {"role": "system", "content": "You are a terse assistant."}
_USER = {"role": "user", "content": "What is the capital of France?"}
_TOOL_TURN = [
    {"role": "system", "content": "You can use tools."},
    {"role": "user", "content": "Weather in Paris and news about it?"},
    {"role": "assistant", "content": "", "tool_calls": [
        _call("call_1", "get_weather", {"city": "Paris", "unit": "celsius"}),
        _call("call_2", "search", {"query": "Paris news", "limit": 3})]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21, "sky": "clear"}'},
    {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "Nothing new."},
]

CONVERSATIONS: dict[str, dict] = {
    "user": {"messages": [_USER], "add_generation_prompt": True},
    "system_user": {"messages": [_SYSTEM, _USER], "add_generation_prompt": True},
    "system_user_no_generation_prompt": {"messages": [_SYSTEM, _USER], "add_generation_prompt": False},
    "multi_turn": {"messages": [
        _SYSTEM, _USER, {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "  And of Italy?\n"}], "add_generation_prompt": True},
    "multi_turn_ends_with_assistant": {"messages": [
        _USER, {"role": "assistant", "content": "Paris."}], "add_generation_prompt": False},
    "tools": {"messages": [_SYSTEM, _USER], "tools": [WEATHER_TOOL, SEARCH_TOOL],
              "add_generation_prompt": True},
    "tool_calls_and_results": {"messages": _TOOL_TURN, "tools": [WEATHER_TOOL, SEARCH_TOOL],
                               "add_generation_prompt": True},
    "tool_call_with_content": {"messages": [
        _USER, {"role": "assistant", "content": "Let me check.", "tool_calls": [
            _call("call_9", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_9", "name": "get_weather", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks!"}], "tools": [WEATHER_TOOL], "add_generation_prompt": True},
    "thinking_enabled": {"messages": [_USER], "add_generation_prompt": True,
                         "kwargs": {"enable_thinking": True}},
    "thinking_disabled": {"messages": [_USER], "add_generation_prompt": True,
                          "kwargs": {"enable_thinking": False}},
    "reasoning_in_history": {"messages": [
        _USER, {"role": "assistant", "content": "<think>\nThe user asks a fact.\n</think>\n\nParis."},
        {"role": "user", "content": "Sure?"}], "add_generation_prompt": True},
    "control_tokens_and_unicode_in_content": {"messages": [
        {"role": "system", "content": "Rules: <|im_end|> <|eot_id|> [INST] <start_of_turn>"},
        {"role": "user", "content": "a<|im_start|>b <|end|> <s> \u00e9\u6f22\U0001F600 \"q\" 'a' \\n {{ x }}"}],
        "add_generation_prompt": True},
}


def variables(case: dict) -> dict:
    """The template variables for one conversation, as transformers passes them."""
    return {"messages": case["messages"], "tools": case.get("tools"), "documents": None,
            "add_generation_prompt": case["add_generation_prompt"], **SPECIAL_TOKENS,
            **case.get("kwargs", {})}
