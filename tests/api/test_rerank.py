"""Reranking: the engine's rank pooling (a classifier head over the last token's state)
against llama.cpp's `llama-server --reranking` on a tiny random-weight qwen3 reranker,
llmd/api/rerank.py's pure parts, and POST /v1/rerank on a server running that model."""
from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time
import urllib.parse
from pathlib import Path

import pytest

from llmd.api import rerank
from llmd.engine.native import Engine, EngineError, Session
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import QWEN3_RERANK_TEMPLATE, build_tiny_llama, make_reranker
from tests.support.stack import start_stack

N_CTX = 1024
TEMPLATE = QWEN3_RERANK_TEMPLATE
QUERIES = ["What is the capital of France?", "hello"]
DOCUMENTS = ["Paris is the capital of France.", "The quick brown fox jumps over the lazy dog.", "a", "hello world"]
# llama.cpp and llmd agree to 4.5e-6 on these F32 weights (measured); both keep keys and
# values as f16, rounded from sums taken in different orders.
TOLERANCE = 1e-5


def build(path: Path, *, template: bool = True, head: bool = True, pooling: bool = True) -> Path:
    """The tiny qwen3 reranker (make_reranker): rank pooling unless not `pooling`, the
    classifier head with `head`, the rerank prompt with `template`."""
    w = build_tiny_llama(arch="qwen3", seed=21, n_ctx=N_CTX, name="tiny-qwen3-reranker")
    if pooling:
        make_reranker(w, 64, random.Random(22), head=head, template=template)
    return w.write(path)


def prompt_ids(engine: Engine, query: str, document: str) -> list[int]:
    return engine.tokenize_marked(*rerank.prompt(TEMPLATE, query, document))[0]


# ---- the engine against llama.cpp -------------------------------------------------------

def test_scores_match_llama_server_and_the_labels_are_a_softmax(tmp_path):
    with Engine(str(build(tmp_path / "m.gguf")), n_ctx=N_CTX, max_sessions=2) as engine:
        assert engine.info.n_labels == 2 and engine.info.rerank_template == TEMPLATE
        with engine.new_session() as session:
            for query, golden in zip(QUERIES, GOLDEN):
                for document, expected in zip(DOCUMENTS, golden):
                    yes, no = session.embed(prompt_ids(engine, query, document))
                    assert abs(yes - expected) <= TOLERANCE and abs(yes + no - 1.0) < 1e-6, (query, document)


def test_a_document_after_another_resumes_from_their_shared_start_with_the_same_numbers(tmp_path):
    with Engine(str(build(tmp_path / "m.gguf")), n_ctx=N_CTX, max_sessions=2) as engine:
        first, second = (prompt_ids(engine, QUERIES[0], d) for d in DOCUMENTS[:2])
        with engine.new_session() as fresh:
            alone = fresh.embed(second)
        with engine.new_session() as session:
            session.embed(first)
            assert session.embed(second) == alone and session.position == len(second)
            assert session.embed(second[:40]) == engine.new_session().embed(second[:40])  # a prefix of what it holds


def test_rank_pooling_without_a_classifier_head_is_refused(tmp_path):
    with Engine(str(build(tmp_path / "m.gguf", head=False)), n_ctx=N_CTX, max_sessions=2) as engine:
        assert engine.info.n_labels == 0
        with engine.new_session() as session, pytest.raises(EngineError, match="no classifier head"):
            session.embed([1, 2])


# ---- llmd/api/rerank.py -----------------------------------------------------------------------

def test_the_prompt_puts_query_and_document_in_and_marks_only_the_template():
    text, markers = rerank.prompt("<a>{query}|{document}</a>{query}", "Q<|im_end|>", "D")
    assert text == b"<a>Q<|im_end|>|D</a>Q<|im_end|>"
    assert [text[b:e] for b, e in markers] == [b"<a>", b"|", b"</a>", b""]


def test_control_token_text_in_a_document_stays_text(tmp_path):
    with Engine(str(build(tmp_path / "m.gguf")), n_ctx=N_CTX, max_sessions=1) as engine:
        im_end = engine.tokenize("<|im_end|>", special=True)
        assert len(im_end) == 1
        assert prompt_ids(engine, "q", "<|im_end|>").count(im_end[0]) == TEMPLATE.count("<|im_end|>")


def test_results_are_best_first_ties_in_input_order_cut_to_top_n():
    req = rerank.parse_rerank_request(b'{"query": "q", "documents": ["a", {"text": "b"}, "c"], "top_n": 2, '
                                      b'"return_documents": true}')
    assert rerank.body([0.5, 0.9, 0.5], req, "m", 7) == {
        "object": "list", "model": "m", "usage": {"prompt_tokens": 7, "total_tokens": 7},
        "results": [{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
                    {"index": 0, "relevance_score": 0.5, "document": {"text": "a"}}]}
    tei = rerank.parse_rerank_request(b'{"query": "q", "texts": ["a", "b"], "return_text": true, "top_n": 9}')
    assert rerank.body([0.1, 0.2], tei, "m", 3) == [{"index": 1, "score": 0.2, "text": "b"},
                                                    {"index": 0, "score": 0.1, "text": "a"}]


@pytest.mark.parametrize("body, param", [
    (b'{"documents": ["a"]}', "query"),
    (b'{"query": 1, "documents": ["a"]}', "query"),
    (b'{"query": "q"}', "documents"),
    (b'{"query": "q", "documents": []}', "documents"),
    (b'{"query": "q", "documents": "a"}', "documents"),
    (b'{"query": "q", "documents": ["a", 2]}', "documents[1]"),
    (b'{"query": "q", "documents": [{"txt": "a"}]}', "txt"),
    (b'{"query": "q", "texts": [{"text": "a"}]}', "texts[0]"),
    (b'{"query": "q", "texts": ["a"], "documents": ["a"]}', "texts"),
    (b'{"query": "q", "texts": null, "documents": null}', "documents"),
    (b'{"query": "q", "texts": ["a"], "return_documents": true}', "return_documents"),
    (b'{"query": "q", "documents": ["a"], "return_text": true}', "return_text"),
    (b'{"query": "q", "documents": ["a"], "top_n": 0}', "top_n"),
    (b'{"query": "q", "documents": ["a"], "top_n": "1"}', "top_n"),
    (b'{"query": "q", "texts": ["a"], "truncate": true}', "truncate"),
    (b'{"query": "q", "texts": ["a"], "raw_scores": true}', "raw_scores"),
    (b'{"query": "q", "documents": ["a"], "model": 5}', "model"),
    (b'{"query": "q", "documents": ["a"], "rank_fields": ["x"]}', "rank_fields"),
])
def test_bad_requests_are_400_naming_the_field(body, param):
    with pytest.raises(Exception) as caught:
        rerank.parse_rerank_request(body)
    assert (caught.value.status, caught.value.param) == (400, param)


# ---- POST /v1/rerank --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = build(tmp_path_factory.mktemp("rerank") / "reranker.gguf")
    with running_llmd("--model", str(path), "--ctx", str(N_CTX), "--max-sessions", "2") as url:
        yield Client(url + "/v1", model="reranker")


def test_the_route_answers_jina_and_cohere_shaped_results_best_first(server):
    reply = server.post_json("/rerank", {"model": "reranker", "query": QUERIES[0], "documents": DOCUMENTS})
    assert reply.status == 200, reply.json()
    out = reply.json()
    assert out["object"] == "list" and out["model"] == "reranker"
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -GOLDEN[0][i])
    assert [r["index"] for r in out["results"]] == order
    for r in out["results"]:
        assert abs(r["relevance_score"] - GOLDEN[0][r["index"]]) <= TOLERANCE and set(r) == {"index", "relevance_score"}
    assert out["usage"]["prompt_tokens"] > len(DOCUMENTS) * TEMPLATE.count(" ")


def test_top_n_return_documents_and_the_tei_shape_at_every_path(server):
    jina = server.post_json(server.origin + "/rerank", {"query": QUERIES[1], "documents": DOCUMENTS, "top_n": 2,
                                                        "return_documents": True}).json()
    best = max(range(len(DOCUMENTS)), key=lambda i: GOLDEN[1][i])
    assert len(jina["results"]) == 2 and jina["results"][0]["document"] == {"text": DOCUMENTS[best]}
    tei = server.post_json(server.origin + "/reranking", {"query": QUERIES[1], "texts": DOCUMENTS,
                                                          "return_text": True, "truncate": False}).json()
    assert [(r["index"], r["text"]) for r in tei][0] == (best, DOCUMENTS[best])
    assert [r["score"] for r in tei] == [r["relevance_score"] for r in server.post_json(
        "/reranking", {"query": QUERIES[1], "documents": DOCUMENTS}).json()["results"]]


def test_a_refused_document_leaves_the_next_request_its_numbers(server):
    too_long = server.post_json("/rerank", {"query": "q", "documents": ["a", "word " * N_CTX]})
    error = too_long.json()["error"]
    assert too_long.status == 400 and (error["code"], error["param"]) == ("context_length_exceeded", "documents[1]")
    reply = server.post_json("/rerank", {"query": QUERIES[0], "documents": DOCUMENTS})
    assert {r["index"]: r["relevance_score"] for r in reply.json()["results"]} == pytest.approx(
        dict(enumerate(GOLDEN[0])), abs=TOLERANCE)
    assert server.post_json("/chat/completions", server.chat_body([{"role": "user", "content": "Hi"}],
                                                                  max_tokens=2)).status == 200


def test_a_client_that_goes_away_stops_its_documents_and_the_server_serves_on(server):
    documents = [f"passage {i}: " + "the river runs past the old mill " * 20 for i in range(rerank.MAX_DOCUMENTS)]
    body = json.dumps({"query": QUERIES[0], "documents": documents}).encode()
    url = urllib.parse.urlsplit(server.base_url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (url.netloc.encode(), len(body), body))
        time.sleep(0.5)  # scoring has begun: the documents take seconds
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not an end
    stopped = 'llmd_requests_total{route="/v1/rerank",status="499"}'
    for _ in range(300):
        if stopped in server.request("GET", server.origin + "/metrics").body.decode():
            break
        time.sleep(0.1)
    else:
        pytest.fail("the request was not stopped when its client went away")
    reply = server.post_json("/rerank", {"query": QUERIES[0], "documents": DOCUMENTS[:1]})
    assert abs(reply.json()["results"][0]["relevance_score"] - GOLDEN[0][0]) <= TOLERANCE


@pytest.mark.asyncio
async def test_a_request_resumes_from_its_own_documents_never_from_another_requests(tmp_path, monkeypatch):
    positions = []  # the session's position as each document starts
    embed = Session.embed

    def recording(session, ids):
        positions.append(session.position)
        return embed(session, ids)

    monkeypatch.setattr(Session, "embed", recording)
    stack = await start_stack(build(tmp_path / "m.gguf"), max_sessions=2)
    try:
        for _ in range(2):
            body = {"query": QUERIES[0], "documents": DOCUMENTS[:2]}
            assert (await asyncio.to_thread(stack.client.post_json, "/rerank", body)).status == 200
        first = len(prompt_ids(stack.engine, QUERIES[0], DOCUMENTS[0]))
    finally:
        await stack.stop()
    assert positions == [0, first, 0, first]


def test_embeddings_of_a_reranker_are_refused_pointing_at_rerank(server):
    reply = server.post_json("/embeddings", {"model": "reranker", "input": "Hi"})
    assert reply.status == 400 and reply.json()["error"]["code"] == "model_is_reranker"


@pytest.mark.parametrize("options, reason", [
    ({"pooling": False}, "declares no rank pooling"),
    ({"head": False}, "declares no rank pooling"),
    ({"template": False}, "no rerank prompt"),
])
def test_a_model_that_cannot_rerank_is_400_with_the_reason(tmp_path, options, reason):
    with running_llmd("--model", str(build(tmp_path / "m.gguf", **options)), "--ctx", str(N_CTX)) as url:
        reply = Client(url + "/v1").post_json("/rerank", {"query": "q", "documents": ["a"]})
    error = reply.json()["error"]
    assert reply.status == 400 and error["code"] == "model_not_reranker" and reason in error["message"]


GOLDEN = [  # python -m tests.support.make_rerank_golden LLAMA_DIR (llama.cpp 0c1e570)
    [0.2419131, 0.7608230, 0.6652326, 0.7330511],
    [0.7393818, 0.7233338, 0.3711271, 0.8521932],
]
