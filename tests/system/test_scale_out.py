"""Several instances behind nginx (contrib/nginx-llmd.conf as shipped, its ports
rewritten), one shared --session-dir: the acceptance of docs/deployment.md.

Three llmd processes on a tiny model and nginx, all on loopback. Thirty conversations
run concurrently through nginx, each naming its session in one of llmd's session
headers. A calm run gives each conversation's replies; then the same conversations run
again under new ids while one instance is killed (SIGKILL) after their second turn and
another is stopped (SIGTERM) after their third. Every conversation completes; the
sessions of the killed instance resume from their files on other instances
(`cached_tokens`); every temperature-0 reply equals the calm run's; every session file
in the directory loads; and the drained instance exits 0 with no request failing.
Then contrib/haproxy-llmd.cfg likewise, more briefly. Each is skipped where its balancer
is not installed (CI installs Debian's nginx and haproxy)."""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llmd.serving.session_store import file_name, read_version
from tests.conftest import free_port, llmd_process
from tests.system.test_limits import address, no_end, wait_for

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "contrib" / "nginx-llmd.conf"
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
HEADERS = ("X-ExecuTorch-Session-ID", "session_id", "x-session-affinity", "X-Session-ID")
CONVERSATIONS = 30
TURNS = 5
KILL_AFTER, TERM_AFTER = 2, 3  # turns every conversation has finished first
# Replies are short, but the turn that is in flight at SIGTERM is longer, so that the
# drained instance has generations to finish.
MAX_TOKENS, DRAINED_TURN_TOKENS = 6, 96




@contextlib.contextmanager
def nginx(directory: Path, ports: list[int]):
    """nginx on the shipped site file, its upstream ports replaced by `ports`, run as
    this user with everything in `directory`; yields its port."""
    site = SITE.read_text()
    shipped = re.findall(r"^ *server 127\.0\.0\.1:\d+ (.*)\n", site, re.M)
    assert len(shipped) == 3 and len(set(shipped)) == 1, "the site file lists three instances alike"
    servers = "".join(f"    server 127.0.0.1:{p} {shipped[0]}\n" for p in ports)
    site = re.sub(r"(^ *server 127\.0\.0\.1:\d+ .*\n)+", lambda m: servers, site, flags=re.M)
    port = free_port()
    site = site.replace("listen 127.0.0.1:8000;", f"listen 127.0.0.1:{port};")
    (directory / "llmd.conf").write_text(site)
    temp = " ".join(f"{kind}_temp_path {directory / kind};" for kind in ("client_body", "proxy", "fastcgi",
                                                                         "uwsgi", "scgi"))
    (directory / "nginx.conf").write_text(
        ("user root;\n" if os.geteuid() == 0 else "")  # else workers run as nobody, who cannot write here
        + f"daemon off;\nworker_processes 1;\npid {directory / 'nginx.pid'};\n"
        f"error_log {directory / 'error.log'} warn;\nevents {{ worker_connections 512; }}\n"
        f"http {{ access_log off; {temp} include {directory / 'llmd.conf'}; }}\n")
    proc = subprocess.Popen([NGINX, "-p", str(directory), "-c", str(directory / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: proc.poll() is not None or listening(port), seconds=20, what="nginx to listen")
        assert proc.poll() is None, (directory / "error.log").read_text()
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def request(port: int, method: str, path: str, body: dict | None = None,
            headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        data = json.dumps(body) if body is not None else None
        conn.request(method, path, data, {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


class Conversation:
    """One multi-turn chat through nginx, its session named in one of llmd's headers."""

    def __init__(self, index: int, sid: str, no_end: dict[str, float]):
        self.index, self.sid, self.no_end = index, sid, no_end
        self.header = HEADERS[index % len(HEADERS)]
        self.history: list[dict] = []
        self.usages: list[dict] = []
        self.failures: list[str] = []  # answers other than 200 (each then sent again)

    def turn(self, port: int, n: int) -> None:
        self.history.append({"role": "user", "content": f"conversation {self.index}, turn {n}: go on"})
        body = {"model": "model", "messages": self.history, "temperature": 0,
                "max_tokens": DRAINED_TURN_TOKENS if n == TERM_AFTER else MAX_TOKENS}
        if n == TERM_AFTER:  # its whole length, so that the drain finds it running
            body["logit_bias"] = self.no_end
        for _ in range(3):
            try:
                status, answer = request(port, "POST", "/v1/chat/completions", body, {self.header: self.sid})
            except (OSError, http.client.HTTPException, ValueError) as exc:
                status, answer = 0, {"error": repr(exc)}
            if status == 200:
                break
            self.failures.append(f"turn {n}: {status} {answer}")
        else:
            raise AssertionError(f"{self.sid} turn {n} failed: {self.failures}")
        self.history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        self.usages.append(answer["usage"])

    @property
    def replies(self) -> list[str]:
        return [m["content"] for m in self.history if m["role"] == "assistant"]


def run_turns(port: int, conversations: list[Conversation], turns: range) -> None:
    """Each conversation's `turns`, the conversations concurrently."""
    with ThreadPoolExecutor(len(conversations)) as pool:
        for future in [pool.submit(lambda c=c: [c.turn(port, n) for n in turns]) for c in conversations]:
            future.result()


def held(url: str) -> set[str]:
    status, listing = request(address(url)[1], "GET", "/v1/sessions")
    assert status == 200
    return {s["id"] for s in listing["data"]}


def check_files(directory: Path, killed: int) -> int:
    """Every session file in the directory is whole (length, checksum, its own id); no
    temporary file is left but the killed process's (the next start-up removes those
    once they are old). The number of session files."""
    from llmd.serving.session_store import SUFFIX, _PREFIX, decode
    names = [n for n in os.listdir(directory) if n != ".lock"]
    temporary = [n for n in names if n.endswith(".tmp")]
    assert all(f"-{killed}-" in n for n in temporary), temporary
    names = [n for n in names if n not in temporary]
    for name in names:
        assert name.endswith(SUFFIX)
        data = (directory / name).read_bytes()
        meta_len = _PREFIX.unpack_from(data)[2]
        meta = json.loads(data[_PREFIX.size:_PREFIX.size + meta_len])
        decode(data, meta["session_id"], meta["model"], meta["n_ctx"])  # raises Refused if damaged
    return len(names)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
def test_thirty_conversations_through_nginx_survive_a_killed_and_a_drained_instance(tiny_llama_factory,
                                                                                      tmp_path):
    model = tiny_llama_factory(n_ctx=1024)
    sessions = tmp_path / "sessions"
    # No prefix cache: a session's cached tokens come from its own cache or its file,
    # never from another conversation's blocks (the calm run has the same prompts).
    flags = ("--model", str(model.path), "--ctx", "1024", "--threads", "1", "--max-sessions", "72",
             "--prefix-cache", "off", "--session-dir", str(sessions), "--session-save-delay", "0",
             "--shutdown-grace", "30")
    with contextlib.ExitStack() as stack:
        with ThreadPoolExecutor(3) as pool:  # three instances load at once
            logs = [stack.enter_context(open(tmp_path / f"llmd{k}.log", "w")) for k in range(3)]
            instances = list(pool.map(lambda log: stack.enter_context(llmd_process(*flags, stderr=log)), logs))
        (tmp_path / "nginx").mkdir()
        port = stack.enter_context(nginx(tmp_path / "nginx", [address(i.url)[1] for i in instances]))

        # The calm run: no instance fails. Each session stays on the instance its id
        # hashes to, whichever header names it.
        calm = [Conversation(i, f"calm-{i}", no_end(model)) for i in range(CONVERSATIONS)]
        run_turns(port, calm, range(TURNS))
        holders = [held(i.url) for i in instances]
        assert sorted(sid for h in holders for sid in h) == sorted(c.sid for c in calm)
        assert all(holders), "the hash spreads 30 sessions over all three instances"
        assert all(cached(c.usages[n]) > 0 for c in calm for n in range(1, TURNS))
        assert not [c.failures for c in calm if c.failures]
        # Requests that name no session go round robin.
        served = [metric(i.url, COMPLETIONS_200) for i in instances]
        for _ in range(6):
            body = {"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            assert request(port, "POST", "/v1/chat/completions", body)[0] == 200
        assert all(metric(i.url, COMPLETIONS_200) > before for i, before in zip(instances, served))

        # The same conversations under new ids; after their second turn the instance
        # holding most of them is killed, while their third turns are being sent.
        moved = [Conversation(i, f"conv-{i}", no_end(model)) for i in range(CONVERSATIONS)]
        run_turns(port, moved, range(KILL_AFTER))
        by_instance = [held(i.url) & {c.sid for c in moved} for i in instances]
        victim = max(range(3), key=lambda k: len(by_instance[k]))
        lost = by_instance[victim]
        assert lost
        # Each turn is saved as it ends; wait for the second turns' files to be written.
        wait_for(lambda: all(read_version(sessions / file_name(sid)) == KILL_AFTER for sid in lost),
                 what="the second turns' session files")
        third = threading.Thread(target=run_turns, args=(port, moved, range(KILL_AFTER, TERM_AFTER)))
        third.start()
        time.sleep(0.05)
        instances[victim].proc.send_signal(signal.SIGKILL)
        third.join()
        assert instances[victim].proc.wait(timeout=10) == -signal.SIGKILL

        # Then a second instance drains (SIGTERM) while the fourth turns are sent, and once
        # it has exited the last turns all go to the one instance left (sent only then, so
        # that none can finish on the draining instance first, however fast it is). No
        # request may fail from here.
        failures_before = sum(len(c.failures) for c in moved)
        drained = next(k for k in range(3) if k != victim)
        draining = held(instances[drained].url) & {c.sid for c in moved}
        fourth = threading.Thread(target=run_turns, args=(port, moved, range(TERM_AFTER, TERM_AFTER + 1)))
        fourth.start()
        wait_for(lambda: metric(instances[drained].url, "vllm:num_requests_running"), what="generations in flight")
        instances[drained].proc.send_signal(signal.SIGTERM)
        fourth.join()
        assert instances[drained].proc.wait(timeout=60) == 0
        run_turns(port, moved, range(TERM_AFTER + 1, TURNS))
        assert sum(len(c.failures) for c in moved) == failures_before, [c.failures for c in moved]

        # Every conversation completed, with the calm run's replies, whichever instances
        # served its turns and however often its session moved.
        for c, reference in zip(moved, calm):
            assert len(c.replies) == TURNS and c.replies == reference.replies, c.sid
            # And every turn was as warm as in the calm run: a turn's reply arrives once
            # the turn is on disk, so wherever the next turn lands it finds all of it.
            # Warmer only where the killed instance wrote a turn's file and died before
            # answering: nginx passes the POST on, and the next instance finds the whole
            # prompt taken already (all of it but the last token, which is run again).
            warmth = [cached(u) for u in c.usages]
            if c.sid in lost and warmth[KILL_AFTER] == c.usages[KILL_AFTER]["prompt_tokens"] - 1:
                warmth[KILL_AFTER] = cached(reference.usages[KILL_AFTER])
            assert warmth == [cached(u) for u in reference.usages], c.sid
            assert all(cached(u) > 0 for u in c.usages[1:]), c.sid
        survivor = 3 - victim - drained
        assert held(instances[survivor].url) >= {c.sid for c in moved}
        # The killed instance's sessions came back from their files on the other two,
        # and the drained one's on the survivor: no instance held them before.
        restored = {k: set(re.findall(r"session '(conv-\d+)' restored from disk",
                                      (tmp_path / f"llmd{k}.log").read_text())) for k in range(3)}
        assert lost <= restored[drained] | restored[survivor]
        assert draining <= restored[survivor]
        assert check_files(sessions, killed=instances[victim].proc.pid) >= 2 * CONVERSATIONS


def cached(usage: dict) -> int:
    return usage["prompt_tokens_details"]["cached_tokens"]


COMPLETIONS_200 = 'llmd_requests_total{route="/v1/chat/completions",status="200"}'


def metric(url: str, sample: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        return float(re.search(rf"^{re.escape(sample)} (\S+)$", response.read().decode(), re.M).group(1))


HAPROXY = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if os.access(p, os.X_OK)), None)


@pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy)")
def test_the_haproxy_example_keeps_sessions_on_one_instance_and_skips_a_draining_one(tiny_model, tmp_path):
    config = (ROOT / "contrib" / "haproxy-llmd.cfg").read_text()
    result = subprocess.run([HAPROXY, "-c", "-f", str(ROOT / "contrib" / "haproxy-llmd.cfg")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    with contextlib.ExitStack() as stack:
        instances = [stack.enter_context(llmd_process("--model", str(tiny_model.path), "--threads", "1",
                                                      "--max-sessions", "16")) for _ in range(3)]
        port = free_port()
        config = config.replace("bind 127.0.0.1:8000", f"bind 127.0.0.1:{port}")
        for k, instance in enumerate(instances):
            config = config.replace(f"127.0.0.1:800{k + 1}", f"127.0.0.1:{address(instance.url)[1]}")
        (tmp_path / "haproxy.cfg").write_text(config)
        proc = subprocess.Popen([HAPROXY, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(proc.wait, timeout=20)
        stack.callback(proc.terminate)
        wait_for(lambda: listening(port), what="haproxy to listen")
        body = {"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for k in range(8):  # named sessions, each in a different one of llmd's headers
            for _ in range(3):
                assert request(port, "POST", "/v1/chat/completions", body, {HEADERS[k % 4]: f"h-{k}"})[0] == 200
        holders = [held(i.url) for i in instances]
        assert sorted(sid for h in holders for sid in h) == [f"h-{k}" for k in range(8)]  # each on one
        served = [metric(i.url, COMPLETIONS_200) for i in instances]
        for _ in range(6):
            assert request(port, "POST", "/v1/chat/completions", body)[0] == 200
        assert all(metric(i.url, COMPLETIONS_200) > before for i, before in zip(instances, served))
        # A draining instance answers its health check 503 and leaves the ring; its
        # sessions' requests go to another instance (none fails meanwhile).
        drained = max(range(3), key=lambda k: len(holders[k]))
        instances[drained].proc.send_signal(signal.SIGTERM)
        for k in range(8):
            assert request(port, "POST", "/v1/chat/completions", body, {HEADERS[k % 4]: f"h-{k}"})[0] == 200
        assert instances[drained].proc.wait(timeout=30) == 0
