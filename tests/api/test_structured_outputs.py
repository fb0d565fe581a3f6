"""Acceptance of constrained decoding on the default model (SmolLM2-135M-Instruct): every
json_object answer parses and every json_schema answer validates (against the engine
directly, batched), every required tool call is a well-formed call of a declared tool
with finish_reason tool_calls (through HTTP, one named session per tool set so its tools
block stays cached and the sessions decode together). Greedy and short."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from llmd.api import chat_completions
from llmd.api import validation
from llmd.engine.native import Sampling
from llmd.prompt import templates
from llmd.structured import constrain
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.schema_validator import errors

JSON_PROMPTS = [
    "Describe a cat as JSON.", "Give me a JSON object with the capital of France.", "List three fruits.",
    "What is 2 + 2?", "Tell me about the planet Mars.", "Create a user profile for a person named Alice.",
    "Write a short poem about the sea.", "Return the current weather in Tokyo as JSON.",
    "Give the ingredients of a pancake recipe.", "Who wrote Hamlet?", "Summarize the plot of Cinderella.",
    "Convert 10 kilometers to miles.", "Make a todo list for a Saturday.",
    "Describe a car with its make, model and year.", "What are the primary colors?",
    "Give a book recommendation with title and author.", "Translate 'hello' into Spanish, French and German.",
    "Hi!", "Explain photosynthesis briefly.", "Generate a random password.", "Create an invoice with two items.",
    "What is the boiling point of water?", "Describe your favourite movie.", "Give me the coordinates of Paris.",
    "Name five animals that live in the ocean.", "Write a product review for headphones.",
    "Plan a three day trip to Rome.", "What time zone is London in?", "Describe a laptop's specifications.",
    "Give a JSON array of prime numbers below 20.", "Tell me a joke.", "What is the population of Canada?",
    "Create a schedule for a school day.", "Describe the solar system.", "Give an example of an API error response.",
    "What is machine learning?", "List the days of the week.",
    "Return a JSON object describing a dog named Rex who is 3 years old.", "Write an email subject line for a sale.",
    "Give the nutritional facts of an apple.", "Compare Python and JavaScript.", "What is the tallest mountain?",
    "Describe a restaurant menu with three dishes.", "Count from one to five.",
    "Give me a configuration for a web server.", "What's your name?", "Create a character for a fantasy game.",
    "Describe the rules of chess briefly.", "Give the stock price of a fictional company.",
    "Output an empty JSON object.",
]


def obj(props: dict, required: list[str] | None = None, **more) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **more}


STRING, INTEGER, BOOLEAN = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
SCHEMAS = [
    ("Name a city and its country.", obj({"city": STRING, "country": STRING})),
    ("Describe a person.", obj({"name": STRING, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("Is the sky blue?", obj({"answer": BOOLEAN, "reason": {"type": "string", "maxLength": 80}})),
    ("Rate the movie Titanic.", obj({"title": STRING, "stars": {"type": "integer", "minimum": 1, "maximum": 5}})),
    ("What is the temperature outside?", obj({"celsius": {"type": "number", "minimum": -50, "maximum": 60}})),
    ("Pick a color.", obj({"color": {"type": "string", "enum": ["red", "green", "blue"]}})),
    ("List some fruits.", obj({"fruits": {"type": "array", "items": STRING, "minItems": 1, "maxItems": 5}})),
    ("Give a point on a map.", obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                    "lon": {"type": "number", "minimum": -180, "maximum": 180}})),
    ("Create a task.", obj({"title": STRING, "done": BOOLEAN,
                            "priority": {"type": "string", "enum": ["low", "medium", "high"]}}, ["title"])),
    ("Describe a book.", obj({"title": STRING, "author": obj({"first": STRING, "last": STRING}), "year": INTEGER})),
    ("Give a status.", {"anyOf": [obj({"ok": {"const": True}}), obj({"error": STRING})]}),
    ("Say something or nothing.", obj({"message": {"type": ["string", "null"]}})),
    ("When is the meeting?", obj({"date": {"type": "string", "format": "date"},
                                  "time": {"type": "string", "format": "time"}})),
    ("Make an id.", obj({"id": {"type": "string", "format": "uuid"}})),
    ("Give a number between 0 and 1.", {"type": "number", "minimum": 0, "maximum": 1}),
    ("Count to three.", {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3},
                         "minItems": 3, "maxItems": 3}),
    ("Describe a tree of folders.", {"$defs": {"node": obj({"name": {"type": "string", "maxLength": 20},
                                                            "children": {"type": "array", "maxItems": 2,
                                                                         "items": {"$ref": "#/$defs/node"}}})},
                                     "$ref": "#/$defs/node"}),
    ("Order a pizza.", obj({"size": {"enum": ["small", "large"]},
                            "toppings": {"type": "array", "maxItems": 3,
                                         "items": {"type": "string", "enum": ["cheese", "ham", "olives"]}},
                            "extra": {"type": "object", "additionalProperties": INTEGER}}, ["size"])),
    ("Score a test.", obj({"score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100},
                           "passed": BOOLEAN})),
    ("Translate hello.", obj({"translations": {"type": "object", "additionalProperties": STRING}})),
]


def tool(name: str, description: str, props: dict, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": list(props) if required is None else required}}}


WEATHER = tool("get_weather", "Get the current weather for a city.",
               {"city": STRING, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])
TIME = tool("get_time", "Get the current time in a time zone.", {"timezone": STRING})
SEARCH = tool("search_web", "Search the web.", {"query": STRING, "max_results": {"type": "integer", "minimum": 1,
                                                                                  "maximum": 10}}, ["query"])
EMAIL = tool("send_email", "Send an email.", {"to": STRING, "subject": STRING, "body": STRING})
CALC = tool("calculate", "Evaluate an arithmetic expression.", {"expression": STRING})
ALARM = tool("set_alarm", "Set an alarm.", {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                            "minute": {"type": "integer", "minimum": 0, "maximum": 59}})
TOOL_SETS = [
    ([WEATHER, TIME], ["What is the weather in Paris?", "What time is it in Tokyo?", "Is it raining in London?",
                       "What's the time in New York right now?", "How hot is it in Cairo?", "Time in Sydney?"]),
    ([SEARCH, CALC], ["Search for the best pizza in Naples.", "What is 17 times 23?", "Find news about the Olympics.",
                      "How much is 2 to the power of 10?", "Look up the height of the Eiffel Tower.",
                      "Compute 100 divided by 7."]),
    ([EMAIL, ALARM, WEATHER], ["Email Bob that the meeting moved.", "Wake me up at 7:30.",
                               "Tell Alice I will be late.", "Set an alarm for 6 am.",
                               "Do I need an umbrella in Berlin today?", "Write to support@example.com."]),
    ([CALC], ["Calculate the square root of 144.", "What is 3.5 plus 4.25?", "Add 7 and 8.",
              "What is 12 squared?", "Divide 81 by 9.", "What is 15 percent of 200?"]),
    ([TIME, ALARM, SEARCH], ["Remind me at noon.", "Current time in UTC?", "Search for cheap flights to Rome.",
                             "Alarm at 22:15 please.", "Who won the last World Cup?", "Schedule an alarm for 5:45."]),
]


class Batch:
    """Greedy constrained generations on up to len(sessions) sessions at once. Each session
    keeps its cache, so a prompt that shares a prefix with that session's last prompt
    (the default system turn) prefills only the rest."""

    def __init__(self, engine, n: int):
        self.engine = engine
        self.template = templates.load_template(engine.info.chat_template, None, engine)
        self.sessions = [engine.new_session() for _ in range(n)]
        self.resident: list[list[int]] = [[] for _ in range(n)]

    def close(self) -> None:
        for s in self.sessions:
            s.close()

    def prompt(self, body: dict) -> tuple[list[int], str | None]:
        """(prompt ids, grammar) of a chat request body."""
        req = chat_completions.parse_chat_request(json.dumps({"model": "m", **body}).encode())
        ids = templates.tokenize_prompt(templates.render_chat(self.template, body["messages"]), self.engine.tokenize_marked).ids
        return ids, constrain.chat_grammar(req)

    def run(self, jobs: list[tuple[list[int], str]], max_tokens: int) -> list[tuple[str, bool]]:
        """jobs[i] runs on session i; returns (text, finished by the grammar or EOS) each."""
        for s, resident, (ids, grammar) in zip(self.sessions, self.resident, jobs):
            keep = 0
            while keep < min(len(resident), len(ids) - 1) and resident[keep] == ids[keep]:
                keep += 1
            s.truncate(keep)
            s.set_sampling(Sampling())
            s.set_grammar(grammar, max_tokens)
            s.prefill(ids[keep:])
            resident[:] = ids
        texts, done = [b""] * len(jobs), [False] * len(jobs)
        live = list(range(len(jobs)))
        for _ in range(max_tokens):
            if not live:
                break
            for i, tok in zip(live, self.engine.decode_batch([self.sessions[i] for i in live])):
                texts[i] += tok.piece
                done[i] = tok.is_terminal
            live = [i for i in live if not done[i]]
        return [(t.decode("utf-8"), d) for t, d in zip(texts, done)]


@pytest.fixture(scope="module")
def batch(default_engine):
    b = Batch(default_engine, 8)
    yield b
    b.close()


def test_fifty_json_object_answers_all_parse(batch):
    results = []
    for k in range(0, len(JSON_PROMPTS), 8):
        jobs = [batch.prompt({"messages": [{"role": "user", "content": p}],
                              "response_format": {"type": "json_object"}}) for p in JSON_PROMPTS[k:k + 8]]
        results += batch.run(jobs, 40)
    assert len(results) == 50
    for prompt, (text, done) in zip(JSON_PROMPTS, results):
        assert done, (prompt, text)
        assert isinstance(json.loads(text), dict), (prompt, text)


def test_twenty_json_schema_answers_all_validate(batch):
    results = []
    for k in range(0, len(SCHEMAS), 8):
        jobs = [batch.prompt({"messages": [{"role": "user", "content": p}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}})
            for p, schema in SCHEMAS[k:k + 8]]
        results += batch.run(jobs, 64)
    assert len(results) == 20
    for (prompt, schema), (text, done) in zip(SCHEMAS, results):
        assert done, (prompt, text)
        assert errors(json.loads(text), schema) == [], (prompt, text)


def test_thirty_required_tool_calls_are_well_formed_calls_of_declared_tools():
    with running_llmd("--ctx", "1024", "--max-sessions", "6") as url:
        client = Client(url + "/v1", model="SmolLM2-135M-Instruct")

        # 100 tokens cover the shortest call of every tool even at one byte per token, so
        # the budget holds from the first step and every answer completes.
        def ask(k: int) -> list[dict]:
            tools, prompts = TOOL_SETS[k]
            return [client.chat([{"role": "user", "content": p}], tools=tools, tool_choice="required",
                                max_tokens=100, session_id=f"tools-{k}").json() for p in prompts]

        with ThreadPoolExecutor(len(TOOL_SETS)) as pool:
            replies = list(pool.map(ask, range(len(TOOL_SETS))))
    checked = 0
    for (tools, _), answers in zip(TOOL_SETS, replies):
        declared = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        for reply in answers:
            choice = reply["choices"][0]
            assert choice["finish_reason"] == "tool_calls", reply
            assert choice["message"]["content"] is None and choice["message"]["tool_calls"], reply
            for call in choice["message"]["tool_calls"]:
                assert call["id"].startswith("call_") and call["type"] == "function", call
                assert call["function"]["name"] in declared, call
                arguments = json.loads(call["function"]["arguments"])
                assert errors(arguments, declared[call["function"]["name"]]) == [], call
            checked += 1
    assert checked == 30
