"""`python -m llmd bench --speculative`: what speculative decoding buys, by prompt lookup,
with --draft-model by a draft model, or with --mtp by the model's own
multi-token-prediction block.

Four tasks through HTTP chat completions at temperature 0 against one `python -m llmd`
server: a code edit (rename a variable in a 200-line file and reprint it), a RAG
answer quoting a given passage, a JSON rewrite, and open chat. Each run sends every
task twice, with speculation (the server's default) and with `"speculative": false`,
in alternating order; a task's speed is the server's own decode rate (`timings`:
predicted_n / predicted_ms, so prefill and HTTP are not counted), its figure the median
over the runs, and the speed-up the median of the runs' ratios. Greedy output must not
change with speculation: the figures say whether every reply was identical.

Then 4 busy streams: the four tasks at once, end-of-generation banned so that all four
decode to their max_tokens, with speculation on and off (each stream a session of its
own, its prompt cached there by a first round): aggregate completion tokens over the
wall time of the burst.
"""
from __future__ import annotations

import json
import statistics
import threading
import time

from llmd.commands.bench import _default, _request, _start
from llmd.engine.native import Engine

TASKS = ("code_edit", "rag_answer", "json_rewrite", "open_chat")
MAX_TOKENS = {"code_edit": 512, "rag_answer": 160, "json_rewrite": 400, "open_chat": 200}
STREAM_TOKENS = 160  # tokens of each of the 4 busy streams


def code_file() -> str:
    """A Python file of about 200 lines in which `total` is used throughout."""
    lines = ['"""Batch statistics."""', "import math", ""]
    for f in range(20):
        lines += [f"def step_{f}(items, scale={f + 1}):",
                  f'    """Sum the items of batch {f}, scaled by {f + 1}."""',
                  "    total = 0",
                  "    for item in items:",
                  f"        total += item * scale + {f}",
                  "    if total > 100:",
                  f"        total = math.sqrt(total) + {f}",
                  "    return total", ""]
    lines += ["def main():", "    total = 0"]
    lines += [f"    total += step_{f}([1, 2, 3])" for f in range(20)]
    lines += ["    print(total)", "", 'if __name__ == "__main__":', "    main()"]
    return "\n".join(lines) + "\n"


PASSAGE = (
    "The Harbor Street library opened in 1911 with four thousand books donated by the mill owners. "
    "It closed for two years after the flood of 1952, when the lower floor stood under water for nine days. "
    "The reading room was rebuilt with a raised floor and new oak shelves, paid for by a town levy. "
    "In 1978 the library began lending records and, later, cassettes and compact discs. "
    "The building was extended in 1994 with a children's wing designed by the architect Helen Marsh. "
    "Today the library holds about ninety thousand items and is open six days a week. "
    "Its most valuable possession is a hand-drawn map of the harbor from 1803, kept in a sealed case. "
    "Volunteers run a reading club for older residents every Thursday afternoon. "
    "The library's budget comes mostly from the town, with a smaller share from a private trust. "
    "A plan to move the collection to a new building near the station was rejected by voters in 2015."
)

RECORDS = [{"id": i, "name": name, "city": city, "active": i % 3 != 0}
           for i, (name, city) in enumerate(zip(
               ["Ada Park", "Ben Ortiz", "Chen Wei", "Dana Cole", "Eli Stone", "Fay Moss", "Gus Hale",
                "Hana Ito", "Ivan Roth", "Jill Webb", "Kai Lund", "Lea Voss"],
               ["Oslo", "Lima", "Pune", "Kyiv", "Graz", "Cork", "Nice", "Kobe", "Bern", "Perth", "Turku", "Split"]))]


def task_messages() -> dict[str, str]:
    return {
        "code_edit": "Rename the variable `total` to `running_sum` everywhere in this Python file and print the "
                     "whole file, with no comment:\n```python\n" + code_file() + "```",
        "rag_answer": "Passage:\n" + PASSAGE + "\n\nUsing only the passage, answer: what happened to the "
                      "library in 1952 and afterwards? Quote the sentences of the passage that say so.",
        "json_rewrite": "Rewrite this JSON so that every \"name\" key is called \"full_name\" and keep everything "
                        "else the same. Output only the JSON.\n" + json.dumps(RECORDS, indent=1),
        "open_chat": "What are some good ways to spend a rainy weekend at home? Give me a few ideas.",
    }


def _chat(port: int, model: str, task: str, text: str, speculative: bool, session: str | None = None,
          **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0,
            "max_tokens": MAX_TOKENS[task], **extra}
    if not speculative:
        body["speculative"] = False
    headers = {"X-Session-ID": session} if session else None
    reply = json.loads(_request(port, "POST", "/v1/chat/completions", body, headers))
    if "error" in reply:
        raise RuntimeError(f"{task}: {reply['error'].get('message')}")
    return reply


def speculative_figures(path: str | None, threads: int, runs: int, draft_path: str | None = None,
                        mtp: bool = False) -> dict:
    path = path or _default()
    with Engine(path, n_ctx=16) as engine:
        eog_ids = engine.info.eog_ids
    mode = "draft" if draft_path else "mtp" if mtp else "ngram"
    drafter = {"draft": ("--speculative", "draft", "--draft-model", draft_path), "mtp": ("--speculative", "mtp"),
               "ngram": ()}[mode]
    proc, port = _start(path, threads, "--max-sessions", "8", "--ctx", "4096", *drafter)
    try:
        model = json.loads(_request(port, "GET", "/v1/models"))["data"][0]["id"]
        texts = task_messages()
        rates = {t: {True: [], False: []} for t in TASKS}
        drafted, accepted, tokens, identical = {t: 0 for t in TASKS}, {t: 0 for t in TASKS}, {}, True
        for task in TASKS:  # the prompts enter the prefix cache; first-request costs are not counted
            _chat(port, model, task, texts[task], True, max_tokens=1)
        for r in range(runs):
            for task in TASKS:
                replies = {}
                for on in ((True, False) if r % 2 == 0 else (False, True)):
                    reply = replies[on] = _chat(port, model, task, texts[task], on)
                    t = reply["timings"]
                    rates[task][on].append(t["predicted_n"] / t["predicted_ms"] * 1000)
                    if on:
                        drafted[task] += t["draft_n"]
                        accepted[task] += t["draft_n_accepted"]
                tokens[task] = replies[True]["usage"]["completion_tokens"]
                identical = identical and (replies[True]["choices"][0]["message"]
                                           == replies[False]["choices"][0]["message"])
        figures: dict = {"drafter": mode, "runs": runs, "identical_output": identical}
        for task in TASKS:
            on, off = rates[task][True], rates[task][False]
            figures[f"{task}_tokens"] = tokens[task]
            figures[f"{task}_on_tok_s"] = round(statistics.median(on), 1)
            figures[f"{task}_off_tok_s"] = round(statistics.median(off), 1)
            figures[f"{task}_speedup"] = round(statistics.median(a / b for a, b in zip(on, off)), 2)
            figures[f"{task}_acceptance"] = round(accepted[task] / drafted[task], 2) if drafted[task] else None
        figures.update(_busy_streams(port, model, texts, runs, eog_ids))
        return figures
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _busy_streams(port: int, model: str, texts: dict[str, str], runs: int, eog_ids: tuple[int, ...]) -> dict:
    """The four tasks at once, each decoding STREAM_TOKENS with end-of-generation banned,
    each in a session of its own: its prompt stays cached there, where the prefix cache's
    retired blocks (one context's worth) would keep some of the four prompts and lose
    others, and the burst would time their prefills."""
    ban = {str(t): -100 for t in eog_ids}

    def burst(on: bool) -> float:
        barrier, counts, ends = threading.Barrier(len(TASKS) + 1), [0] * len(TASKS), [0.0] * len(TASKS)

        def one(i: int) -> None:
            barrier.wait()
            reply = _chat(port, model, TASKS[i], texts[TASKS[i]], on, f"bench-stream-{i}", logit_bias=ban,
                          max_tokens=STREAM_TOKENS)
            counts[i] = reply["usage"]["completion_tokens"]
            ends[i] = time.perf_counter()

        workers = [threading.Thread(target=one, args=(i,)) for i in range(len(TASKS))]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        if not all(counts):
            raise RuntimeError("a stream failed")
        return sum(counts) / (max(ends) - start)

    burst(True)  # the prompts are cached in the streams' sessions from here on
    on, off = [], []
    for r in range(runs):
        for flag in ((True, False) if r % 2 == 0 else (False, True)):
            (on if flag else off).append(burst(flag))
    return {"4_streams_on_tok_s": round(statistics.median(on), 1),
            "4_streams_off_tok_s": round(statistics.median(off), 1),
            "4_streams_speedup": round(statistics.median(a / b for a, b in zip(on, off)), 2)}


def run(path: str | None, threads: int, runs: int, as_json: bool, draft_path: str | None = None,
        mtp: bool = False) -> int:
    """Prints the figures; exits 1 when a reply differed with speculation."""
    figures = speculative_figures(path, threads, runs, draft_path, mtp)
    print(json.dumps(figures) if as_json else "\n".join(f"  {k:<42} {v}" for k, v in figures.items()))
    return 0 if figures["identical_output"] else 1
