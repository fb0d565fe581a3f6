"""Log output: JSON lines with the access log's fields, from a running llmd and in process."""
import json
import logging
import socket
import sys
import urllib.request

from llmd.logs import JsonFormatter
from tests.conftest import running_llmd

MODEL = "SmolLM2-135M-Instruct"


def test_json_records_carry_time_level_logger_fields_and_exception():
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("llmd.access", logging.INFO, __file__, 1, "GET %s", ("/x",), exc_info)
    record.fields = {"status": 200, "session": "a\"b"}
    line = JsonFormatter().format(record)
    obj = json.loads(line)
    assert "\n" not in line
    assert obj["level"] == "info" and obj["logger"] == "llmd.access" and obj["message"] == "GET /x"
    assert obj["status"] == 200 and obj["session"] == "a\"b"
    assert obj["time"].endswith("Z") and "ValueError: boom" in obj["exception"]


def test_running_llmd_logs_json_access_lines_and_notifies_systemd(tmp_path, monkeypatch):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(30)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    with open(tmp_path / "log", "w") as log, running_llmd("--log-format", "json", "--max-sessions", "2",
                                                          "--ctx", "256", stderr=log) as url:
        assert notify.recv(100) == b"READY=1"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                "session_id": "logged"}
        request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        usage = json.loads(urllib.request.urlopen(request, timeout=60).read())["usage"]
    assert notify.recv(100) == b"STOPPING=1"
    notify.close()
    records = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    ready = next(r for r in records if r.get("event") == "ready")
    assert ready["model"] == MODEL and ready["n_ctx"] == 256 and ready["session_slots"] == 2
    access = next(r for r in records if r["logger"] == "llmd.access")
    assert access["method"] == "POST" and access["path"] == "/v1/chat/completions"
    assert access["status"] == 200 and access["session"] == "logged" and access["client"] == "127.0.0.1"
    assert access["prompt"] == usage["prompt_tokens"] and access["generated"] == usage["completion_tokens"]
    assert access["cached"] == 0 and access["ttft_ms"] > 0 and access["ms"] >= access["ttft_ms"]
    assert access["message"].startswith("POST /v1/chat/completions 200 ")
