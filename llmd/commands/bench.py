"""`python -m llmd bench`: engine and HTTP figures, each the median of several runs.

Engine: prompt processing (pp128, pp512) and generation (tg128) at short context,
after the HTTP figures' 252-token prompt and after a 2048-token context. HTTP (a
real `python -m llmd` subprocess on a free port): first-token latency of a
252-token chat prompt, cold (fresh cache) and warm (same session, same prompt:
warm resume), and streaming tok/s, also as a share of the engine's rate at short
context and at the same context (what HTTP itself costs). Bandwidth: generation at
short context as a share of the memory limit, read bandwidth ÷ the weight bytes a
decode step reads, the bandwidth measured around each generation run (right before
and right after it) by the engine's own threads reading a buffer at least as large
as the weights. Memory:
resident set after load and after each of 4 sessions with a full 2048-token cache.
With --conversation: a 10-turn chat through HTTP, with and without warm resume.
With --sessions: sessions on disk (--session-dir), first-token latency of a turn whose session
comes back from its file (after LRU eviction, and after SIGTERM and a restart) next
to a warm turn in memory, and the share of each turn that was cached. With
--shared-prompt: the KV bytes of 8 named sessions sharing a long system prompt (the
prefix cache stores it once) next to one session's. With --streams N: aggregate
generation through HTTP of one stream and of N concurrent ones, against llmd or, with
--url, any server that speaks OpenAI's streamed /v1/completions (llama-server too).
With --speculative: speculative decoding on and off on four tasks, and with 4 busy
streams (llmd/commands/speculative_bench.py). With --held-sessions N: N named sessions,
each warm at --held-tokens tokens, held at once (held_sessions_figures). With --choices
N: one request for N choices next to one for a single choice (choices_figures). With
--infill: an editor's code completion through /infill, against llmd or, with --url,
llama-server (infill_figures). With --rerank: a search's documents reranked through
/v1/rerank, likewise (rerank_figures).
"""
from __future__ import annotations

import http.client
import json
import random
import re
import statistics
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid

from llmd.engine.native import Engine, Sampling

FILLER = ("The quick brown fox jumps over the lazy dog while the farmer counts his sheep "
          "and the river runs quietly past the old mill. ")


def rss_mb(pid: int | str = "self") -> float:
    """A process's resident set in MB (10^6 bytes, like the engine's byte counts); this
    one's by default."""
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib * 1024 / 1e6


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


MEMORY_CTX = 2048  # context of the sessions the memory figures fill
HTTP_PROMPT = 252  # tokens of the chat prompt the HTTP figures send


def memory_figures(path: str, threads: int) -> dict:
    """Resident set before and after load, after a first token (the mapped weights
    are read in then), then after each of 4 sessions filled to MEMORY_CTX tokens,
    next to the engine's own per-session estimate."""
    rss_before = rss_mb()
    with Engine(path, n_threads=threads, n_ctx=MEMORY_CTX, max_sessions=5) as engine:
        rss_load = rss_mb()
        ids = engine.tokenize(FILLER * 200)[:MEMORY_CTX]
        with engine.new_session() as warmup:
            warmup.prefill(ids[:1])
            warmup.decode_one()
        rss_warm = rss_mb()
        sessions, after = [], []
        for _ in range(4):
            sessions.append(engine.new_session())
            sessions[-1].prefill(ids)
            after.append(round(rss_mb(), 1))
        for s in sessions:
            s.close()
        growth = [b - a for a, b in zip([rss_warm] + after, after)]
        return {"rss_before_load_mb": round(rss_before, 1), "rss_after_load_mb": round(rss_load, 1),
                "rss_after_first_token_mb": round(rss_warm, 1),
                "weights_mb": round(engine.info.weight_bytes / 1e6, 1), "memory_ctx": MEMORY_CTX,
                "rss_after_sessions_mb": after, "rss_per_session_mb": round(statistics.median(growth), 1),
                "kv_bytes_per_session": engine.info.bytes_per_session,
                "kv_bytes_per_token": engine.info.kv_bytes_per_token}


def engine_figures(path: str, threads: int, runs: int) -> dict:
    with Engine(path, n_threads=threads, n_ctx=4096, max_sessions=2) as engine:
        ids = engine.tokenize(FILLER * 200)
        figures: dict = {"threads": engine.info.n_threads, "kernels": engine.info.kernels}
        with engine.new_session() as s:
            for n in (128, 512, 2048):
                times = []
                for _ in range(runs):
                    s.reset()
                    t = time.perf_counter()
                    s.prefill(ids[:n])
                    times.append(time.perf_counter() - t)
                figures[f"pp{n}_tok_s"] = round(n / statistics.median(times), 1)

            def tg128(context: int) -> float:
                s.reset()
                s.prefill(ids[:context])
                s.set_sampling(Sampling(logit_bias={i: float("-inf") for i in engine.info.eog_ids}))
                t = time.perf_counter()
                for _ in range(128):
                    s.decode_one()
                return 128 / (time.perf_counter() - t)

            paired = []  # (tg128 tokens/s at short context, read bandwidth around that run)
            for _ in range(runs):
                per_token, before = probe(engine)
                rate = tg128(16)
                paired.append((rate, (before + probe(engine)[1]) / 2))
            figures["tg128_tok_s"] = round(statistics.median(rate for rate, _ in paired), 1)
            for key, context in ((f"tg128_at_{HTTP_PROMPT}_tok_s", HTTP_PROMPT), ("tg128_at_2k_tok_s", 2048)):
                figures[key] = round(statistics.median(tg128(context) for _ in range(runs)), 1)
        figures.update(bandwidth_figures(per_token, paired))
    return figures


PROBE_MIN, PROBE_MAX = 256 << 20, 1 << 30  # bytes the bandwidth probe reads: the weights' size, within these


def probe(engine: Engine) -> tuple[int, float]:
    """(weight bytes a decode step reads, bytes per second the engine's threads read
    from a buffer of the weights' size (at least 256 MiB, more than any cache here; at
    most 1 GiB) in 4 MiB pieces claimed as matmul rows are: the median of 3 passes)."""
    return engine.bandwidth(min(max(engine.info.weight_bytes, PROBE_MIN), PROBE_MAX), 3)


def bandwidth_figures(bytes_per_token: int, paired: list[tuple[float, float]]) -> dict:
    """Generation as a share of what memory allows: a decode step reads every weight
    it uses once, so tokens/s <= read bandwidth / bytes per token. Each pair is one
    generation run's tokens/s and the bandwidth read around it (the mean of a probe
    right before and one right after): this machine's bandwidth can change by half
    within a minute, so only a probe taken at the moment of the run says what the run
    could stream. Each figure is the median over the runs."""
    limits = [rate / bytes_per_token for _, rate in paired]
    shares = [tok_s / limit for (tok_s, _), limit in zip(paired, limits)]
    return {"bytes_per_token_mb": round(bytes_per_token / 1e6, 1),
            "read_bandwidth_gb_s": round(statistics.median(rate for _, rate in paired) / 1e9, 1),
            "tg128_bandwidth_limit_tok_s": round(statistics.median(limits), 1),
            "tg128_share_of_bandwidth_limit": round(statistics.median(shares), 3)}


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def _stream(port: int, body: dict, headers: dict, route: str = CHAT,
            host: str = "127.0.0.1") -> tuple[float, float, list[str], dict, dict]:
    """One streamed request: (seconds to the first content delta, seconds in all,
    the content deltas, usage and timings if the stream reported them)."""
    conn = http.client.HTTPConnection(host, port, timeout=300)
    start = time.perf_counter()
    conn.request("POST", route, json.dumps(body), {"Content-Type": "application/json", **headers})
    first, deltas, usage, timings = 0.0, [], {}, {}
    for line in conn.getresponse():
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(f"{route} failed: {chunk['error'].get('message')}")
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
        choice = chunk["choices"][0] if chunk.get("choices") else {}
        if piece := choice.get("delta", {}).get("content") if route == CHAT else choice.get("text"):
            first = first or time.perf_counter() - start
            deltas.append(piece)
    conn.close()
    return first, time.perf_counter() - start, deltas, usage, timings


def _first_token_s(first: float, timings: dict) -> float:
    """Seconds to a stream's first token: to its first content delta, or, for a model
    that writes no text (random weights), the prefill's time in the server's timings."""
    return first or timings.get("prompt_ms", 0.0) / 1000


def http_figures(path: str | None, threads: int, runs: int, eog_ids: tuple[int, ...]) -> dict:
    """Streams 128 tokens, end-of-generation ids banned as the engine figures ban them.
    Through chat completions, or plain completions when the model's chat template
    cannot be rendered (the figures say which)."""
    proc, port = _start(path, threads, "--max-sessions", "8")
    try:
        model = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]
        route = CHAT if _prompt_tokens(port, model, CHAT, "hello") is not None else COMPLETIONS
        # Grow the text until the rendered prompt has HTTP_PROMPT tokens.
        text, n = "", 0
        words = FILLER.split()
        while n < HTTP_PROMPT:
            text += words[len(text.split()) % len(words)] + " "
            n = _prompt_tokens(port, model, route, text)
            if n is None:
                raise RuntimeError(f"{route} answered no usage")
        body = {"model": model, **_content(route, text), "stream": True, "stream_options": {"include_usage": True},
                "temperature": 0, "max_tokens": 128, "logit_bias": {str(i): -100 for i in eog_ids}}
        cold, warm, rates = [], [], []
        for _ in range(runs):
            sid = uuid.uuid4().hex
            first, total, _, usage, timings = _stream(port, body, {"X-Session-ID": sid}, route)
            first = _first_token_s(first, timings)
            cold.append(first)
            rates.append((usage["completion_tokens"] - 1) / (total - first))
            first, _, _, _, timings = _stream(port, body, {"X-Session-ID": sid}, route)
            warm.append(_first_token_s(first, timings))
            _request(port, "DELETE", f"/v1/sessions/{sid}")
        return {"http_route": route, "http_ttft_cold_s": _median(cold), "http_ttft_warm_s": _median(warm),
                "http_stream_tok_s": round(statistics.median(rates), 1), "http_prompt_tokens": n}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


STREAM_TOKENS = 128  # tokens each stream of --streams generates
STREAM_PROMPT = 64   # prompt tokens of each stream of --streams


def stream_prompts(engine: Engine, count: int, length: int, tag: str) -> list[str]:
    """`count` texts of `length` tokens each (as `engine` tokenizes them) that differ from
    their first words on (`tag` and their index), so that no server can reuse one's cache
    for another."""
    texts = []
    for i in range(count):
        ids = engine.tokenize(f"{tag} {i}: " + FILLER * (length // 8 + 1))[:length]
        text = engine.detokenize(ids).decode("utf-8", "replace")
        if len(engine.tokenize(text)) != length:
            raise RuntimeError(f"no prompt of {length} tokens: the text of {length} tokens tokenizes otherwise")
        texts.append(text)
    return texts


def concurrent_figures(url: str | None, path: str, threads: int, runs: int, streams: int,
                       tokens: int = STREAM_TOKENS, prompt: int = STREAM_PROMPT) -> dict:
    """Aggregate generation through HTTP: per run, one stream alone, then `streams`
    streams started together, each a streamed /v1/completions of a distinct `prompt`-token
    prompt generating `tokens` tokens at temperature 0 with the model's end-of-generation
    ids banned (logit_bias, which llama-server honours as well). A run's aggregate is
    the completion tokens of all its streams over the time from the first request sent
    to the last stream's end. Against the server at `url`, else a `python -m llmd` of
    `path` started for it; `path` names the model whose tokenizer sizes the prompts and
    whose end-of-generation ids are banned. Speeds are medians over the runs, with their
    range; the ratio is the median of the runs' ratios."""
    with Engine(path, n_ctx=16) as engine:
        eog_ids = engine.info.eog_ids
        # A nonce in each, so that no server finds one in its cache from an earlier run;
        # per run one prompt for the single stream and others for the concurrent ones.
        texts = [stream_prompts(engine, streams + 1, prompt, f"{uuid.uuid4().hex[:8]} {r}") for r in range(runs + 1)]
    proc, host, port = _server(url, path, threads)
    try:
        model = json.loads(_request(port, "GET", "/v1/models", host=host))["data"][0]["id"]

        def burst(prompts: list[str]) -> tuple[float, list[dict]]:
            """(tokens/s of all streams together, each stream's usage)."""
            barrier, usages, ends = threading.Barrier(len(prompts) + 1), [None] * len(prompts), [0.0] * len(prompts)

            def one(i: int) -> None:
                body = {"model": model, "prompt": prompts[i], "stream": True, "max_tokens": tokens,
                        "temperature": 0, "stream_options": {"include_usage": True},
                        "logit_bias": {str(t): -100 for t in eog_ids}}
                barrier.wait()
                usages[i] = _stream(port, body, {}, COMPLETIONS, host)[3]
                ends[i] = time.perf_counter()

            workers = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
            for w in workers:
                w.start()
            barrier.wait()
            start = time.perf_counter()
            for w in workers:
                w.join()
            if not all(usages):
                raise RuntimeError("a stream reported no usage")
            return sum(u["completion_tokens"] for u in usages) / (max(ends) - start), usages

        burst(texts[-1][1:])  # the server's first-request costs are not counted
        one, many, prompt_tokens, completion_tokens = [], [], set(), set()
        for r in range(runs):
            for prompts, rates in ((texts[r][:1], one), (texts[r][1:], many)):
                rate, usages = burst(prompts)
                rates.append(rate)
                prompt_tokens.update(u["prompt_tokens"] for u in usages)
                completion_tokens.update(u["completion_tokens"] for u in usages)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return {"streams": streams, "stream_prompt_tokens": sorted(prompt_tokens),
            "stream_completion_tokens": sorted(completion_tokens),
            "one_stream_tok_s": round(statistics.median(one), 1),
            "one_stream_tok_s_range": [round(min(one), 1), round(max(one), 1)],
            f"{streams}_streams_tok_s": round(statistics.median(many), 1),
            f"{streams}_streams_tok_s_range": [round(min(many), 1), round(max(many), 1)],
            f"{streams}_streams_over_one": round(statistics.median(m / o for m, o in zip(many, one)), 2)}


def choices_figures(path: str, threads: int, runs: int, n: int, tokens: int = STREAM_TOKENS,
                    prompt: int = STREAM_PROMPT) -> dict:
    """The time of one /v1/completions request for `n` choices next to one for a single
    choice, per run each of a distinct `prompt`-token prompt, every choice `tokens`
    tokens long (sampled at temperature 0.8 with a seed, end of generation banned), on
    a `python -m llmd` of `path` started for it. Times are medians over the runs, with
    their range; the ratio (one choice's time × n over the n choices' time: how much
    faster they are than n requests one after another) the median of the runs'."""
    with Engine(path, n_ctx=16) as engine:
        eog_ids = engine.info.eog_ids
        texts = [stream_prompts(engine, 2, prompt, f"{uuid.uuid4().hex[:8]} {r}") for r in range(runs + 1)]
    proc, port = _start(path, threads)
    try:
        model = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]

        def request(text: str, choices: int) -> float:
            body = {"model": model, "prompt": text, "n": choices, "max_tokens": tokens, "temperature": 0.8,
                    "seed": 1, "logit_bias": {str(t): -100 for t in eog_ids}}
            start = time.perf_counter()
            usage = json.loads(_request(port, "POST", COMPLETIONS, body))["usage"]
            if usage["completion_tokens"] != choices * tokens:
                raise RuntimeError(f"{choices} choices made {usage['completion_tokens']} tokens, not {choices * tokens}")
            return time.perf_counter() - start

        request(texts[-1][1], n)  # the server's first-request costs are not counted
        one, many = [], []
        for r in range(runs):  # taking turns, so that a run's ratio compares neighbours
            one.append(request(texts[r][0], 1))
            many.append(request(texts[r][1], n))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"choices": n, "choice_tokens": tokens,
            "one_choice_s": _median(one), "one_choice_s_range": [round(min(one), 3), round(max(one), 3)],
            f"{n}_choices_s": _median(many), f"{n}_choices_s_range": [round(min(many), 3), round(max(many), 3)],
            f"{n}_choices_over_{n}_single": round(statistics.median(o * n / m for o, m in zip(one, many)), 2)}


CODE_WORDS = "def return self value items index count result total name data list dict key for in if else".split()


def code_lines(rng: random.Random, n: int) -> str:
    """n lines that look enough like code: indented words."""
    return "".join("    " * rng.randint(0, 2) + " ".join(rng.choice(CODE_WORDS) for _ in range(rng.randint(3, 9)))
                   + "\n" for _ in range(n))


def infill_figures(url: str | None, path: str, threads: int, runs: int, typed: int = 10,
                   tokens: int = 16) -> dict:
    """An editor's code completion through /infill, as llama.vscode asks for it: per run,
    a new file (30 lines before the cursor, 10 after, 8 other files of 12 lines as
    context) whose first request finds nothing cached, then `typed` requests as the
    user types on the cursor line (3 characters more each), all with id_slot 0 and
    `tokens` tokens (top_k 40, top_p 0.99, end of generation banned; the infill step is
    left out: with random weights it ends most replies at once). Against the server at
    `url` (llama-server too), else a `python -m llmd` of `path`, which names the model
    whose end-of-generation ids are banned. Times are medians over all runs' requests,
    with their range."""
    with Engine(path, n_ctx=16) as engine:
        eog_ids = engine.info.eog_ids
    proc, host, port = _server(url, path, threads)
    first, typing, prompt_tokens = [], [], set()
    try:
        for r in range(runs + 1):  # the first is the server's warm-up, not counted
            rng = random.Random(f"{uuid.uuid4()}")  # no server finds a run's files in its cache
            extra = [{"filename": f"module{i}.py", "text": code_lines(rng, 12)} for i in range(8)]
            prefix, suffix = code_lines(rng, 30), code_lines(rng, 10)
            line = "    result = " + "".join(rng.choice(CODE_WORDS) + " " for _ in range(typed))
            for k in range(typed + 1):
                body = {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": extra,
                        "prompt": line[:13 + 3 * k], "n_predict": tokens, "top_k": 40, "top_p": 0.99,
                        "samplers": ["top_k", "top_p"], "cache_prompt": True, "seed": k,
                        "logit_bias": {str(t): -100 for t in eog_ids}}
                start = time.perf_counter()
                reply = json.loads(_request(port, "POST", "/infill", body, host=host))
                elapsed = time.perf_counter() - start
                if reply.get("tokens_predicted") != tokens:
                    raise RuntimeError(f"/infill answered {str(reply)[:200]}")
                if r:
                    (typing if k else first).append(elapsed)
                    prompt_tokens.add(reply["tokens_evaluated"])
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return {"infill_prompt_tokens": [min(prompt_tokens), max(prompt_tokens)], "infill_tokens": tokens,
            "first_request_s": _median(first), "first_request_s_range": [round(min(first), 3), round(max(first), 3)],
            "typing_request_s": _median(typing),
            "typing_request_s_range": [round(min(typing), 3), round(max(typing), 3)]}


PASSAGE_WORDS = ("the river mill farmer sheep market bridge town winter harvest road church school water "
                 "bread stone field north south wind rain light night morning city").split()


def passage(rng: random.Random, n: int) -> str:
    """n words that read enough like a passage of text."""
    return " ".join(rng.choice(PASSAGE_WORDS) for _ in range(n)) + "."


def rerank_figures(url: str | None, path: str, threads: int, runs: int, documents: int = 20,
                   words: int = 120) -> dict:
    """A search's reranking through /v1/rerank: per run a new query and `documents`
    passages of `words` words (as a retriever hands a RAG pipeline's top hits over),
    scored in one request. Against the server at `url` (llama-server --reranking too),
    else a `python -m llmd` of `path`, a reranker. Times are medians over the runs, with
    their range."""
    proc, host, port = _server(url, path, threads)
    times, prompt_tokens = [], set()
    try:
        for r in range(runs + 1):  # the first is the server's warm-up, not counted
            rng = random.Random(f"{uuid.uuid4()}")  # no server finds a run's texts in its cache
            body = {"query": f"Which passage tells of the {passage(rng, 6)}",
                    "documents": [passage(rng, words) for _ in range(documents)]}
            start = time.perf_counter()
            reply = json.loads(_request(port, "POST", "/v1/rerank", body, host=host))
            elapsed = time.perf_counter() - start
            if len(reply.get("results", ())) != documents:
                raise RuntimeError(f"/v1/rerank answered {str(reply)[:200]}")
            if r:
                times.append(elapsed)
                prompt_tokens.add(reply["usage"]["prompt_tokens"])
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    return {"rerank_documents": documents, "rerank_prompt_tokens": [min(prompt_tokens), max(prompt_tokens)],
            "rerank_request_s": _median(times), "rerank_request_s_range": [round(min(times), 3), round(max(times), 3)],
            "rerank_documents_per_s": round(documents / statistics.median(times), 1)}


QUESTIONS = ["Name a colour.", "Name an animal.", "Name a city.", "Name a fruit.", "Name a tool.",
             "Name a river.", "Name a planet.", "Name a metal.", "Name a flower.", "Name a sport."]


def _server(url: str | None, path: str, threads: int) -> tuple[subprocess.Popen | None, str, int]:
    """The server at `url`, else a `python -m llmd` of `path` started for the benchmark:
    (the process started, or None; host; port)."""
    if url is None:
        proc, port = _start(path, threads)
        return proc, "127.0.0.1", port
    parsed = urllib.parse.urlsplit(url)
    return None, parsed.hostname or "127.0.0.1", parsed.port or 80


def _start(path: str | None, threads: int, *flags: str) -> tuple[subprocess.Popen, int]:
    """A server on a free port; its log goes to a file, whose last line says why when
    it ends before it is ready."""
    cmd = [sys.executable, "-m", "llmd", "--port", "0", "--threads", str(threads), *flags]
    if path:
        cmd += ["--model", path]
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        for line in proc.stdout:
            if m := re.search(r"ready on http://[^:]+:(\d+)", line):
                return proc, int(m.group(1))
        proc.wait()
        log.seek(0)
        last = (log.read().strip().splitlines() or ["(no output)"])[-1]
    raise SystemExit(f"llmd: the benchmark's server did not start: {last}")


def conversation_figures(path: str | None, threads: int) -> list[dict]:
    """A 10-turn chat three ways: in one named session (warm resume), without a session
    id (the prefix cache), and named with --no-warm-resume (cold): per turn the prompt
    tokens, the previous turn's total, cached tokens, first-token latency and the
    prefill's milliseconds (`timings.prompt_ms`, which a model that writes no text has too)."""
    rows: list[dict] = [{"turn": t + 1} for t in range(len(QUESTIONS))]
    for mode, flags, headers in (("warm", (), {"X-Session-ID": "bench"}), ("anon", (), {}),
                                 ("cold", ("--no-warm-resume",), {"X-Session-ID": "bench"})):
        proc, port = _start(path, threads, "--max-sessions", "2", *flags)
        try:
            model = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]
            history: list[dict] = [{"role": "system", "content": FILLER * 4}]
            previous = 0
            for row, question in zip(rows, QUESTIONS):
                history.append({"role": "user", "content": question})
                body = {"model": model, "messages": history, "stream": True, "temperature": 0,
                        "max_tokens": 24, "stream_options": {"include_usage": True}}
                first, _, deltas, usage, timings = _stream(port, body, headers)
                history.append({"role": "assistant", "content": "".join(deltas)})
                row["prompt_tokens"] = usage["prompt_tokens"]
                row["previous_total"] = previous
                # Each mode's own too: its prompts differ from the others' when a reply
                # does not tokenize back to the ids generated (a named session feeds those).
                row[f"{mode}_prompt_tokens"], row[f"{mode}_previous_total"] = usage["prompt_tokens"], previous
                row[f"{mode}_cached"] = usage["prompt_tokens_details"]["cached_tokens"]
                row[f"{mode}_ttft_ms"] = round(first * 1000, 1)
                row[f"{mode}_prompt_ms"] = timings.get("prompt_ms", 0.0)  # also when no text came
                previous = usage["total_tokens"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return rows


def session_dir_figures(path: str | None, threads: int, runs: int) -> dict:
    """Three conversations take turns over two session slots, so each comes back from
    its file (--session-dir) every time; each such turn is followed by a second turn
    of the same conversation, warm in memory (the A/B pairs alternate). Then, twice or
    more: SIGTERM, a restart on the same directory, one request of another session
    (so that the process's own first-request costs are not counted), and one turn per
    conversation (restored from the files written at shutdown) followed again by a
    warm one. Cached share: a turn's cached tokens over the previous turn's prompt +
    completion. A turn asks for one token, so its latency is its first token's, also
    for a random-weight model whose tokens may have no text to stream."""
    names = ("x", "y", "z")
    with tempfile.TemporaryDirectory(prefix="llmd-bench-sessions-") as directory:
        flags = ("--max-sessions", "3", "--ctx", "4096", "--session-dir", directory)
        histories = {sid: [{"role": "system", "content": FILLER * 16}] for sid in names}
        last_total: dict[str, int] = {}
        shares, cold, disk, memory, restarted, after = [], [], [], [], [], []

        def turn(port: int, model: str, sid: str, times: list[float]) -> None:
            history = histories[sid]
            history.append({"role": "user", "content": QUESTIONS[len(history) % len(QUESTIONS)]})
            body = {"model": model, "messages": history, "temperature": 0, "max_tokens": 1}
            start = time.perf_counter()
            reply = json.loads(_request(port, "POST", CHAT, body, {"X-Session-ID": sid}))
            first = time.perf_counter() - start
            usage = reply["usage"]
            history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            if sid in last_total:
                shares.append(usage["prompt_tokens_details"]["cached_tokens"] / last_total[sid])
            last_total[sid] = usage["prompt_tokens"] + usage["completion_tokens"]
            times.append(first)

        rounds = max(2, -(-runs // len(names)))
        proc, port = _start(path, threads, *flags)
        try:
            model = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]
            for sid in names:
                turn(port, model, sid, cold)
            for _ in range(rounds):
                for sid in names:  # evicted by the other two since its last turn: from disk
                    turn(port, model, sid, disk)
                    turn(port, model, sid, memory)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=300)
        for _ in range(rounds):
            proc, port = _start(path, threads, *flags)
            try:
                _request(port, "POST", CHAT, {"model": model, "messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 1})
                for sid in names:
                    turn(port, model, sid, restarted)
                    turn(port, model, sid, after)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=300)

    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 1)

    return {"sessions_min_cached_share": round(min(shares), 3), "sessions_turns": len(shares) + len(names),
            "sessions_history_tokens": max(last_total.values()), "sessions_ttft_cold_ms": ms(cold),
            "sessions_ttft_from_disk_ms": ms(disk), "sessions_ttft_in_memory_ms": ms(memory),
            "sessions_ttft_after_restart_ms": ms(restarted), "sessions_ttft_in_memory_after_restart_ms": ms(after),
            "sessions_from_disk_over_memory": round(statistics.median(disk) / statistics.median(memory), 2),
            "sessions_after_restart_over_memory": round(statistics.median(restarted) / statistics.median(after), 2)}


SHARED_SESSIONS = 8


def shared_prompt_figures(path: str | None, threads: int) -> dict:
    """SHARED_SESSIONS named sessions whose chats start with the same system prompt of
    170 short rules (about 1,500 tokens), each asking one question: the engine's KV
    bytes (`llmd_kv_cache_bytes`, each block once) after the first and after the last,
    and the fewest prompt tokens a later session found cached."""
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(170))
    proc, port = _start(path, threads, "--ctx", "4096", "--max-sessions", str(SHARED_SESSIONS + 2))
    try:
        model = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]
        held, cached, prompt = [], [], 0
        for i in range(SHARED_SESSIONS):
            body = {"model": model, "temperature": 0, "max_tokens": 8,
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Say {i}."}]}
            usage = json.loads(_request(port, "POST", CHAT, body, {"X-Session-ID": f"shared-{i}"}))["usage"]
            prompt = usage["prompt_tokens"]
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            metrics = _request(port, "GET", "/metrics").decode()
            held.append(float(re.search(r"^llmd_kv_cache_bytes (\S+)$", metrics, re.M).group(1)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"shared_prompt_tokens": prompt, "shared_sessions": SHARED_SESSIONS,
            "shared_min_cached_tokens_after_the_first": min(cached[1:]),
            "shared_kv_bytes_one_session": int(held[0]), "shared_kv_bytes_all_sessions": int(held[-1]),
            "shared_all_over_one": round(held[-1] / held[0], 2)}


HELD_EXTRA = 8  # tokens each request of held_sessions_figures adds to a session's history


def held_sessions_figures(path: str | None, threads: int, count: int, tokens: int, kv_type: str) -> dict:
    """`count` named sessions, each warm at `tokens` tokens, held at once by one server
    whose KV cache stores keys and values as `kv_type`. Filling them by prefill would
    take count times one prefill, so one session prefills the `tokens` ids for real
    (in this process) and its exported state is written under `count` ids by the
    server's own session-file writer (SessionStore, with the fingerprint the server
    computes), into a temporary --session-dir. The server runs with --prefix-cache off,
    so that no two sessions share a block, and --max-sessions count + 1. Two rounds of
    one request per session follow: the `tokens` ids and HELD_EXTRA more, one token
    out; the first round loads each session from its file, the second finds it in
    memory. Figures: the requests that found the whole history cached in each round,
    their median latency (one token out: the first token's), and, with all sessions
    held, the server's VmRSS and its KV bytes (`llmd_kv_cache_bytes`, a shared block
    once). The files take count x the state's bytes in the temporary directory
    (TMPDIR)."""
    from llmd import _native
    from llmd.serving.session_store import SessionStore, kv_type_name, model_fingerprint
    model = path or _default()
    with tempfile.TemporaryDirectory(prefix="llmd-bench-held-") as directory:
        with Engine(model, n_threads=threads, n_ctx=tokens + 2 * HELD_EXTRA, max_sessions=1, kv_type_k=kv_type,
                    kv_type_v=kv_type) as engine:
            ids = engine.tokenize(FILLER * (tokens // 8 + HELD_EXTRA))[:tokens + HELD_EXTRA]
            with engine.new_session() as session:
                start = time.perf_counter()
                session.prefill(ids[:tokens])
                prefill_s = time.perf_counter() - start
                state = bytes(session.export_state(tokens))
            header_bytes, file_bytes = engine.file_layout()
            store = SessionStore(directory, 0, model_fingerprint(model, header_bytes, file_bytes, _native.__file__,
                                                                 engine.info.kernels),
                                 engine.info.n_ctx, kv_type_name(engine.info.kv_type_k, engine.info.kv_type_v))
            n_ctx, per_token = engine.info.n_ctx, engine.info.kv_bytes_per_token
        store.scan()
        for i in range(count):
            if store.save(f"held-{i}", state, [], tokens) is None:
                raise OSError(f"cannot write {count} session files of {len(state)} bytes into {directory}")
        file_mb = store.bytes_used / count / 1e6
        del state
        proc, port = _start(path, threads, "--ctx", str(n_ctx), "--kv-type", kv_type, "--max-sessions",
                            str(count + 1), "--prefix-cache", "off", "--session-dir", directory,
                            "--session-dir-max", "0", "--session-save-delay", "86400")
        try:
            rss_loaded = rss_mb(proc.pid)
            model_id = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]
            rounds = []
            for _ in range(2):
                cached, times = [], []
                for i in range(count):
                    body = {"model": model_id, "prompt": ids, "max_tokens": 1, "temperature": 0,
                            "session_id": f"held-{i}"}
                    start = time.perf_counter()
                    reply = json.loads(_request(port, "POST", COMPLETIONS, body))
                    times.append(time.perf_counter() - start)
                    if "usage" not in reply:
                        raise RuntimeError(f"session held-{i}: {reply}")
                    cached.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
                rounds.append((sum(c >= tokens for c in cached), statistics.median(times) * 1000, max(times) * 1000))
            rss_held = rss_mb(proc.pid)
            metrics = _request(port, "GET", "/metrics").decode()
            kv_bytes = float(re.search(r"^llmd_kv_cache_bytes (\S+)$", metrics, re.M).group(1))
        finally:
            proc.kill()  # no shutdown: it would write every session's file again
            proc.wait(timeout=60)
    (warm_disk, disk_ms, disk_max), (warm_memory, memory_ms, memory_max) = rounds
    return {"held_sessions": count, "held_tokens": tokens, "held_kv_type": kv_type,
            "held_kv_bytes_per_token": per_token, "held_prefill_s": round(prefill_s, 1),
            "held_file_mb": round(file_mb, 1), "held_warm_from_disk": warm_disk,
            "held_ttft_from_disk_ms": round(disk_ms, 1), "held_ttft_from_disk_max_ms": round(disk_max, 1),
            "held_warm_in_memory": warm_memory, "held_ttft_in_memory_ms": round(memory_ms, 1),
            "held_ttft_in_memory_max_ms": round(memory_max, 1), "held_rss_after_load_mb": round(rss_loaded),
            "held_rss_all_held_mb": round(rss_held), "held_kv_cache_bytes": int(kv_bytes),
            "held_kv_cache_mb_per_session": round(kv_bytes / 1e6 / count, 1)}


def _request(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None,
             host: str = "127.0.0.1") -> bytes:
    conn = http.client.HTTPConnection(host, port, timeout=300)
    conn.request(method, path, json.dumps(body) if body else None,
                 {"Content-Type": "application/json", **(headers or {})})
    data = conn.getresponse().read()
    conn.close()
    return data


def _content(route: str, text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]} if route == CHAT else {"prompt": text}


def _prompt_tokens(port: int, model: str, route: str, text: str) -> int | None:
    """Prompt tokens of text sent to route, or None when the route answers an error."""
    body = {"model": model, **_content(route, text), "max_tokens": 1}
    usage = json.loads(_request(port, "POST", route, body)).get("usage")
    return usage["prompt_tokens"] if usage else None


def _default() -> str:
    from llmd.engine import fetch
    return str(fetch.default_model())


def run(path: str | None, threads: int, runs: int, as_json: bool, conversation: bool = False,
        sessions: bool = False, shared_prompt: bool = False, streams: int = 0, url: str | None = None,
        held_sessions: int = 0, held_tokens: int = 8192, kv_type: str = "f16", choices: int = 0,
        infill: bool = False, rerank: bool = False) -> int:
    if infill or rerank:
        figures = (infill_figures if infill else rerank_figures)(url, path or _default(), threads, runs)
        print(json.dumps(figures) if as_json else "\n".join(f"  {k:<42} {v}" for k, v in figures.items()))
        return 0
    if choices:
        figures = choices_figures(path or _default(), threads, runs, choices)
        print(json.dumps(figures) if as_json else "\n".join(f"  {k:<42} {v}" for k, v in figures.items()))
        return 0
    if held_sessions:
        figures = held_sessions_figures(path, threads, held_sessions, held_tokens, kv_type)
        print(json.dumps(figures) if as_json else "\n".join(f"  {k:<42} {v}" for k, v in figures.items()))
        return 0
    if streams:
        figures = concurrent_figures(url, path or _default(), threads, runs, streams)
        print(json.dumps(figures) if as_json else "\n".join(f"  {k:<42} {v}" for k, v in figures.items()))
        return 0
    if sessions or shared_prompt:
        figures = session_dir_figures(path, threads, runs) if sessions else shared_prompt_figures(path, threads)
        print(json.dumps(figures) if as_json else "\n".join(f"  {k:<42} {v}" for k, v in figures.items()))
        return 0
    if conversation:
        rows = conversation_figures(path, threads)
        if as_json:
            print(json.dumps(rows))
            return 0
        print("turn  prompt  previous total  named: cached  ttft_ms  prefill_ms   anonymous: cached  ttft_ms"
              "  prefill_ms   named, --no-warm-resume: cached  ttft_ms  prefill_ms")
        for r in rows:
            print(f"{r['turn']:>4}  {r['prompt_tokens']:>6}  {r['previous_total']:>14}  {r['warm_cached']:>13}"
                  f"  {r['warm_ttft_ms']:>7}  {r['warm_prompt_ms']:>10}  {r['anon_cached']:>18}"
                  f"  {r['anon_ttft_ms']:>7}  {r['anon_prompt_ms']:>10}   {r['cold_cached']:>31}"
                  f"  {r['cold_ttft_ms']:>7}  {r['cold_prompt_ms']:>10}")
        return 0
    model = path or _default()
    figures = memory_figures(model, threads)
    figures.update(engine_figures(model, threads, runs))
    if not as_json:  # the engine figures stand on their own: show them before HTTP can fail
        print(f"llmd bench: {model}, median of {runs} runs", flush=True)
        for key, value in figures.items():
            print(f"  {key:<34} {value}", flush=True)
    with Engine(model, n_ctx=16) as engine:
        eog_ids = engine.info.eog_ids
    engine_keys = set(figures)
    try:
        figures.update(http_figures(path, threads, runs, eog_ids))
        for engine_key in ("tg128_tok_s", f"tg128_at_{HTTP_PROMPT}_tok_s"):
            figures[f"http_stream_share_of_{engine_key[:-6]}"] = round(figures["http_stream_tok_s"] / figures[engine_key], 3)
    except (OSError, RuntimeError, StopIteration, KeyError, ValueError) as e:
        figures["http_error"] = f"{type(e).__name__}: {e}"
    if as_json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            if key not in engine_keys:
                print(f"  {key:<34} {value}")
    return 1 if "http_error" in figures else 0
