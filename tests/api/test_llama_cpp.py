"""llama.cpp's own completion surface, and fill in the middle: the engine finds a
model's FIM markers, /v1/completions' `suffix` and llama.cpp's /infill lay out the
prompt around them (llmd.prompt.infill), and /completion and /infill answer in
llama.cpp's shape with its limits on lines."""
from __future__ import annotations

import asyncio
import json

import pytest

from llmd.engine.native import Engine, FimTokens
from llmd.prompt import infill
from llmd.prompt.infill import ExtraFile, LineLimits
from tests.conformance.client import Client
from tests.support.gguf_writer import FIM_MARKERS, U32, build_tiny_llama, name_last_tokens


def fim_model(path, markers=FIM_MARKERS, keys=(), n_ctx=512):
    """A tiny llama whose last reserved control tokens are `markers` (Qwen2.5-Coder's);
    `keys` are (metadata key, index into markers) pairs stating ids."""
    w = build_tiny_llama(n_vocab=320, n_ctx=n_ctx, reserved=len(markers))
    first = name_last_tokens(w, markers)
    for key, index in keys:
        w.set(key, U32, first + index)
    return w.write(path), first


@pytest.fixture(scope="module")
def qwen_like(tmp_path_factory):
    return fim_model(tmp_path_factory.mktemp("fim") / "qwen.gguf")


# ---- the engine finds the markers ---------------------------------------------------

def test_markers_found_by_their_text(qwen_like):
    path, first = qwen_like
    with Engine(str(path), n_ctx=64, max_sessions=1) as e:
        assert e.info.fim == FimTokens(first, first + 2, first + 1, first + 4, first + 5)
        # the padding, repository and file separator end a generation, as in llama.cpp
        assert {first + 3, first + 4, first + 5} <= set(e.info.eog_ids)


def test_markers_stated_by_the_file_win(tmp_path):
    markers = ["<A>", "<B>", "<C>", "<|fim_prefix|>"]
    keys = [("tokenizer.ggml.fim_suf_token_id", 1), ("tokenizer.ggml.fim_mid_token_id", 2),
            ("tokenizer.ggml.prefix_token_id", 0)]  # CodeLlama's key for the prefix, over its text
    path, first = fim_model(tmp_path / "keys.gguf", markers, keys)
    with Engine(str(path), n_ctx=64, max_sessions=1) as e:
        assert e.info.fim == FimTokens(first, first + 1, first + 2, None, None)


def test_a_model_without_markers_has_none(tiny_model):
    with Engine(str(tiny_model.path), n_ctx=64, max_sessions=1) as e:
        assert e.info.fim is None


# ---- the layout ---------------------------------------------------------------------

FIM = FimTokens(pre=-1, suf=-2, mid=-3, rep=-4, sep=-5)


def chars(text: str) -> list[int]:
    """A tokenizer of one id per character, to read layouts by."""
    return [ord(c) for c in text]


def test_layout_with_repository_and_files():
    built = infill.build(FIM, chars, "ab", "cd", "x", [ExtraFile("t1", "f.py"), ExtraFile("t2")])
    assert built.ids == ([-4] + chars("myproject\n") + [-5] + chars("f.py\n") + chars("t1") + [-5] +
                         chars("tmp\n") + chars("t2") + [-5] + chars("filename\n") +
                         [-1] + chars("abx") + [-2] + chars("cd") + [-3])
    assert not built.truncated


def test_layout_without_repository_or_file_markers():
    fim = FimTokens(pre=-1, suf=-2, mid=-3, rep=None, sep=None)
    assert infill.build(fim, chars, "ab", "", "", [ExtraFile("t")]).ids == \
        chars("\n\n--- snippet ---\n\n") + chars("t") + [-1] + chars("ab") + [-2, -3]
    assert infill.build(fim, chars, [7, 8], "c").ids == [-1, 7, 8, -2] + chars("c") + [-3]


def test_fitting_keeps_the_prefix_end_the_suffix_start_and_the_newest_files():
    prefix, suffix = "p" * 2000 + "END", "START" + "s" * 2000
    files = [ExtraFile("old" * 500), ExtraFile("new" * 500)]
    built = infill.build(FIM, chars, prefix, suffix, "m", files, room=2 * 2048 + 300)
    pre = built.ids.index(-1)
    assert built.truncated
    assert built.ids[pre + 1:built.ids.index(-2)] == chars(prefix[-1536:] + "m")  # 3/4 of the window
    assert built.ids[built.ids.index(-2) + 1:-1] == chars(suffix[:512 - 2 - 1])
    head = ([-4] + chars("myproject\n") + [-5] + chars("tmp\n") + chars("old" * 500) + [-5] + chars("tmp\n") +
            chars("new" * 500) + [-5] + chars("filename\n"))
    assert built.ids[:pre] == head[-(2048 + 300 - 3):]  # the room beyond the window, less the 3 markers
    # whole when they fit; a small room gives the window half of it
    assert not infill.build(FIM, chars, "ab", "cd", "x", files, room=2 * 3100).truncated
    small = infill.build(FIM, chars, prefix, suffix, "", files, room=400)
    assert small.ids.index(-2) - small.ids.index(-1) - 1 == 3 * (200 // 4)


def test_line_limits_end_text_as_llama_cpp_does():
    lim = LineLimits(indent=4)
    assert lim.feed("x = 1\n    y") == ("x = 1\n    y", False)
    assert lim.feed("\n  z = 2") == ("\n  ", True)  # cut before the line's first character
    assert lim.feed("more") == ("", True)
    assert LineLimits(indent=2).feed("a\n  b\n\nc") == ("a\n  b\n", True)  # an empty line too
    assert LineLimits(indent=2).feed("first line is never cut") == ("first line is never cut", False)
    now = [0.0]
    lim = LineLimits(max_ms=100, clock=lambda: now[0])
    assert lim.feed("a\n") == ("a\n", False)
    now[0] = 0.2
    assert lim.feed("b") == ("b", False)  # only a newline ends it
    assert lim.feed("c\nd") == ("c\nd", True)
    assert lim.feed("e") == ("", True)


# ---- the routes ---------------------------------------------------------------------

async def server(stack, model):
    """A server over `model`, and its engine and runtime."""
    client, runtime, table = await stack(model=model, max_sessions=4)
    return client, runtime.engine, runtime, table


async def post(client: Client, path: str, payload: dict, status: int = 200):
    """POST to a route under /v1 ("/completions") or at the root ("/infill", "/completion")."""
    url = client.origin + path if path in ("/infill", "/completion") else path
    resp = await asyncio.to_thread(client.post_json, url, payload)
    assert resp.status == status, resp.body
    return resp.json()


async def expected_ids(runtime, engine, prefix, suffix, middle="", extra=(), room=None) -> list[int]:
    return (await runtime.call(infill.build, engine.info.fim, engine.tokenize, prefix, suffix, middle,
                               list(extra), room)).ids


@pytest.mark.asyncio
async def test_suffix_completes_the_middle_of_the_fim_prompt(stack, qwen_like):
    client, engine, runtime, _ = await server(stack, qwen_like[0])
    greedy = {"model": "model", "max_tokens": 8, "temperature": 0}
    got = await post(client, "/completions", {**greedy, "prompt": "def add(a, b):\n", "suffix": "\n\nprint(1)"})
    ids = await expected_ids(runtime, engine, "def add(a, b):\n", "\n\nprint(1)")
    same = await post(client, "/completions", {**greedy, "prompt": ids})
    assert got["usage"]["prompt_tokens"] == len(ids)
    assert got["choices"][0]["text"] == same["choices"][0]["text"]
    assert got["choices"][0]["finish_reason"] == same["choices"][0]["finish_reason"]
    err = await post(client, "/completions", {**greedy, "prompt": "a", "suffix": "b", "echo": True}, 400)
    assert err["error"]["param"] == "suffix"


@pytest.mark.asyncio
async def test_a_model_without_markers_refuses_fill_in_the_middle(stack, tiny_llama_factory):
    client, *_ = await server(stack, tiny_llama_factory(n_ctx=256).path)
    err = await post(client, "/completions", {"model": "model", "prompt": "a", "suffix": "b"}, 400)
    assert (err["error"]["code"], err["error"]["param"]) == ("model_has_no_fim", "suffix")
    err = await post(client, "/infill", {"input_prefix": "a", "input_suffix": "b"}, 400)
    assert err["error"]["code"] == "model_has_no_fim"
    # an empty suffix is no insertion: a plain completion
    await post(client, "/completions", {"model": "model", "prompt": "a", "suffix": "", "max_tokens": 2})


LLAMA_VSCODE = {"id_slot": 0, "input_prefix": "import os\n\ndef main():\n", "input_suffix": "\n\nmain()\n",
                "input_extra": [{"text": "def helper():\n    pass\n", "time": 1733.5, "filename": "util.py"}],
                "prompt": "    ", "n_predict": 10, "n_cmpl": 1, "top_k": 40, "top_p": 0.99, "stream": False,
                "samplers": ["top_k", "top_p"], "cache_prompt": True, "t_max_prompt_ms": 500,
                "t_max_predict_ms": 5000}


LLAMA_CPP_PROMPT = ("<|repo_name|>myproject\n<|file_sep|>util.py\ndef helper():\n    pass\n<|file_sep|>filename\n"
                    "<|fim_prefix|>import os\n\ndef main():\n    <|fim_suffix|>\n\nmain()\n<|fim_middle|>")


@pytest.mark.asyncio
async def test_infill_answers_as_llama_cpp_does(stack, qwen_like):
    client, engine, runtime, table = await server(stack, qwen_like[0])
    got = await post(client, "/infill", {**LLAMA_VSCODE, "seed": 3})
    ids = await expected_ids(runtime, engine, LLAMA_VSCODE["input_prefix"], LLAMA_VSCODE["input_suffix"], "    ",
                             [ExtraFile("def helper():\n    pass\n", "util.py")])
    assert got["tokens_evaluated"] == len(ids) == 82  # llama.cpp's server (0c1e570), on this model
    assert got["prompt"] == LLAMA_CPP_PROMPT
    assert got["stop"] is True and got["id_slot"] == 0 and got["truncated"] is False
    assert got["stop_type"] in ("eos", "limit") and got["stopping_word"] == ""
    assert got["tokens_predicted"] == got["timings"]["predicted_n"] <= 10
    assert got["stop_type"] == ("limit" if got["tokens_predicted"] == 10 else "eos")
    assert got["generation_settings"]["n_ctx"] == engine.info.n_ctx
    assert {"prompt_per_token_ms", "predicted_per_token_ms"} <= set(got["timings"])
    # id_slot 0 is the session "slot-0": the same request again resumes it warm
    assert "slot-0" in table.named
    again = await post(client, "/infill", {**LLAMA_VSCODE, "seed": 3})
    assert again["content"] == got["content"]
    assert again["timings"]["cache_n"] >= len(ids) - 1
    # the same prompt through /v1/completions as ids, same seed and sampling, gives the same text
    same = await post(client, "/completions", {"model": "model", "prompt": ids, "max_tokens": 10, "seed": 3,
                                                 "top_k": 40, "top_p": 0.99, "temperature": 1.0})
    assert same["choices"][0]["text"] == got["content"]


@pytest.mark.asyncio
async def test_infill_fields_choices_and_stream(stack, qwen_like):
    client, *_ = await server(stack, qwen_like[0])
    base = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 6, "seed": 1}
    # llama.vim's warm-up: prompt only, nothing back
    assert await post(client, "/infill", {**base, "n_predict": 0, "response_fields": [""]}) == {}
    picked = await post(client, "/infill", {**base, "response_fields": ["content", "timings/prompt_n", "nope/x"]})
    assert set(picked) == {"content", "timings/prompt_n"}
    many = await post(client, "/infill", {**base, "n_cmpl": 3})
    assert [c["index"] for c in many] == [0, 1, 2]
    one = await post(client, "/infill", base)
    assert many[0]["content"] == one["content"]
    resp = await asyncio.to_thread(client.post_json, client.origin + "/infill", {**base, "stream": True})
    assert resp.status == 200 and b"[DONE]" not in resp.body  # llama.cpp's stream has none
    events = [json.loads(line[6:]) for line in resp.body.decode().splitlines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == one["content"]
    assert events[-1]["content"] == "" and events[-1]["tokens_predicted"] == one["tokens_predicted"]


@pytest.mark.asyncio
async def test_infill_refuses_what_it_cannot_honour(stack, qwen_like):
    client, *_ = await server(stack, qwen_like[0])
    base = {"input_prefix": "a", "input_suffix": "b"}
    cases = [({"samplers": ["top_k", "dry"]}, "samplers[1]"),
             ({"samplers": ["top_p", "top_k"]}, "samplers"),  # not llmd's order
             ({"samplers": "kpx"}, "samplers"),  # llama.cpp's letters: xtc
             ({"input_extra": [{"filename": "f"}]}, "input_extra[0].text"),
             ({"input_extra": [{"text": "t", "size": 1}]}, "input_extra[0].size"),
             ({"logit_bias": {"320": 5}}, "logit_bias"),  # past the vocabulary
             ({"prompt": "x" * 2000}, "prompt"),  # typed text is never cut: over the context
             ({"lora": [{"id": 0, "scale": 1}]}, "lora"),
             ({"n_cmpl": 17}, "n_cmpl"),
             ({"model": False}, "model"),  # optional, but a string when given
             ({"wat": 1}, "wat")]
    for extra, param in cases:
        err = await post(client, "/infill", {**base, **extra}, 400)
        assert err["error"]["param"] == param, (extra, err)
    for missing in ("input_prefix", "input_suffix"):
        err = await post(client, "/infill", {k: v for k, v in base.items() if k != missing}, 400)
        assert err["error"]["param"] == missing


@pytest.mark.asyncio
async def test_infill_cuts_what_cannot_fit_before_tokenizing_it(stack, qwen_like):
    """Text far past the context is cut, not refused: the prefix's end, the suffix's start
    and the newest files are what fitting keeps (at most 512 positions here)."""
    client, engine, runtime, _ = await server(stack, qwen_like[0])
    huge = "word " * 100_000  # 500,000 characters, past what any 512 tokens can spell
    body = {"input_prefix": huge + "END", "input_suffix": "START" + huge, "n_predict": 4, "temperature": 0,
            "samplers": ["temperature"], "input_extra": [{"text": huge}, {"text": "newest " * 10}]}
    got = await post(client, "/infill", body)
    assert got["truncated"] is True and got["tokens_evaluated"] < engine.info.n_ctx
    assert "END<|fim_suffix|>START" in got["prompt"] and "newest" in got["prompt"]
    files = [ExtraFile(huge), ExtraFile("newest " * 10)]
    assert infill.clip(body["input_prefix"], body["input_suffix"], files, 100) == \
        (body["input_prefix"][-100:], body["input_suffix"][:100], [ExtraFile(huge[-30:]), files[1]], True)
    assert infill.clip("ab", "cd", files[1:], 100) == ("ab", "cd", files[1:], False)


@pytest.mark.asyncio
async def test_infill_takes_llama_cpp_s_conventions(stack, qwen_like):
    client, *_ = await server(stack, qwen_like[0])
    base = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 4, "model": None}  # model: optional
    whole = await post(client, "/infill", {**base, "response_fields": []})  # [] picks nothing out: all
    assert {"content", "timings", "generation_settings"} <= set(whole)
    seeds = [(await post(client, "/infill", {**base, "seed": -1}))["generation_settings"]["seed"] for _ in range(2)]
    assert seeds[0] != seeds[1] and -1 not in seeds  # -1: a random seed, as in llama.cpp
    assert (await post(client, "/infill", {**base, "seed": 7}))["generation_settings"]["seed"] == 7


# llama.cpp's server (0c1e570) on this model: greedy with its infill step (samplers top_k,
# infill, temperature at 0), n_predict 32, top_k 40: (prefix, content, tokens, stop_type).
LLAMA_CPP_GREEDY_INFILL = [("def f(x):\n    return", "\ufffd" * 27, 28, "eos"),
                           ("class A:\n  x = 1\n", "", 1, "eos"),
                           ("for i in range(3):\n", " hello", 3, "eos"),
                           ("import numpy as np\n", "\ufffd" * 2, 3, "eos"),
                           ("x = [1, 2", " he tha\ufffd222", 7, "eos")]


@pytest.mark.asyncio
async def test_the_infill_step_ends_where_llama_cpp_ends(stack, qwen_like):
    client, *_ = await server(stack, qwen_like[0])
    for prefix, content, tokens, stop_type in LLAMA_CPP_GREEDY_INFILL:
        body = {"input_prefix": prefix, "input_suffix": "\n", "n_predict": 32, "temperature": 0, "top_k": 40}
        got = await post(client, "/infill", {**body, "samplers": ["temperature", "top_k", "infill"]})
        assert (got["content"], got["tokens_predicted"], got["stop_type"]) == (content, tokens, stop_type), prefix
        assert (await post(client, "/infill", {**body, "samplers": "tki"}))["content"] == content  # as letters
        plain = await post(client, "/infill", {**body, "samplers": ["temperature", "top_k"]})
        assert plain["tokens_predicted"] > tokens  # without the step it runs on


# llama.cpp's server (0c1e570) on this model: /completion, greedy, 8 tokens:
# (prompt, content, tokens_evaluated)
LLAMA_CPP_GREEDY = [("Hello world", "[DDDDDDD", 7), ("The quick brown fox", "\ufffd" * 8, 11),
                    ("<|im_start|>user\nHi<|im_end|>\n", "\r\ufffd tha\ufffd\ufffd\ufffd\ufffd\ufffd", 9)]


@pytest.mark.asyncio
async def test_completion_answers_as_llama_cpp_does(stack, qwen_like):
    client, engine, runtime, table = await server(stack, qwen_like[0])
    for prompt, content, evaluated in LLAMA_CPP_GREEDY:
        got = await post(client, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0,
                                                 "samplers": ["temperature"], "id_slot": 1})
        assert (got["content"], got["tokens_evaluated"], got["prompt"]) == (content, evaluated, prompt)
        assert (got["stop_type"], got["tokens_predicted"], got["truncated"]) == ("limit", 8, False)
    assert "slot-1" in table.named
    # token ids as the prompt, and the same reply through /v1/completions
    ids = engine.tokenize("Hello world", True)
    by_ids = await post(client, "/completion", {"prompt": ids, "n_predict": 8, "temperature": 0,
                                                "samplers": ["temperature"]})
    same = await post(client, "/completions", {"model": "model", "prompt": ids, "max_tokens": 8, "temperature": 0})
    assert by_ids["content"] == same["choices"][0]["text"] == "[DDDDDDD"
    refused = [({"prompt": ""}, "prompt"), ({"prompt": [10**9]}, "prompt[0]"), ({}, "prompt"),
               ({"prompt": "a", "input_suffix": "b"}, "input_suffix"), ({"prompt": "a", "model": "x"}, "model")]
    for body, param in refused:
        err = await post(client, "/completion", body, 404 if "model" in body else 400)
        assert err["error"]["param"] == param, body
