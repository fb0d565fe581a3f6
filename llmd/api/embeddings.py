"""The embeddings surface (`POST /v1/embeddings`): what each input is run as, and the
list object the pooled vectors become.

A model makes embeddings when its GGUF declares a pooling type (`<arch>.pooling_type`):
the engine runs each input from position 0 and pools the final-normed hidden states
(llmd_session_embed). Inputs are tokenized as the model file says, as llama.cpp does:
BOS first and EOS last where the file adds them (Qwen3-Embedding pools its last token,
the EOS), control-token text in user input staying text. Vectors are L2-normalised, as
OpenAI's are, so a dot product is their cosine similarity; `base64` packs the floats as
little-endian float32, as OpenAI's `encoding_format: base64` does.
"""
from __future__ import annotations

import base64
import math
import struct

def input_ids(ids: list[int], bos: int | None, eos: int | None) -> list[int]:
    """A tokenized text input as the model runs it: BOS and EOS added where given."""
    return ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])


def normalize(vector: list[float]) -> list[float]:
    """vector / its Euclidean norm (a zero vector stays zero)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0.0 else list(vector)


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """The `embedding` field: the floats, or their float32 bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def body(vectors: list[list[float]], encoding_format: str, model: str, prompt_tokens: int) -> dict:
    """The response object of normalised vectors, in input order."""
    return {"object": "list", "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": encode(v, encoding_format)}
                     for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
