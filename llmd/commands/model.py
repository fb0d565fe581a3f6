"""Opening the model a command runs on."""
from __future__ import annotations

from llmd.engine import fetch
from llmd.engine.native import Engine, EngineError


def open_engine(model: str | None, n_threads: int, n_ctx: int, *, generate: bool,
                kv_types: tuple[str, str] = ("f16", "f16")) -> Engine:
    """The engine for a command, its KV cache storing keys and values as kv_types; a
    file it cannot open (or, when the command generates, one without weights) is a
    ModelError naming the problem."""
    path = fetch.resolve_model(model)
    try:
        engine = Engine(str(path), n_threads=n_threads, n_ctx=n_ctx, max_sessions=1, kv_type_k=kv_types[0],
                        kv_type_v=kv_types[1])
    except EngineError as exc:
        raise fetch.ModelError(f"{path}: {exc}") from exc
    if generate and engine.info.vocab_only:
        engine.close()
        raise fetch.ModelError(f"{path} holds only a vocabulary (no weights): it can be tokenized, not run")
    return engine
