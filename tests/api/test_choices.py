"""n > 1: the choices after the first run beside it on spare slots, where the prefix
cache hands them its prompt, and give what they give one after another; without room
(or without a prefix cache) they run after it on the reply's slot, as before."""
from __future__ import annotations

import asyncio
import json

import pytest

from llmd.serving.runtime import Runtime
from llmd.serving.sessions import SessionTable
from tests.conformance.client import Client
from tests.support.gguf_writer import build_tiny_qwen35

MESSAGES = [{"role": "user", "content": "Tell me a story about a cat."}]


def body(**params) -> dict:
    return {"model": "model", "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 5, **params}


async def post(client: Client, payload: dict) -> dict:
    resp = await asyncio.to_thread(client.post_json, "/chat/completions", payload)
    assert resp.status == 200, resp.body
    return resp.json()


async def settled(runtime: Runtime, table: SessionTable) -> None:
    """Nothing left in flight: no generation, no temporary slot, and engine sessions for
    the scratch slot and the named ones alone."""
    held = 1 + len(table.named)
    for _ in range(200):
        if not runtime._active and table.temporary == 0 and table.engine_sessions == held:
            break
        await asyncio.sleep(0.02)
    assert not runtime._active and table.temporary == 0 and table.engine_sessions == held
    assert table.engine.live_sessions() == held and all(s.users == 0 for s in table.named.values())


@pytest.mark.asyncio
@pytest.mark.parametrize("hybrid", [False, True], ids=["llama", "qwen35"])
async def test_choices_run_side_by_side_and_give_what_they_give_one_after_another(stack, tmp_path, hybrid):
    model = build_tiny_qwen35(n_ctx=512).write(tmp_path / "qwen35.gguf") if hybrid else None
    client, runtime, table = await stack(**({"model": model} if hybrid else {}))
    alone, _, _ = await stack(prefix_cache="off", **({"model": model} if hybrid else {}))  # one after another
    # A first choice that runs long: its end of generation banned.
    messages, ban = [{"role": "user", "content": "Tell me a story about a cat. " * 3}], \
        {str(i): -100 for i in table.engine.info.eog_ids}
    together = await post(client, body(n=3, messages=messages, max_tokens=96, logit_bias=ban))
    first, *forks = runtime.submitted
    assert len(forks) == 2 and all(g.slot is not first.slot and g.slot.temporary for g in forks)
    # The prompt from the first one's cache: all but the token left to prefill; with
    # recurrent layers, the blocks up to the state the first one's prefill kept (at
    # its last block boundary), the rest prefilled again.
    prompt = together["usage"]["prompt_tokens"]
    assert prompt > 64 and all(g.plan.keep == (64 if hybrid else prompt - 1) for g in forks)
    assert all(g.t_submit < first.t_end for g in forks)  # started while the first one decoded
    assert runtime.metrics.prefix_cache_hits.values[()] == 2
    after = await post(alone, body(n=3, messages=messages, max_tokens=96, logit_bias=ban))
    assert [c["message"]["content"] for c in together["choices"]] == \
        [c["message"]["content"] for c in after["choices"]]
    assert len({c["message"]["content"] for c in together["choices"]}) > 1
    assert together["usage"] == after["usage"]
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_without_room_the_choices_run_after_the_first_on_its_slot(stack):
    client, runtime, table = await stack(max_sessions=3)  # the scratch slot and two more
    await post(client, body(n=4))  # in the scratch slot: one fork; the last free slot is kept
    assert [g.fork for g in runtime.submitted] == [False, True, False, False]
    assert runtime.submitted[2].slot is runtime.submitted[3].slot is table.scratch
    runtime.submitted.clear()
    choices = (await post(client, body(n=3, session_id="s")))["choices"]  # the named session takes one
    assert [g.slot for g in runtime.submitted] == [table.named["s"]] * 3  # and leaves the last
    wide, wide_runtime, _ = await stack()
    assert [c["message"]["content"] for c in choices] == \
        [c["message"]["content"] for c in (await post(wide, body(n=3, session_id="s")))["choices"]]
    assert len({g.slot for g in wide_runtime.submitted}) == 3
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_a_stream_sends_each_choice_whole_in_order(stack):
    client, runtime, table = await stack()
    whole = await post(client, body(n=3))
    stream = await asyncio.to_thread(client.post_stream, "/chat/completions",
                                     body(n=3, stream=True, stream_options={"include_usage": True}))
    assert [g.fork for g in runtime.submitted[3:]] == [False, True, True]
    indexes = [c["choices"][0]["index"] for c in stream.chunks if c["choices"]]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1, 2}
    texts = ["".join(c["choices"][0]["delta"].get("content") or "" for c in stream.chunks
                     if c["choices"] and c["choices"][0]["index"] == i) for i in range(3)]
    assert texts == [c["message"]["content"] for c in whole["choices"]]
    assert stream.chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_a_client_that_leaves_ends_every_choice_and_frees_their_slots(stack):
    client, runtime, table = await stack()
    ban = {str(i): -100 for i in table.engine.info.eog_ids}
    payload = json.dumps(body(n=3, stream=True, max_tokens=300, logit_bias=ban)).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", int(client.base_url.split(":")[2].split("/")[0]))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    received = b""
    while received.count(b"data: ") < 3:  # inside the first choice, the others forked
        received += await reader.read(4096)
    for _ in range(200):
        if len(runtime.submitted) == 3:
            break
        await asyncio.sleep(0.01)
    assert len(runtime.submitted) == 3
    writer.transport.abort()
    await settled(runtime, table)
    assert all(g.finished and g.cancelled and g.generated < 300 for g in runtime.submitted)
    again = await post(client, body(n=3))  # the slots serve the next request
    assert len(again["choices"]) == 3
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_a_fork_cut_by_a_stop_string_ends_there_as_one_after_another_would(stack):
    # A fork runs on past its stop string before its cancel takes effect: what it made
    # after the stop is neither shown, nor counted, nor in its logprobs.
    client, runtime, table = await stack()
    alone, _, _ = await stack(prefix_cache="off")
    ban = {str(i): -100 for i in table.engine.info.eog_ids}
    plain = await post(client, body(n=3, max_tokens=24, logit_bias=ban, cache_salt="plain"))
    text = plain["choices"][2]["message"]["content"]
    at = next(i for i, c in enumerate(text) if i > 1 and c not in text[:i] and c != "\ufffd")
    stop = text[at]  # a character choice 2 first writes after a few others
    cut = body(n=3, max_tokens=24, logit_bias=ban, stop=[stop], logprobs=True, cache_salt="cut")
    together, after = await post(client, cut), await post(alone, cut)
    assert [g.fork for g in runtime.submitted[3:]] == [False, True, True]
    assert runtime.submitted[-1].generated > len(together["choices"][2]["logprobs"]["content"])  # it ran on
    assert together["choices"] == after["choices"] and together["usage"] == after["usage"]
    assert together["choices"][2]["finish_reason"] == "stop"
    assert together["choices"][2]["message"]["content"] == text[:at]
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_forks_are_not_queued_requests(stack):
    # --max-queue counts requests waiting to start: a fork belongs to one that has.
    client, runtime, table = await stack()
    await post(client, body(n=3))
    assert [g.fork for g in runtime.submitted] == [False, True, True]
    assert runtime.queue_lengths == [1, 0, 0]  # the first waits for its prefill; the forks count nowhere
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_a_turn_whose_last_choices_are_forks_is_saved_at_its_end(stack, tmp_path):
    # With the session saved after each turn (save delay 0), the reply waits for the
    # save; the session's slot must be free by then though its last choice was a fork.
    client, runtime, table = await stack(store=tmp_path / "sessions")
    await post(client, body(n=3, session_id="s"))
    assert len({g.slot for g in runtime.submitted}) == 3  # two forks
    assert table.store.version("s") == 1
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_when_a_spare_session_cannot_open_the_choices_run_after_the_first(stack, caplog):
    client, runtime, table = await stack()
    alone, _, _ = await stack(prefix_cache="off")

    async def failing():
        raise RuntimeError("no memory for another session")

    table.spare = failing
    choices = (await post(client, body(n=3)))["choices"]
    assert [g.fork for g in runtime.submitted] == [False, False, False] and "runs after the first" in caplog.text
    assert choices == (await post(alone, body(n=3)))["choices"]
    await settled(runtime, table)


@pytest.mark.asyncio
async def test_a_fork_that_cannot_be_submitted_gives_its_slot_back(stack):
    client, runtime, table = await stack()
    alone, _, _ = await stack(prefix_cache="off")
    recording = runtime.submit

    def failing(g):
        if g.fork:
            raise RuntimeError("no room in the scheduler")
        recording(g)

    runtime.submit = failing
    choices = (await post(client, body(n=3)))["choices"]  # the others run after the first
    assert choices == (await post(alone, body(n=3)))["choices"]
    await settled(runtime, table)  # no temporary slot left held
