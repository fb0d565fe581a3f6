"""Reranking (`POST /v1/rerank`, `/rerank`): how relevant each of some documents is to
a query, as a reranker model judges it.

A reranker is a model whose GGUF declares rank pooling (`<arch>.pooling_type` 4) and
holds a classifier head (Qwen3-Reranker: the output head's "yes" and "no" rows). Each
document runs as the file's rerank prompt (`tokenizer.chat_template.rerank`) with the
query and the document in it, and its score is the head's first output after the last
token (llmd_session_embed), as llama.cpp's server scores it: Qwen3-Reranker's
probability of "yes". Control-token text in the query or a document stays text. The
documents after the first resume from the prompt's start the engine still holds.

The request and the answer are Jina's and Cohere's, as llama.cpp serves them: `query`,
`documents` (strings, or objects with a `text`), `top_n`, `return_documents`, and
`results` best first. With `texts` in place of `documents` they are Hugging Face TEI's:
a bare list of `{index, score}` (`return_text` adds each text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from llmd.api.validation import (INT32_MAX, bool_field, check_keys, int_field, parse_json_object, required_field,
                                 str_field)
from llmd.errors import invalid_request, invalid_type, unsupported_parameter

MAX_DOCUMENTS = 2048  # documents in one request, as many as /v1/embeddings takes inputs

_PLACES = re.compile(r"\{(query|document)\}")


@dataclass(frozen=True)
class RerankRequest:
    model: str | None
    query: str
    documents: list[str]
    top_n: int                # results answered, best first (at most the documents)
    with_text: bool           # each result carries its document's text
    tei: bool                 # Hugging Face TEI's shape: `texts` in, a bare list out


def parse_rerank_request(body: bytes) -> RerankRequest:
    """Validate a rerank body; raise ApiError (400) naming the bad param."""
    obj = parse_json_object(body)
    check_keys(obj, frozenset({"model", "query", "documents", "texts", "top_n", "return_documents", "return_text",
                               "raw_scores", "truncate", "user"}), {})
    model = obj.get("model")
    if model is not None:
        str_field(model, "model")
    if obj.get("user") is not None:
        str_field(obj["user"], "user")
    query = str_field(required_field(obj, "query", "query"), "query")
    tei = obj.get("texts") is not None
    if tei and obj.get("documents") is not None:
        raise invalid_request("Give the documents as 'documents' (Jina's and Cohere's API) or as 'texts' "
                              "(Hugging Face TEI's), not both.", "texts")
    param = "texts" if tei else "documents"
    items = required_field(obj, param, param)
    if not isinstance(items, list):
        raise invalid_type(param, "an array of strings", items)
    if not 1 <= len(items) <= MAX_DOCUMENTS:
        raise invalid_request(f"Invalid value for '{param}': between 1 and {MAX_DOCUMENTS} documents are needed, "
                              f"not {len(items)}.", param)
    documents = [_document(item, f"{param}[{i}]", tei) for i, item in enumerate(items)]
    want, other = ("return_text", "return_documents") if tei else ("return_documents", "return_text")
    if obj.get(other) is not None:
        raise invalid_request(f"'{other}' is not part of this request's shape: with '{param}', the texts come "
                              f"back with '{want}'.", other)
    with_text = obj.get(want) is not None and bool_field(obj[want], want)
    for key, why in (("raw_scores", "this server answers the reranker's scores as it makes them (Qwen3-Reranker's: "
                                    "probabilities), never the logits before them"),
                     ("truncate", "a document that does not fit the context is refused, never cut")):
        if obj.get(key) is not None and bool_field(obj[key], key):
            raise unsupported_parameter(key, f"'{key}': true is not supported: {why}.")
    top_n = len(documents) if obj.get("top_n") is None else int_field(obj["top_n"], "top_n", 1, INT32_MAX)
    return RerankRequest(model, query, documents, min(top_n, len(documents)), with_text, tei)


def _document(item: object, param: str, tei: bool) -> str:
    """A document's text: a string, or (Jina's, Cohere's first API) an object with a `text`."""
    if isinstance(item, str):
        return item
    if not tei and isinstance(item, dict):
        check_keys(item, frozenset({"text"}), {})
        return str_field(required_field(item, "text", f"{param}.text"), f"{param}.text")
    raise invalid_type(param, "a string" if tei else "a string or an object with a 'text'", item)


def prompt(template: str, query: str, document: str) -> tuple[bytes, list[tuple[int, int]]]:
    """The rerank prompt of one document: the template with `{query}` and `{document}`
    replaced, as bytes, and the byte ranges of the template's own text (where its
    control tokens are read as such; Engine.tokenize_marked)."""
    parts: list[bytes] = []
    markers: list[tuple[int, int]] = []
    at = 0
    for place in [*_PLACES.finditer(template), None]:
        end = place.start() if place else len(template)
        own = template[at:end].encode("utf-8")
        size = sum(map(len, parts))
        markers.append((size, size + len(own)))
        parts.append(own)
        if place:
            parts.append((query if place.group(1) == "query" else document).encode("utf-8", "surrogatepass"))
            at = place.end()
    return b"".join(parts), markers


def body(scores: list[float], req: RerankRequest, model: str, prompt_tokens: int) -> dict | list:
    """The answer: the top_n documents by score (ties in input order), in the request's shape."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
    if req.tei:
        return [{"index": i, "score": scores[i], **({"text": req.documents[i]} if req.with_text else {})}
                for i in order]
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": req.documents[i]}} if req.with_text else {})} for i in order]
    return {"object": "list", "model": model, "results": results,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
