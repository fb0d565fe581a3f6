"""Command line: `python -m llmd [serve]`, `pull`, `tokenize`, `perplexity`, `bench`.

Every flag can also be set through an environment variable LLMD_<FLAG> (dashes
as underscores, e.g. LLMD_PORT=9000); a flag on the command line wins.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import signal
import sys
import time

from llmd import models

log = logging.getLogger("llmd")

SUBCOMMANDS = ("serve", "pull", "tokenize", "perplexity", "bench")


def _env(name: str, default, kind=str):
    raw = os.environ.get("LLMD_" + name.upper().replace("-", "_"))
    if raw is None:
        return default
    if kind is bool:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind is list:
        return [v for v in raw.split(",") if v]
    return kind(raw)


def _size(text: str) -> int:
    """Bytes from '4G', '512M', '1000000'."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)
    value = float(text[:-1] if scale > 1 else text)
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"invalid size {text!r}")
    return int(value * scale)


def _api_key(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an API key cannot be empty")
    return text


def _model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=_env("model", None),
                   help="GGUF model file (default: SmolLM2-135M-Instruct Q4_1, fetched once)")
    p.add_argument("--threads", type=int, default=_env("threads", 0, int),
                   help="engine threads (default: 0 = one per core)")
    p.add_argument("--ctx", type=int, default=_env("ctx", 0, int),
                   help="context tokens per session (default: 0 = the model's, at most 8192)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llmd", description="A small, fast, OpenAI-compatible LLM server.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    fmt = argparse.ArgumentDefaultsHelpFormatter

    serve = sub.add_parser("serve", help="serve the model over HTTP (the default command)", formatter_class=fmt)
    _model_flags(serve)
    serve.add_argument("--host", default=_env("host", "127.0.0.1"), help="address to bind")
    serve.add_argument("--port", type=int, default=_env("port", 8000, int), help="port to bind")
    serve.add_argument("--model-alias", action="append", default=_env("model_alias", [], list),
                       help="extra model id accepted in requests (repeatable)")
    serve.add_argument("--chat-template", default=_env("chat_template", None),
                       help="chat template to use instead of the model's (chatml, llama3)")
    serve.add_argument("--max-sessions", type=int, default=_env("max_sessions", 0, int),
                       help="session slots including the scratch slot (default: 0 = from --kv-budget)")
    serve.add_argument("--kv-budget", type=_size, default=_env("kv_budget", 0, _size),
                       help="memory for KV caches, e.g. 4G (default: 0 = a quarter of RAM)")
    serve.add_argument("--session-eviction", choices=("lru", "none"), default=_env("session_eviction", "lru"),
                       help="when the table is full: evict the least recently used idle session, or refuse")
    serve.add_argument("--scratch-reuse", action="store_true", default=_env("scratch_reuse", False, bool),
                       help="let anonymous requests reuse the scratch session's cache")
    serve.add_argument("--no-warm-resume", action="store_true", default=_env("no_warm_resume", False, bool),
                       help="never reuse a session's KV cache (for A/B measurement)")
    serve.add_argument("--max-body-bytes", type=_size, default=_env("max_body_bytes", 16 << 20, _size),
                       help="largest request body")
    # Read from LLMD_API_KEY only when serving, so that --help never prints a key.
    serve.add_argument("--api-key", type=_api_key, action="append",
                       help="require this key (Authorization: Bearer KEY or X-Api-Key) on every route "
                            "but /health (repeatable; LLMD_API_KEY takes a comma-separated list)")
    serve.add_argument("--cors-origin", action="append", default=_env("cors_origin", [], list),
                       help="let pages from this origin call the API, e.g. https://app.example (repeatable; "
                            "* for any)")
    serve.add_argument("--log-prompts", action="store_true", default=_env("log_prompts", False, bool),
                       help="log prompt and completion text (never logged otherwise)")
    serve.add_argument("--max-connections", type=int, default=_env("max_connections", 256, int),
                       help="open connections; more are answered 503 and closed")
    serve.add_argument("--max-queue", type=int, default=_env("max_queue", 64, int),
                       help="generations waiting to start; more are answered 503 (0: no limit)")
    serve.add_argument("--max-tokens-limit", type=int, default=_env("max_tokens_limit", 0, int),
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
                       help="on SIGTERM/SIGINT, seconds in-flight requests get to finish")
    serve.add_argument("--log-level", default=_env("log_level", "info"),
                       choices=("debug", "info", "warning", "error"), help="log verbosity")

    pull = sub.add_parser("pull", help="fetch the default model into the cache", formatter_class=fmt)
    pull.add_argument("--quiet", action="store_true", help="no progress output")

    tok = sub.add_parser("tokenize", help="print the token ids of TEXT as JSON", formatter_class=fmt)
    _model_flags(tok)
    tok.add_argument("--special", action="store_true", help="recognise control tokens such as <|im_start|>")
    tok.add_argument("text")

    ppl = sub.add_parser("perplexity", help="perplexity of a text file", formatter_class=fmt)
    _model_flags(ppl)
    ppl.set_defaults(ctx=512)
    ppl.add_argument("--file", required=True, help="UTF-8 text file")

    bench = sub.add_parser("bench", help="engine and HTTP speed and memory figures", formatter_class=fmt)
    bench.add_argument("--model", default=_env("model", None), help="GGUF model file (default: the default model)")
    bench.add_argument("--threads", type=int, default=_env("threads", 0, int), help="engine threads (0 = one per core)")
    bench.add_argument("--runs", type=int, default=5, help="runs per figure (the median is reported)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--conversation", action="store_true",
                       help="instead: a 10-turn chat, first-token latency with and without warm resume")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "serve")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pull":
            print(models.default_model(progress=not args.quiet))
            return 0
        if args.command == "tokenize":
            return cmd_tokenize(args)
        if args.command == "perplexity":
            return cmd_perplexity(args)
        if args.command == "bench":
            from llmd import bench
            return bench.run(args.model, args.threads, args.runs, args.json, args.conversation)
        return cmd_serve(args)
    except models.ModelError as exc:
        print(f"llmd: {exc}", file=sys.stderr)
        return 2


def _open_engine(args):
    from llmd.engine import Engine
    return Engine(str(models.resolve_model(args.model)), n_threads=args.threads, n_ctx=args.ctx, max_sessions=1)


def cmd_tokenize(args) -> int:
    with _open_engine(args) as engine:
        print(json.dumps(engine.tokenize(args.text, special=args.special)))
    return 0


def cmd_perplexity(args) -> int:
    """llama.cpp's method: windows of ctx tokens, the second half of each scored given the first."""
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    with _open_engine(args) as engine:
        ids = engine.tokenize(text)
        ctx, first = args.ctx, args.ctx // 2
        if len(ids) < 2 * ctx:
            print(f"llmd: {args.file} has {len(ids)} tokens; perplexity needs at least {2 * ctx}", file=sys.stderr)
            return 2
        total, n = 0.0, 0
        start = time.perf_counter()
        with engine.new_session() as session:
            for w in range(len(ids) // ctx):
                window = ids[w * ctx:(w + 1) * ctx]
                if engine.info.add_bos:
                    window[0] = engine.info.bos_id
                session.reset()
                logprobs = session.score(window, first)
                total -= sum(logprobs)
                n += len(logprobs)
        elapsed = time.perf_counter() - start
    print(json.dumps({"ppl": round(math.exp(total / n), 4), "tokens_scored": n,
                      "tok_s": round((len(ids) // ctx) * ctx / elapsed, 1)}))
    return 0


def cmd_serve(args) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


async def serve(args) -> None:
    from llmd import chat
    from llmd.access import AccessPolicy, Guard, exposure_warning
    from llmd.api import Api, App, Options
    from llmd.engine import EngineError
    from llmd.http import Limits
    from llmd.runtime import Runtime
    from llmd.server import HttpServer
    from llmd.sessions import SessionTable

    app = App()
    limits = Limits(max_body_bytes=args.max_body_bytes, max_connections=args.max_connections,
                    header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                    keepalive_timeout=args.keepalive_timeout, write_timeout=args.write_timeout)
    policy = AccessPolicy(tuple(args.api_key or _env("api_key", [], list)), tuple(args.cors_origin))
    server = HttpServer(Guard(app, policy), limits)
    await server.start(args.host, args.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():  # a second signal: the operator will not wait for the grace period
            log.warning("second signal: exiting now")
            os._exit(128 + signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    url = f"http://{args.host}:{server.port}"
    log.info("listening on %s (loading the model)", url)
    if warning := exposure_warning(args.host, policy):
        log.warning(warning)

    runtime = Runtime(warm_resume=not args.no_warm_resume)
    try:
        path = await asyncio.to_thread(models.resolve_model, args.model)
        started = time.perf_counter()
        engine = await runtime.load(str(path), n_threads=args.threads, n_ctx=args.ctx,
                                    max_sessions=args.max_sessions, kv_budget_bytes=args.kv_budget)
    except (models.ModelError, EngineError) as exc:
        log.error("cannot load the model: %s", exc)
        await server.close()
        await runtime.close()
        raise SystemExit(2)
    info = engine.info
    if args.chat_template:
        if args.chat_template not in chat.TEMPLATE_NAMES:
            log.error("unknown --chat-template %r; choose one of %s", args.chat_template, ", ".join(chat.TEMPLATE_NAMES))
            raise SystemExit(2)
        template = chat.ChatTemplate(args.chat_template)
    else:
        template = chat.detect_template(info.chat_template)
        if template is None:
            log.warning("the model's chat template is not recognised; /v1/chat/completions is disabled. "
                        "Pass --chat-template with one of: %s", ", ".join(chat.TEMPLATE_NAMES))
    model_id = models.DEFAULT_ID if not args.model else os.path.splitext(os.path.basename(str(path)))[0]
    table = SessionTable(engine, runtime.call, capacity=info.max_sessions, eviction=args.session_eviction,
                         scratch_reuse=args.scratch_reuse)
    await table.start()
    app.api = Api(engine, runtime, table, template,
                  Options([model_id, *args.model_alias], args.scratch_reuse, max_queue=args.max_queue,
                          max_tokens_limit=args.max_tokens_limit, log_prompts=args.log_prompts))
    log.info("model %s loaded in %.1fs: ctx %d, %d session slots (%.0f MB KV each), %d threads",
             model_id, time.perf_counter() - started, info.n_ctx, info.max_sessions,
             info.bytes_per_session / 1e6, info.n_threads)
    print(f"llmd ready on {url}\n  curl {url}/v1/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'",
          flush=True)
    await stop.wait()
    log.info("shutting down: %d generations in flight get up to %gs to finish", runtime.active,
             args.shutdown_grace)
    await server.close(grace=args.shutdown_grace)
    await table.close()
    await runtime.close()
