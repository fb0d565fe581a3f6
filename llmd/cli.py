"""Command line: `python -m llmd [serve]`, `pull`, `tokenize`, `perplexity`, `bench`, `quantize`.

Every flag can also be set through an environment variable LLMD_<FLAG> (dashes
as underscores, e.g. LLMD_PORT=9000); a flag on the command line wins. `--help`
shows each flag's default and its variable.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shlex
import signal
import socket
import sys
import time

from llmd import logs
from llmd.api.validation import MAX_CHOICES
from llmd.engine import KV_TYPES, fetch
from llmd.serving.prefill import SCOPES
from llmd.serving.speculative import MAX_DRAFT, MODES, N_MAX

log = logging.getLogger("llmd")

SUBCOMMANDS = ("serve", "pull", "tokenize", "perplexity", "bench", "quantize")


def _env_name(dest: str) -> str:
    return "LLMD_" + dest.upper().replace("-", "_")


def _env(name: str, default, kind=str, choices: tuple[str, ...] = ()):
    """The flag's default: LLMD_<NAME> converted by `kind` if it is set, else `default`.
    (argparse checks a flag's type and choices on the command line only.)"""
    var = _env_name(name)
    raw = os.environ.get(var)
    if raw is None:
        return default
    try:
        if choices and raw not in choices:
            raise ValueError(f"choose from {', '.join(choices)}")
        if kind is bool:
            word = raw.strip().lower()
            if word not in ("1", "true", "yes", "on", "0", "false", "no", "off", ""):
                raise ValueError("expected 1/0, true/false, yes/no or on/off")
            return word in ("1", "true", "yes", "on")
        if kind is list:
            return [v for v in raw.split(",") if v]
        return kind(raw)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"llmd: invalid {var}={raw!r}: {exc}")


class _HelpFormatter(argparse.HelpFormatter):
    """Each flag's help ends with its default and the environment variable it reads."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.dest == "help":
            return text
        if "(default:" not in text:
            text += f" (default: {_size_text(action.default)})" if action.type is _size else " (default: %(default)s)"
        return text + f" [env {_env_name(action.dest)}]"


_UNITS = {"T": 1 << 40, "G": 1 << 30, "M": 1 << 20, "K": 1 << 10}


def _size(text: str) -> int:
    """Bytes from '4G', '512M', '1000000'."""
    text = text.strip().upper()
    scale = _UNITS.get(text[-1:], 1)
    value = float(text[:-1] if scale > 1 else text)
    if not 0 <= value * scale < 1 << 62:  # and finite
        raise argparse.ArgumentTypeError(f"invalid size {text!r}")
    return int(value * scale)


def _size_text(size: int) -> str:
    """A size as flags take it and the README writes it: '16M' for 16 << 20, bytes when
    no unit divides it."""
    unit = next((u for u, scale in _UNITS.items() if size and size % scale == 0), None)
    return f"{size // _UNITS[unit]}{unit}" if unit else str(size)


INT32_MAX = 2**31 - 1  # the engine's options are 32-bit ints


def _int_in(lo: int, hi: int = INT32_MAX):
    """A flag's type: an integer from lo to hi."""
    def integer(text: str) -> int:
        n = int(text)
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be {lo}..{hi}")
        return n
    return integer


_count, _positive, _port, _draft_max = _int_in(0), _int_in(1), _int_in(0, 65535), _int_in(0, MAX_DRAFT)
_choices = _int_in(2, MAX_CHOICES)


def _api_key(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an API key cannot be empty")
    return text


def _speculative(text: str) -> str:
    """--speculative: a drafter the runtime has."""
    if text not in MODES:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(MODES)}")
    return text


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=_env("model", None),
                   help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched once)")
    p.add_argument("--threads", type=_count, default=_env("threads", 0, _count),
                   help="engine threads (default: 0 = one per core)")
    p.add_argument("--ctx", type=_count, default=_env("ctx", 0, _count),
                   help="context tokens per session (default: 0 = the model's, at most 8192)")


def _kv_type_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-type", choices=KV_TYPES, default=_env("kv_type", "f16", choices=KV_TYPES),
                   help="how the KV cache stores keys and values: f16, or quantized per 32 values as q8_0 "
                        "(half the memory) or q4_0 (a quarter)")
    p.add_argument("--kv-type-k", choices=KV_TYPES, default=_env("kv_type_k", None, choices=KV_TYPES),
                   help="keys alone (default: --kv-type)")
    p.add_argument("--kv-type-v", choices=KV_TYPES, default=_env("kv_type_v", None, choices=KV_TYPES),
                   help="values alone (default: --kv-type)")


def speculative_mode(args: argparse.Namespace) -> str:
    """The drafter --speculative and --draft-model ask for; fetch.ModelError when they
    do not go together."""
    mode = args.speculative or ("draft" if args.draft_model else "ngram")
    if mode == "draft" and not args.draft_model:
        raise fetch.ModelError("--speculative draft needs --draft-model PATH.gguf (a smaller model with the "
                               "same vocabulary)")
    if mode != "draft" and args.draft_model:
        raise fetch.ModelError(f"--draft-model drafts only with --speculative draft, not '{mode}'")
    return mode


def kv_types(args: argparse.Namespace) -> tuple[str, str]:
    """The (keys, values) KV types the flags ask for."""
    return args.kv_type_k or args.kv_type, args.kv_type_v or args.kv_type


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llmd", description="A small, fast, OpenAI-compatible LLM server.",
                                     formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(dest="command")
    fmt = _HelpFormatter

    # serve is the command when none is named, so its usage line shows it optional.
    serve = sub.add_parser("serve", help="serve the model over HTTP (the default command)", formatter_class=fmt,
                           prog=f"{parser.prog} [serve]",
                           description="Serve the model over HTTP: the OpenAI API, a status and chat page at /, "
                                       "Prometheus metrics at /metrics.",
                           epilog="Other commands: pull, tokenize, perplexity, bench "
                                  "(python -m llmd COMMAND --help).")
    _model_flags(serve)
    _kv_type_flags(serve)
    serve.add_argument("--host", default=_env("host", "127.0.0.1"), help="address to bind")
    serve.add_argument("--port", type=_port, default=_env("port", 8000, _port), help="port to bind")
    serve.add_argument("--model-alias", action="append", default=_env("model_alias", [], list),
                       help="extra model id accepted in requests (repeatable)")
    serve.add_argument("--chat-template", default=_env("chat_template", None),
                       help="chat template to use instead of the model's: a Jinja file, or chatml or llama3")
    serve.add_argument("--max-sessions", type=_count, default=_env("max_sessions", 0, _count),
                       help="session slots including the scratch slot (default: 0 = from --kv-budget)")
    serve.add_argument("--kv-budget", type=_size, default=_env("kv_budget", 0, _size),
                       help="memory for KV caches, e.g. 4G (default: 0 = a quarter of RAM)")
    serve.add_argument("--session-eviction", choices=("lru", "none"),
                       default=_env("session_eviction", "lru", choices=("lru", "none")),
                       help="when the table is full: evict the least recently used idle session, or refuse")
    serve.add_argument("--session-dir", default=_env("session_dir", None),
                       help="keep named sessions in files in this directory: idle, evicted and (at "
                            "shutdown) live sessions are written, and resume warm from their files")
    serve.add_argument("--session-dir-max", type=_size, default=_env("session_dir_max", 4 << 30, _size),
                       help="disk space for --session-dir, e.g. 20G; the least recently used files go "
                            "first (0: no limit)")
    serve.add_argument("--session-save-delay", type=float, default=_env("session_save_delay", 10.0, float),
                       help="with --session-dir: seconds a named session stays idle before its file is "
                            "written; 0 writes it at the end of every turn, before the reply's last bytes "
                            "are sent (for a directory that several instances share)")
    serve.add_argument("--scratch-reuse", action="store_true", default=_env("scratch_reuse", False, bool),
                       help="let anonymous requests reuse the scratch session's cache")
    serve.add_argument("--no-warm-resume", action="store_true", default=_env("no_warm_resume", False, bool),
                       help="never reuse a session's KV cache (for A/B measurement)")
    serve.add_argument("--speculative", type=_speculative, default=_env("speculative", None, _speculative),
                       metavar="{off,ngram,draft,mtp}",
                       help="speculative decoding: 'ngram' drafts the continuation of a repeated n-gram of the "
                            "conversation (prompt lookup), 'draft' lets a smaller model (--draft-model) guess "
                            "the next tokens, 'mtp' the model's own multi-token-prediction block (Qwen3.5 and "
                            "GLM-4.5 files that have one); the model verifies a draft in one pass, without changing "
                            "any output token; 'off' decodes one token per step (default: draft with --draft-model, "
                            "else ngram)")
    serve.add_argument("--draft-model", default=_env("draft_model", None),
                       help="GGUF file of a smaller model with the same vocabulary (e.g. a lower-bit "
                            "quantization of the model) that drafts for --speculative draft")
    serve.add_argument("--draft-max", type=_draft_max, default=_env("draft_max", N_MAX, _draft_max),
                       help="longest speculative proposal in tokens, unless a request sets speculative.n_max "
                            f"(0..{MAX_DRAFT})")
    serve.add_argument("--prefix-cache", choices=SCOPES, default=_env("prefix_cache", "key", choices=SCOPES),
                       help="share cached prompt prefixes between requests: among those with the same API key "
                            "(all of them when no key is configured), among all, or not at all")
    serve.add_argument("--prefix-cache-size", type=_size, default=_env("prefix_cache_size", 0, _size),
                       help="memory for cached prefixes no session holds any more, e.g. 512M "
                            "(default: 0 = one full context's KV)")
    serve.add_argument("--max-body-bytes", type=_size, default=_env("max_body_bytes", 16 << 20, _size),
                       help="largest request body")
    # Read from LLMD_API_KEY only when serving, so that --help never prints a key.
    serve.add_argument("--api-key", type=_api_key, action="append",
                       help="require this key (Authorization: Bearer KEY or X-Api-Key) on every route "
                            "but /health (repeatable; LLMD_API_KEY takes a comma-separated list)")
    serve.add_argument("--cors-origin", action="append", default=_env("cors_origin", [], list),
                       help="let pages from this origin call the API, e.g. https://app.example (repeatable; "
                            "* for any)")
    serve.add_argument("--allowed-host", action="append", default=_env("allowed_host", [], list),
                       help="a Host name to serve besides the bound address, localhost, this machine's "
                            "name and IP addresses, when there is no API key, e.g. llmd.lan (repeatable)")
    serve.add_argument("--log-prompts", action="store_true", default=_env("log_prompts", False, bool),
                       help="log prompt and completion text (never logged otherwise)")
    serve.add_argument("--max-connections", type=_positive, default=_env("max_connections", 256, _positive),
                       help="open connections; more are answered 503 and closed")
    serve.add_argument("--max-queue", type=_count, default=_env("max_queue", 64, _count),
                       help="generations waiting to start; more are answered 503 (0: no limit)")
    serve.add_argument("--max-tokens-limit", type=_count, default=_env("max_tokens_limit", 0, _count),
                       help="cap on any request's max_tokens (0: the context)")
    serve.add_argument("--header-timeout", type=float, default=_env("header_timeout", 10.0, float),
                       help="seconds to receive a request's headers")
    serve.add_argument("--body-timeout", type=float, default=_env("body_timeout", 60.0, float),
                       help="seconds to receive a request's body")
    serve.add_argument("--keepalive-timeout", type=float, default=_env("keepalive_timeout", 5.0, float),
                       help="seconds an idle connection waits for its next request")
    serve.add_argument("--write-timeout", type=float, default=_env("write_timeout", 60.0, float),
                       help="seconds a response write waits for a client that does not read; then "
                            "its generation is cancelled")
    serve.add_argument("--shutdown-grace", type=float, default=_env("shutdown_grace", 10.0, float),
                       help="on SIGTERM/SIGINT, /health answers 503 and new requests are refused with 503; "
                            "requests in flight or queued get this many seconds to finish, then llmd exits")
    levels = ("debug", "info", "warning", "error")
    serve.add_argument("--log-level", default=_env("log_level", "info", choices=levels), choices=levels,
                       help="log verbosity")
    serve.add_argument("--log-format", default=_env("log_format", "text", choices=logs.FORMATS), choices=logs.FORMATS,
                       help="log lines as text, or one JSON object per line")

    pull = sub.add_parser("pull", help="fetch the default model into the cache", formatter_class=fmt)
    pull.add_argument("--quiet", action="store_true", default=_env("quiet", False, bool), help="no progress output")

    tok = sub.add_parser("tokenize", help="print the token ids of TEXT as JSON", formatter_class=fmt)
    _model_flags(tok)
    tok.add_argument("--special", action="store_true", default=_env("special", False, bool),
                     help="recognise control tokens such as <|im_start|>")
    tok.add_argument("text")

    ppl = sub.add_parser("perplexity", help="perplexity of a text file", formatter_class=fmt)
    _model_flags(ppl)
    _kv_type_flags(ppl)
    ppl.set_defaults(ctx=_env("ctx", 512, int))
    ppl.add_argument("--file", default=_env("file", None), required=_env("file", None) is None,
                     help="UTF-8 text file")
    ppl.add_argument("--against-f16", action="store_true", default=_env("against_f16", False, bool),
                     help="score the text with an f16 cache too: the quantized cache's cost in %% and its "
                          "standard error over the windows")

    bench = sub.add_parser("bench", help="engine and HTTP speed and memory figures", formatter_class=fmt)
    bench.add_argument("--model", default=_env("model", None), help="GGUF model file (default: the default model)")
    bench.add_argument("--threads", type=_count, default=_env("threads", 0, _count),
                       help="engine threads (0 = one per core)")
    bench.add_argument("--runs", type=_positive, default=_env("runs", 5, _positive),
                       help="runs per figure (the median is reported)")
    bench.add_argument("--json", action="store_true", default=_env("json", False, bool), help="print one JSON object")
    bench.add_argument("--conversation", action="store_true", default=_env("conversation", False, bool),
                       help="instead: a 10-turn chat, first-token latency in a named session, without a session "
                            "id (prefix cache), and without warm resume")
    bench.add_argument("--sessions", action="store_true", default=_env("sessions", False, bool),
                       help="instead: sessions on disk, first-token latency after eviction and after a "
                            "restart next to a warm turn in memory")
    bench.add_argument("--shared-prompt", action="store_true", default=_env("shared_prompt", False, bool),
                       help="instead: KV bytes of 8 named sessions that share a long system prompt, next to one's")
    bench.add_argument("--held-sessions", type=_count, default=_env("held_sessions", 0, _count),
                       help="instead: this many named sessions, each warm at --held-tokens tokens, held at once "
                            "by one server (--kv-type): its resident set and KV bytes, and each session's "
                            "first-token latency from its file and in memory (the files, one prefill's state "
                            "written under every id, take this many times its bytes in TMPDIR)")
    bench.add_argument("--held-tokens", type=_positive, default=_env("held_tokens", 8192, _positive),
                       help="--held-sessions: each session's history in tokens")
    bench.add_argument("--kv-type", choices=KV_TYPES, default=_env("kv_type", "f16", choices=KV_TYPES),
                       help="--held-sessions: how the KV cache stores keys and values")
    bench.add_argument("--streams", type=_count, default=_env("streams", 0, _count),
                       help="instead: aggregate tokens/s of one stream and of this many concurrent ones through "
                            "HTTP (streamed /v1/completions, 128 tokens each)")
    bench.add_argument("--choices", type=_choices, default=_env("choices", 0, _choices),
                       help="instead: the time of one request for this many choices (n) next to one for a "
                            "single choice (/v1/completions, 128 tokens each)")
    bench.add_argument("--infill", action="store_true", default=_env("infill", False, bool),
                       help="instead: code completion through /infill as an editor asks for it, the first "
                            "request of a file and those as the user types (a model with fill-in-the-middle "
                            "tokens; --url measures another server, e.g. llama-server)")
    bench.add_argument("--rerank", action="store_true", default=_env("rerank", False, bool),
                       help="instead: a search's 20 documents of 120 words reranked in one /v1/rerank request "
                            "(a reranker model; --url measures another server, e.g. llama-server --reranking)")
    # Its own variable: LLMD_SPECULATIVE is the server's mode (off|ngram).
    bench.add_argument("--speculative", action="store_true", dest="bench_speculative",
                       default=_env("bench_speculative", False, bool),
                       help="instead: single-stream decode speed with speculative decoding on and off on four "
                            "tasks (code edit, RAG answer, JSON rewrite, open chat), and 4 busy streams")
    bench.add_argument("--draft-model", default=_env("draft_model", None),
                       help="--speculative: draft with this model (--speculative draft) instead of prompt lookup")
    bench.add_argument("--mtp", action="store_true", default=_env("mtp", False, bool),
                       help="--speculative: draft with the model's multi-token-prediction block (--speculative mtp) "
                            "instead of prompt lookup")
    bench.add_argument("--url", default=_env("url", None),
                       help="--streams, --infill, --rerank: measure the server at this URL (any OpenAI-compatible one, "
                            "e.g. llama-server) instead of starting llmd; --model names its model file")
    bench.add_argument("--accuracy", action="store_true", default=_env("accuracy", False, bool),
                       help="instead: what the quantized kernels cost (context 512, --file TEXT): the model "
                            "and its F32 twin (the same weights decoded, computed without quantizing "
                            "activations) under each kernel variant this CPU runs, the perplexity cost in %% and "
                            "the mean KL divergence from the twin; exits 1 when a cost is above 0.5%%. E.g. "
                            "python -m llmd bench --accuracy --model F.gguf --file TEXT")
    bench.add_argument("--file", default=_env("file", None), help="--accuracy: the UTF-8 text to score")
    bench.add_argument("--twin", default=_env("twin", None),
                       help="--accuracy: the F32 twin's path, used if it exists, else written there and kept "
                            "(default: a temporary file beside the model)")

    quant = sub.add_parser("quantize", help="write a GGUF model in another weight format", formatter_class=fmt,
                           description="Re-encodes IN as the file mix TYPE (llama-quantize's rules: e.g. Q4_K_M "
                                       "keeps Q6_K for the output matrix and some attn_v / ffn_down layers).")
    quant.add_argument("input", metavar="IN.gguf")
    quant.add_argument("output", metavar="OUT.gguf")
    quant.add_argument("type", metavar="TYPE", help="one of " + ", ".join(_quantize_mixes()))
    quant.add_argument("--threads", type=_count, default=_env("threads", 0, _count), help="threads (0 = one per core)")
    quant.add_argument("--allow-requantize", action="store_true", default=_env("allow_requantize", False, bool),
                       help="re-encode tensors that are already quantized (loses quality)")
    return parser


def _quantize_mixes() -> list[str]:
    from llmd.commands.quantize import MIXES
    return list(MIXES)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        argv.insert(0, "serve")  # so `python -m llmd --help` lists the serve flags
    args = build_parser().parse_args(argv)
    from llmd.engine.native import EngineError
    try:
        if args.command == "pull":
            print(fetch.default_model(progress=not args.quiet))
            return 0
        if args.command == "tokenize":
            from llmd.commands import tokenize
            return tokenize.run(args.model, args.threads, args.ctx, args.text, args.special)
        if args.command == "perplexity":
            from llmd.commands import perplexity
            return perplexity.run(args.model, args.threads, args.ctx, args.file, kv_types(args), args.against_f16)
        if args.command == "quantize":
            return cmd_quantize(args)
        if args.command == "bench" and args.accuracy:
            if args.file is None:
                print("llmd: bench --accuracy needs --file TEXT", file=sys.stderr)
                return 2
            from llmd.commands import accuracy
            return accuracy.run(str(fetch.resolve_model(args.model)), args.file, args.twin, args.threads, args.json)
        if args.command == "bench" and args.bench_speculative:
            from llmd.commands import speculative_bench
            if args.mtp and args.draft_model:
                print("llmd: bench --speculative drafts with --draft-model or --mtp, not both", file=sys.stderr)
                return 2
            return speculative_bench.run(args.model, args.threads, args.runs, args.json, args.draft_model, args.mtp)
        if args.command == "bench":
            from llmd.commands import bench
            return bench.run(args.model, args.threads, args.runs, args.json, args.conversation, args.sessions,
                             args.shared_prompt, args.streams, args.url, args.held_sessions, args.held_tokens,
                             args.kv_type, args.choices, args.infill, args.rerank)
        return cmd_serve(args)
    # A file that cannot be read or opened as a model (the commands' own ones, the server's
    # are logged): one line, not a traceback.
    except (fetch.ModelError, EngineError, OSError, UnicodeDecodeError) as exc:
        print(f"llmd: {exc}", file=sys.stderr)
        return 2


def cmd_quantize(args) -> int:
    from llmd.commands.quantize import QuantizeError, quantize_file
    try:
        quantize_file(args.input, args.output, args.type, n_threads=args.threads,
                      allow_requantize=args.allow_requantize)
    except QuantizeError as exc:
        print(f"llmd: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_serve(args) -> int:
    args.speculative = speculative_mode(args)
    logs.configure(args.log_level, args.log_format)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


async def serve(args) -> None:
    from llmd import errors
    from llmd.api.access import AccessPolicy, Guard, exposure_warning
    from llmd.api.answers import transport_refusal
    from llmd.api.routes import Api, App, Options
    from llmd.engine.native import EngineError
    from llmd.http.parser import Limits
    from llmd.http.server import HttpServer
    from llmd.prompt import templates
    from llmd.serving.metrics import ServerMetrics
    from llmd.serving.runtime import Runtime
    from llmd.serving.sessions import SessionTable

    app = App()
    limits = Limits(max_body_bytes=args.max_body_bytes, max_connections=args.max_connections,
                    header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                    keepalive_timeout=args.keepalive_timeout, write_timeout=args.write_timeout)
    # This machine's own name cannot be rebound by a web page's DNS: it is served too.
    policy = AccessPolicy(tuple(args.api_key or _env("api_key", [], list)), tuple(args.cors_origin),
                          args.host, (*args.allowed_host, socket.gethostname()))
    server = HttpServer(Guard(app, policy), limits, refusal=transport_refusal, answered=app.answered)
    try:
        await server.start(args.host, args.port)
    except OSError as exc:  # an unknown host name, a port in use, an address not ours
        log.error("cannot listen on %s port %d: %s", args.host, args.port, exc.strerror or exc)
        raise SystemExit(2)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():  # a second signal: the operator will not wait for the grace period
            log.warning("second signal: exiting now")
            os._exit(128 + signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    url = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{server.port}"
    log.info("listening on %s (loading the model)", url)
    if warning := exposure_warning(args.host, policy):
        log.warning(warning)

    runtime = Runtime(ServerMetrics(), warm_resume=not args.no_warm_resume, speculative=args.speculative)
    try:
        path = await asyncio.to_thread(fetch.resolve_model, args.model)
        started = time.perf_counter()
        await asyncio.to_thread(fetch.preload, path)
        engine = await runtime.load(str(path), args.draft_model, n_threads=args.threads, n_ctx=args.ctx,
                                    max_sessions=args.max_sessions, kv_budget_bytes=args.kv_budget,
                                    prefix_cache_bytes=args.prefix_cache_size, kv_type_k=kv_types(args)[0],
                                    kv_type_v=kv_types(args)[1])
        if engine.info.vocab_only:
            raise fetch.ModelError(f"{path} holds only a vocabulary (no weights): it can be tokenized "
                                    "(`python -m llmd tokenize --model FILE TEXT`), not served")
        load_seconds = time.perf_counter() - started
        runtime.metrics.model_load.set(load_seconds)
        runtime.metrics.kv_bytes_per_token.set(engine.info.kv_bytes_per_token, type_k=engine.info.kv_type_k,
                                               type_v=engine.info.kv_type_v)
    except (fetch.ModelError, EngineError) as exc:
        log.error("cannot load the model: %s", exc)
        await server.close()
        await runtime.close()
        raise SystemExit(2)
    info = engine.info
    for warning in info.warnings:
        log.warning("%s", warning)
    try:  # the vocab is asked which template strings are control tokens: engine calls
        template = await runtime.call(templates.load_template, info.chat_template, args.chat_template, engine)
    except templates.ChatTemplateError as exc:
        if args.chat_template:
            log.error("%s", exc)
            await server.close()
            await runtime.close()
            raise SystemExit(2)
        log.warning("%s; /v1/chat/completions is disabled", exc)
        template = templates.Unavailable(str(exc))
    if isinstance(template, templates.JinjaTemplate) and (missing := template.template.unsupported()):
        log.warning("the chat template uses %s, which llmd's template interpreter does not support; "
                    "conversations that reach it are refused", ", ".join(missing))
    model_id = _model_id(str(path)) if args.model else fetch.DEFAULT_ID
    store = await open_session_store(args, engine, str(path)) if args.session_dir else None
    table = SessionTable(engine, runtime.call, capacity=runtime.capacity, eviction=args.session_eviction,
                         scratch_reuse=args.scratch_reuse, store=store, save_delay=args.session_save_delay,
                         draft_engine=runtime.draft_engine)
    await table.start()
    app.api = Api(engine, runtime, table, template,
                  Options([model_id, *args.model_alias], args.scratch_reuse, max_queue=args.max_queue,
                          max_tokens_limit=args.max_tokens_limit, log_prompts=args.log_prompts,
                          prefix_cache=args.prefix_cache, draft_max=args.draft_max,
                          speculative=args.speculative, draft_model=_model_id(args.draft_model)))
    log.info("model %s loaded in %.1fs: ctx %d, %d session slots (%.0f MB KV each), %d threads, %s kernels",
             model_id, load_seconds, info.n_ctx, runtime.capacity, info.bytes_per_session / 1e6, info.n_threads,
             info.kernels,
             extra={"fields": {"event": "ready", "url": url, "model": model_id, "path": str(path),
                               "load_seconds": round(load_seconds, 3), "n_ctx": info.n_ctx,
                               "session_slots": runtime.capacity, "threads": info.n_threads,
                               "kernels": info.kernels}})
    draft_bytes = runtime.draft_engine.info.bytes_per_session if runtime.draft_engine is not None else 0
    print(banner(url, model_id, str(path), info, load_seconds, args.speculative, args.draft_model,
                 slots=runtime.capacity, draft_bytes=draft_bytes), flush=True)
    notify_systemd("READY=1")
    await stop.wait()
    # /health answers 503 from now on, so balancers send new work elsewhere; what is
    # in flight or queued gets the grace period to finish.
    app.draining = True
    log.info("draining: %d generations in flight and %d queued get up to %gs to finish", runtime.active,
             app.api.waiting, args.shutdown_grace)
    notify_systemd("STOPPING=1")
    deadline = loop.time() + args.shutdown_grace
    await server.drain(args.shutdown_grace)
    await server.close(grace=max(deadline - loop.time(), 0.0),
                       cut=lambda: runtime.end_all(errors.unavailable("the server is shutting down")))
    await table.close()
    await runtime.close()


async def open_session_store(args, engine, model_path: str):
    """The --session-dir store, its files listed; None (in-memory sessions, with a
    warning) if the directory cannot be created or listed."""
    from llmd import _native
    from llmd.serving.session_store import SessionStore, kv_type_name, model_fingerprint
    header_bytes, file_bytes = engine.file_layout()
    try:
        fingerprint = await asyncio.to_thread(model_fingerprint, model_path, header_bytes, file_bytes,
                                              _native.__file__, engine.info.kernels)
        # A session's file holds its state (at most its KV memory and recurrent state) and a
        # little metadata: twice that bounds what a load reads.
        store = SessionStore(args.session_dir, args.session_dir_max, fingerprint, engine.info.n_ctx,
                             kv_type_name(engine.info.kv_type_k, engine.info.kv_type_v),
                             max_file=2 * engine.info.bytes_per_session + (1 << 20))
        await asyncio.to_thread(store.scan)
    except OSError as exc:
        log.warning("cannot use --session-dir %s: %s; sessions are kept in memory only", args.session_dir, exc)
        return None
    log.info("session dir %s: %d saved sessions (%.1f MB of at most %s)", args.session_dir, store.count,
             store.bytes_used / 1e6, f"{args.session_dir_max / 1e6:.0f} MB" if args.session_dir_max else "no limit")
    return store


def _model_id(path: str | None) -> str | None:
    """The id a model file is served as: its name without the extension."""
    return os.path.splitext(os.path.basename(path))[0] if path else None


def banner(url: str, model_id: str, path: str, info, load_seconds: float, speculative: str = "ngram",
           draft_path: str | None = None, slots: int | None = None, draft_bytes: int = 0) -> str:
    """What an operator needs once llmd is up; its first line is what scripts wait for.
    slots: the session table's capacity (default the engine's max_sessions); draft_bytes:
    the KV memory of each slot's draft session, with a draft model."""
    drafter = {"off": "off", "ngram": "prompt lookup (ngram)",
               "draft": f"draft model {_model_id(draft_path)}  ({draft_path})",
               "mtp": "the model's multi-token-prediction block (mtp)"}[speculative]
    named = (slots or info.max_sessions) - 1
    capacity = (f"{named} named sessions + 1 for anonymous requests" if named else
                "1 session (anonymous requests only; raise --kv-budget or --max-sessions for named ones)")
    body = json.dumps({"model": model_id, "messages": [{"role": "user", "content": "Hello!"}]})
    return "\n".join([
        f"llmd ready on {url}",
        f"  model     {model_id}  ({path}, loaded in {load_seconds:.1f}s)",
        f"  context   {info.n_ctx} tokens per session",
        f"  capacity  {capacity}, {info.bytes_per_session / 1e6:.0f} MB of KV cache each "
        f"({info.kv_type_k} keys, {info.kv_type_v} values)"
        + (f" + {draft_bytes / 1e6:.0f} MB for its draft session" if draft_bytes else ""),
        f"  threads   {info.n_threads}, {info.kernels} kernels",
        f"  speculate {drafter}",
        f"  page      {url}/        metrics  {url}/metrics",
        f"  try       curl {url}/v1/chat/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}",
    ])


def notify_systemd(state: str) -> None:
    """Tell systemd how start-up goes (a `Type=notify` unit); does nothing elsewhere."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("could not notify systemd at %s: %s", os.environ["NOTIFY_SOCKET"], exc)
