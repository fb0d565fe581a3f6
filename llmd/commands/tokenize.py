"""`python -m llmd tokenize TEXT`: the token ids of TEXT as JSON."""
from __future__ import annotations

import json

from llmd.commands.model import open_engine


def run(model: str | None, n_threads: int, n_ctx: int, text: str, special: bool) -> int:
    with open_engine(model, n_threads, n_ctx, generate=False) as engine:
        print(json.dumps(engine.tokenize(text, special=special)))
    return 0
