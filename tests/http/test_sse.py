"""SSE framing (llmd/http/sse.py)."""
import json

from llmd.http import sse


def test_event_is_one_data_line_and_a_blank_line():
    payload = json.dumps({"choices": [{"delta": {"content": "héllo"}}]})
    assert sse.event(payload) == b"data: " + payload.encode("utf-8") + b"\n\n"


def test_event_never_writes_an_event_field():
    assert b"event:" not in sse.event('{"a": 1}')


def test_line_breaks_become_separate_data_fields():
    assert sse.event("a\nb\r\nc\rd") == b"data: a\ndata: b\ndata: c\ndata: d\n\n"


def test_done_and_ping_constants():
    assert sse.DONE == b"data: [DONE]\n\n"
    assert sse.PING == b": ping\n\n"
