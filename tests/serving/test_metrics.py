"""Prometheus metrics: the renderer against a strict parser of the text exposition
format (0.0.4), and /metrics of a running llmd against what its requests did."""
from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from llmd.serving.metrics import Counter, Gauge, Histogram, Registry, format_value
from tests.conftest import running_llmd

MODEL = "SmolLM2-135M-Instruct"
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
_TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class FormatError(AssertionError):
    pass


def _unescape(text: str, allowed: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 >= len(text) or text[i + 1] not in allowed:
                raise FormatError(f"bad escape in {text!r}")
            out.append("\n" if text[i + 1] == "n" else text[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _parse_labels(text: str, line: str) -> tuple[dict[str, str], str]:
    """Labels from text just after "{"; returns them and what follows the "}"."""
    labels: dict[str, str] = {}
    while True:
        if text.startswith("}"):
            return labels, text[1:]
        m = re.match(rf'({_LABEL})="', text)
        if not m:
            raise FormatError(f"bad label in {line!r}")
        name, i, value = m.group(1), m.end(), []
        while True:
            if i >= len(text):
                raise FormatError(f"unterminated label value in {line!r}")
            if text[i] == "\\":
                value.append(text[i:i + 2])
                i += 2
            elif text[i] == '"':
                break
            elif text[i] == "\n":
                raise FormatError(f"raw line break in a label value: {line!r}")
            else:
                value.append(text[i])
                i += 1
        if name in labels:
            raise FormatError(f"label {name} twice in {line!r}")
        labels[name] = _unescape("".join(value), '\\"n')
        text = text[i + 1:]
        if text.startswith(","):
            text = text[1:]
        elif not text.startswith("}"):
            raise FormatError(f"expected , or }} in {line!r}")


def _value(text: str, line: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        raise FormatError(f"bad value {text!r} in {line!r}")
    return float(text)


def parse(text: str) -> tuple[dict[str, dict], dict[tuple, float]]:
    """Strictly parse an exposition: (families name -> {type, help}, samples
    (name, sorted label pairs) -> value). Raises FormatError on anything the format
    forbids: bad names or escapes, TYPE after samples, a family split in two groups,
    duplicate samples, histograms without cumulative buckets, +Inf, _sum and _count."""
    if not text.endswith("\n"):
        raise FormatError("the exposition must end with a line break")
    families: dict[str, dict] = {}
    samples: dict[tuple, float] = {}
    done: set[str] = set()   # families whose group has ended
    current = None
    for line in text[:-1].split("\n"):
        if not line.strip():
            continue
        if line.startswith("#"):
            if not line.startswith(("# HELP ", "# TYPE ")):
                continue  # a plain comment
            m = re.fullmatch(rf"# (HELP|TYPE) ({_NAME}) (.*)", line)
            if not m:
                raise FormatError(f"bad comment line {line!r}")
            kind, name, rest = m.groups()
            family = families.setdefault(name, {"type": "untyped", "help": None, "samples": 0})
            if name in done or family["samples"]:
                raise FormatError(f"{kind} for {name} after its samples")
            if current is not None and current != name:
                done.add(current)
            current = name
            if kind == "HELP":
                if family["help"] is not None:
                    raise FormatError(f"two HELP lines for {name}")
                family["help"] = _unescape(rest, "\\n")
            else:
                if rest not in _TYPES or family.get("typed"):
                    raise FormatError(f"bad or repeated TYPE line {line!r}")
                family["type"], family["typed"] = rest, True
            continue
        m = re.match(rf"({_NAME})", line)
        if not m:
            raise FormatError(f"bad sample line {line!r}")
        name, rest = m.group(1), line[m.end():]
        labels: dict[str, str] = {}
        if rest.startswith("{"):
            labels, rest = _parse_labels(rest[1:], line)
        parts = rest.split(" ")
        if parts[0] != "" or len(parts) not in (2, 3):
            raise FormatError(f"bad sample line {line!r}")
        value = _value(parts[1], line)
        if len(parts) == 3 and not re.fullmatch(r"-?\d+", parts[2]):
            raise FormatError(f"bad timestamp in {line!r}")
        family_name = name
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[:-len(suffix)]
            if name.endswith(suffix) and families.get(base, {}).get("type") in ("histogram", "summary"):
                family_name = base
        if family_name != current:
            if current is not None:
                done.add(current)
            if family_name in done:
                raise FormatError(f"samples of {family_name} are not in one group")
            current = family_name
        family = families.setdefault(family_name, {"type": "untyped", "help": None, "samples": 0})
        family["samples"] += 1
        key = (name, tuple(sorted(labels.items())))
        if key in samples:
            raise FormatError(f"duplicate sample {line!r}")
        if family["type"] == "counter" and not value >= 0:
            raise FormatError(f"negative counter {line!r}")
        if name.endswith("_bucket") and family_name != name and "le" not in labels:
            raise FormatError(f"bucket without le: {line!r}")
        samples[key] = value
    for name, family in families.items():
        if family["type"] == "histogram":
            _check_histogram(name, samples)
    return families, samples


def _check_histogram(name: str, samples: dict[tuple, float]) -> None:
    buckets = sorted(((_value(dict(labels)["le"], name), v) for (n, labels), v in samples.items()
                      if n == name + "_bucket"))
    if not buckets or buckets[-1][0] != math.inf:
        raise FormatError(f"{name} has no +Inf bucket")
    counts = [v for _, v in buckets]
    if counts != sorted(counts):
        raise FormatError(f"{name} buckets are not cumulative")
    if (name + "_count", ()) not in samples or (name + "_sum", ()) not in samples:
        raise FormatError(f"{name} lacks _sum or _count")
    if samples[(name + "_count", ())] != counts[-1]:
        raise FormatError(f"{name}_count differs from its +Inf bucket")


# ---- the parser can fail ------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "a 1",                                                  # no final line break
    "# TYPE a counter\na -1\n",                             # negative counter
    "a 1\n# TYPE a counter\n",                              # TYPE after samples
    "a 1\nb 1\na{x=\"1\"} 1\n",                             # a family in two groups
    "a{x=\"1\"} 1\na{x=\"1\"} 2\n",                         # duplicate sample
    "a{x=\"\\t\"} 1\n",                                     # bad escape
    "a{x=\"1\",x=\"2\"} 1\n",                               # repeated label
    "a one\n",                                              # bad value
    "# HELP a x\\y\na 1\n",                                  # bad escape in help
    "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
    "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
])
def test_strict_parser_rejects_malformed_expositions(text):
    with pytest.raises(FormatError):
        parse(text)


# ---- the renderer -------------------------------------------------------------------

def test_help_and_label_values_are_escaped_and_read_back():
    r = Registry()
    c = r.counter("x_total", 'Counts "things"\nwith a back\\slash.', ("path",))
    c.inc(path='a"b\\c\nd')
    c.inc(2, path="plain")
    families, samples = parse(r.render())
    assert families["x_total"]["help"] == 'Counts "things"\nwith a back\\slash.'
    assert families["x_total"]["type"] == "counter"
    assert samples[("x_total", (("path", 'a"b\\c\nd'),))] == 1
    assert samples[("x_total", (("path", "plain"),))] == 2
    assert 'path="a\\"b\\\\c\\nd"' in r.render()


def test_histogram_buckets_are_cumulative_with_sum_and_count():
    r = Registry()
    h = r.histogram("lat_seconds", "Latency.", (0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    _, samples = parse(r.render())
    assert samples[("lat_seconds_bucket", (("le", "0.1"),))] == 2  # 0.1 itself is in le="0.1"
    assert samples[("lat_seconds_bucket", (("le", "1"),))] == 3
    assert samples[("lat_seconds_bucket", (("le", "+Inf"),))] == 4
    assert samples[("lat_seconds_count", ())] == 4
    assert samples[("lat_seconds_sum", ())] == pytest.approx(3.65)


def test_read_callables_are_sampled_at_each_render():
    r = Registry()
    g = r.gauge("level", "A level.")
    box = [3]
    g.read = lambda: box[0]
    assert parse(r.render())[1][("level", ())] == 3
    box[0] = 7
    assert parse(r.render())[1][("level", ())] == 7


def test_values_are_formatted_as_the_format_spells_them():
    assert [format_value(v) for v in (0, 3.0, 0.25, 1e-5, math.inf, -math.inf)] == \
        ["0", "3", "0.25", "1e-05", "+Inf", "-Inf"]
    assert format_value(math.nan) == "NaN"


def test_bad_names_labels_and_updates_are_refused():
    with pytest.raises(ValueError):
        Counter("bad-name", "x")
    with pytest.raises(ValueError):
        Gauge("g", "x", ("le",))
    with pytest.raises(ValueError):
        Histogram("h", "x", (1.0, 0.5))
    c = Counter("c_total", "x", ("route",))
    with pytest.raises(ValueError):
        c.inc(-1, route="/")
    with pytest.raises(ValueError):
        c.inc(route="/", status="200")
    r = Registry()
    r.gauge("g", "x")
    with pytest.raises(ValueError):
        r.counter("g", "again")


# ---- /metrics of a running llmd ---------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    with running_llmd("--max-sessions", "3", "--ctx", "256") as url:
        yield url


def scrape(url: str, key: str | None = None) -> dict[tuple, float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers=headers), timeout=30) as response:
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        families, samples = parse(response.read().decode())
    for name, family in families.items():
        assert name.startswith("llmd_") or name in GATEWAY, name
        assert family["help"] and family.get("typed"), name
    assert {name: families[name]["type"] for name in GATEWAY} == GATEWAY
    return samples


# The Gateway API Inference Extension's model-server protocol, under vLLM's names.
GATEWAY = {"vllm:num_requests_waiting": "gauge", "vllm:num_requests_running": "gauge",
           "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge"}


def chat(url: str, messages: list[dict], session: str | None, max_tokens: int = 4) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "logit_bias": {"0": -100, "2": -100}}  # no end of text or turn: exactly max_tokens tokens
    if session:
        body["session_id"] = session
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def requests_of(samples, route: str, status: str) -> float:
    return samples.get(("llmd_requests_total", (("route", route), ("status", status))), 0)


def test_metrics_count_requests_tokens_latencies_and_sessions(server):
    before = scrape(server)
    assert before[("llmd_model_load_seconds", ())] > 0
    assert before[("llmd_kv_cache_bytes_per_token", (("type_k", "f16"), ("type_v", "f16")))] == 23040
    assert before[("llmd_sessions_capacity", ())] == 2
    turn1 = [{"role": "user", "content": "Hello there"}]
    first = chat(server, turn1, "m1")
    turn2 = turn1 + [first["choices"][0]["message"], {"role": "user", "content": "And then?"}]
    second = chat(server, turn2, "m1")
    urllib.request.urlopen(server + "/v1/sessions/m1", timeout=10).read()
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(server + "/no/such/route", timeout=10)
    after = scrape(server)

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    def requests(route, status):
        return requests_of(after, route, status) - requests_of(before, route, status)

    assert requests("/v1/chat/completions", "200") == 2
    assert requests("/v1/sessions/{sid}", "200") == 1
    assert requests("unmatched", "404") == 1
    assert requests("/metrics", "200") == 1  # the first scrape
    usages = [first["usage"], second["usage"]]
    assert delta(("llmd_prompt_tokens_total", ())) == sum(u["prompt_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached > 0 and delta(("llmd_prompt_tokens_cached_total", ())) == cached
    assert delta(("llmd_generated_tokens_total", ())) == 8
    assert delta(("llmd_time_to_first_token_seconds_count", ())) == 2
    assert delta(("llmd_inter_token_latency_seconds_count", ())) == 6  # 3 gaps per 4-token reply
    assert delta(("llmd_inter_token_latency_seconds_sum", ())) > 0
    assert after[("llmd_sessions_in_use", ())] == 1
    resident = json.loads(urllib.request.urlopen(server + "/v1/sessions/m1", timeout=10).read())
    assert after[("llmd_kv_cache_bytes", ())] == resident["kv_bytes"] > 0
    assert after[("llmd_generations_active", ())] == 0 and after[("llmd_generations_queued", ())] == 0
    assert after[("vllm:num_requests_waiting", ())] == after[("vllm:num_requests_running", ())] == 0
    # One named slot of two in use, and far less than half the KV memory of all slots held.
    assert after[("vllm:kv_cache_usage_perc", ())] == after[("vllm:gpu_cache_usage_perc", ())] == 0.5

    # Two more named sessions in a 2-slot table: the least recently used one goes.
    chat(server, turn1, "m2", 1)
    chat(server, turn1, "m3", 1)
    final = scrape(server)
    assert final[("llmd_session_evictions_total", ())] - before[("llmd_session_evictions_total", ())] == 1
    assert final[("llmd_sessions_in_use", ())] == 2
    assert final[("vllm:kv_cache_usage_perc", ())] == 1.0  # the table is full: the next new session evicts


def test_gauges_show_a_running_generation_and_one_waiting_for_its_session(server):
    port = int(server.rsplit(":", 1)[1])
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}],
                       "stream": True, "max_tokens": 200, "session_id": "busy",
                       "logit_bias": {"0": -100, "2": -100}}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while received.count(b"data: ") < 3:  # the stream is running
        received += sock.recv(4096)
    waiter = threading.Thread(target=chat, args=(server, [{"role": "user", "content": "Hi"}], "busy", 1))
    waiter.start()
    try:
        deadline = time.monotonic() + 20
        while (now := scrape(server))[("llmd_generations_queued", ())] < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert now[("llmd_generations_queued", ())] == 1
        assert now[("llmd_generations_active", ())] == 1
        assert now[("vllm:num_requests_waiting", ())] == 1 and now[("vllm:num_requests_running", ())] == 1
    finally:
        sock.close()  # the stream is cancelled; the waiting request runs then
        waiter.join(timeout=60)
    assert not waiter.is_alive()
    deadline = time.monotonic() + 10
    while (final := scrape(server))[("llmd_generations_active", ())] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert final[("llmd_generations_active", ())] == 0 and final[("llmd_generations_queued", ())] == 0


def test_refusals_before_any_route_runs_are_counted_too():
    # the access guard's 401, the parser's 400 and 413, and the routes' own answers
    with running_llmd("--max-sessions", "2", "--ctx", "256", "--api-key", "k", "--max-body-bytes", "4096",
                      "--body-timeout", "0.5") as url:
        port = int(url.rsplit(":", 1)[1])
        before = scrape(url, "k")

        def send(raw: bytes) -> int:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(raw)
                return int(sock.recv(4096).split()[1])

        assert send(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n") == 401
        assert send(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer k\r\n\r\n") == 200
        assert send(b"BAD REQUEST LINE\r\n\r\n") == 400
        assert send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5000\r\n\r\n") == 413
        assert send(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 9\r\n\r\n{}") == 408
        after = scrape(url, "k")

        def requests(route, status):
            return requests_of(after, route, status) - requests_of(before, route, status)

        assert requests("/v1/models", "401") == requests("/v1/models", "200") == 1
        assert requests("unmatched", "400") == 1
        assert requests("/v1/chat/completions", "413") == 1
        assert requests("/v1/completions", "408") == 1  # the path was read: its route, not "unmatched"
