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
from dataclasses import dataclass

from llmd.api.validation import (check_keys, int_field, INT32_MAX, is_int, parse_common, parse_json_object,
                                 parse_prompt_one, required_field, value_text, str_field)
from llmd.errors import invalid_request, invalid_type

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


# --- the request ------------------------------------------------------------

@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    inputs: list[str | list[int]]      # one entry per embedding asked for
    encoding_format: str               # "float" | "base64"
    dimensions: int | None = None      # None: the model's own size


MAX_EMBEDDING_INPUTS = 2048  # inputs in one request, as OpenAI allows


def parse_embeddings_request(body: bytes) -> EmbeddingsRequest:
    """Validate a /v1/embeddings body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"model", "input", "encoding_format", "dimensions", "user"}), {})
    model, _ = parse_common(obj)
    v = required_field(obj, "input", "input")
    if isinstance(v, str) or (isinstance(v, list) and v and all(is_int(x) for x in v)):
        inputs = [parse_prompt_one(v, "input")]
    elif isinstance(v, list) and v:
        if len(v) > MAX_EMBEDDING_INPUTS:
            raise invalid_request(f"Invalid value for 'input': at most {MAX_EMBEDDING_INPUTS} inputs are "
                                  f"allowed in one request, not {len(v)}.", "input")
        inputs = [parse_prompt_one(x, f"input[{i}]") for i, x in enumerate(v)]
    else:
        raise invalid_type("input", "a string, an array of strings or an array of token ids", v)
    fmt = obj.get("encoding_format")
    if fmt is not None and str_field(fmt, "encoding_format") not in ("float", "base64"):
        raise invalid_request(f"Invalid value for 'encoding_format': {value_text(fmt)}; expected 'float' or "
                              "'base64'.", "encoding_format")
    dimensions = obj.get("dimensions")
    if dimensions is not None:
        int_field(dimensions, "dimensions", 1, INT32_MAX)
    return EmbeddingsRequest(model, inputs, fmt or "float", dimensions)
