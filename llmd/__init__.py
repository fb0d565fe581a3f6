"""llmd: a small, fast, OpenAI-compatible LLM server for one machine.

Each folder is a layer and says in its `__init__.py` which other parts of llmd its
modules may import (the line "May import:"); tests/test_layers.py holds every import
to those lines and refuses import cycles. From the top down:

    cli, __main__   the command line: parses flags and wires the layers together
    commands/       CLI verbs other than serving: bench, quantize, perplexity, tokenize
    api/            routes, access control, the reply core, one module per API surface
    structured/     JSON Schema -> grammar, constrained decoding
    prompt/         chat templates (Jinja), Harmony, reasoning, tool calls, stops, text
    serving/        the executor thread, sessions, session files, prefill plans, metrics
    engine/         the cffi wrapper over native/, the default model's fetch
    http/           HTTP/1.1 parser, asyncio server, SSE: knows nothing of LLMs
    errors          ApiError, the one refusal every layer may raise

The modules at this root other than `errors` (cli, logs, __main__) are the entry
layer and may import anything; `errors` imports nothing of llmd.
"""
