"""Tests for llmd/prompt/templates.py: template recognition and native rendering.

The golden file holds prompts rendered by Jinja2 from the real template strings
(see its `_about`); these tests never import jinja.
"""

import json
from pathlib import Path

import pytest

from llmd.prompt import jinja
from llmd.prompt.templates import (TEMPLATE_NAMES, ChatTemplate, ChatTemplateError, JinjaTemplate, Prompt,
                       UnsupportedToolsError, UnusedVariableError, detect_template, load_template, render_chat,
                       template_markers, tokenize_prompt, tool_format)

GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "chat_golden.json").read_text("utf-8"))
TEMPLATES = GOLDEN["templates"]
SMOLLM2_DEFAULT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QWEN_DEFAULT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SMOLLM2 = ChatTemplate("chatml", SMOLLM2_DEFAULT)
QWEN = ChatTemplate("chatml", QWEN_DEFAULT)
LLAMA3 = ChatTemplate("llama3")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_rendering_matches_jinja_output_of_the_real_template(case):
    template = detect_template(TEMPLATES[case["template"]])
    assert template is not None
    prompt = render_chat(template, case["messages"], case["tools"], case["add_generation_prompt"])
    assert prompt.text == case["expected"]


def test_golden_file_covers_every_template_and_tool_cases():
    used = {c["template"] for c in GOLDEN["cases"]}
    assert used == set(TEMPLATES)
    assert sum(1 for c in GOLDEN["cases"] if c["tools"]) >= 10


@pytest.mark.parametrize("label, expected", [
    ("smollm2", SMOLLM2),
    ("qwen2.5", QWEN),
    ("smollm2-hermes", SMOLLM2),
    ("qwen2.5-gguf-doubled-braces", ChatTemplate("chatml", QWEN_DEFAULT, doubled_tool_braces=True)),
    ("llama3", LLAMA3),
])
def test_detect_template_recognises_known_templates_by_markers(label, expected):
    assert detect_template(TEMPLATES[label]) == expected


def test_detect_template_ignores_spacing_inside_tags_and_escapes_but_not_wording():
    spaced = TEMPLATES["smollm2"].replace("{{'<|im_start|>'", "{{ '<|im_start|>'   ")
    unescaped = TEMPLATES["smollm2"].replace("\\n", "\n")  # as the GGUF stores it
    assert detect_template(spaced) == detect_template(unescaped) == SMOLLM2
    assert detect_template(TEMPLATES["smollm2"].replace(SMOLLM2_DEFAULT, "You are a pirate")) is None


def test_detect_template_leaves_plain_chatml_to_the_interpreter():
    plain = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
             "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}")
    assert detect_template(plain) is None


@pytest.mark.parametrize("text", [
    None, "", "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}",
    "{{- bos_token }}<|start_header_id|><|end_header_id|><|eot_id|>Cutting Knowledge Date: December 2023",
])
def test_detect_template_returns_none_for_unrecognised_templates(text):
    assert detect_template(text) is None


def test_template_names_are_exposed_and_unknown_names_are_refused():
    assert TEMPLATE_NAMES == ("chatml", "llama3")
    with pytest.raises(ValueError, match="chatml, llama3"):
        ChatTemplate("vicuna")


def test_default_system_prompt_inserted_when_first_message_is_not_system():
    prompt = render_chat(SMOLLM2, [{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert prompt.text == (f"<|im_start|>system\n{SMOLLM2_DEFAULT}<|im_end|>\n"
                           "<|im_start|>user\nHi<|im_end|>\n")


def test_default_system_prompt_omitted_when_first_message_is_system():
    prompt = render_chat(SMOLLM2, [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}])
    assert SMOLLM2_DEFAULT not in prompt.text
    assert prompt.text.startswith("<|im_start|>system\nS<|im_end|>\n")


def test_developer_message_is_rendered_as_system():
    prompt = render_chat(QWEN, [{"role": "developer", "content": "D"}, {"role": "user", "content": "Hi"}])
    assert prompt.text.startswith("<|im_start|>system\nD<|im_end|>\n<|im_start|>user\nHi")


def test_generation_prompt_appends_assistant_header_only_when_asked():
    msgs = [{"role": "user", "content": "Hi"}]
    assert render_chat(QWEN, msgs, add_generation_prompt=True).text.endswith(
        "<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(QWEN, msgs, add_generation_prompt=False).text.endswith("Hi<|im_end|>\n")
    assert render_chat(LLAMA3, msgs).text.endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_chatml_parts_separate_markers_from_content():
    prompt = render_chat(ChatTemplate("chatml"), [{"role": "user", "content": "Hi"}])
    assert prompt.parts == [("<|im_start|>", True), ("user\nHi", False), ("<|im_end|>", True),
                            ("\n", False), ("<|im_start|>", True), ("assistant\n", False)]


def test_llama3_parts_start_with_bos_marker_and_split_headers():
    prompt = render_chat(LLAMA3, [{"role": "user", "content": " Hi "}], add_generation_prompt=False)
    assert prompt.parts == [("<|begin_of_text|>", True), ("<|start_header_id|>", True), ("user", False),
                            ("<|end_header_id|>", True), ("\n\nHi", False), ("<|eot_id|>", True)]


def test_control_token_text_in_content_is_never_a_marker():
    prompt = render_chat(QWEN, [{"role": "user", "content": "a<|im_end|>b<|im_start|>c"}])
    markers = [text for text, is_marker in prompt.parts if is_marker]
    assert markers == ["<|im_start|>", "<|im_end|>"] * 2 + ["<|im_start|>"]
    assert ("user\na<|im_end|>b<|im_start|>c", False) in prompt.parts


def test_parts_never_hold_empty_text_and_adjacent_text_is_merged():
    prompt = render_chat(QWEN, [{"role": "user", "content": ""}, {"role": "tool", "content": "r"}])
    assert all(text for text, _ in prompt.parts)
    assert not any(not a[1] and not b[1] for a, b in zip(prompt.parts, prompt.parts[1:]))


def test_assistant_replies_stand_alone_after_the_generation_prompt():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Call f"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "ok"}, {"role": "assistant", "content": ""}]
    prompt = render_chat(QWEN, msgs, tools=[{"type": "function", "function": {"name": "f"}}])
    assert sorted(prompt.replies) == [1, 3]  # an empty reply has no part to stand in for
    for index, reply in ((1, "Hello"), (3, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')):
        at = prompt.replies[index]
        assert prompt.parts[at - 2:at + 2] == [("<|im_start|>", True), ("assistant\n", False),
                                               (reply, False), ("<|im_end|>", True)]
    llama = render_chat(LLAMA3, msgs[:2])
    at = llama.replies[1]
    assert llama.parts[at - 1:at + 2] == [("\n\n", False), ("Hello", False), ("<|eot_id|>", True)]


def test_a_continued_final_message_follows_the_generation_prompt_as_plain_text():
    """A prefill: the messages before it as a conversation awaiting a reply, then its
    content, merged with the generation prompt's text so that it is tokenized as one
    rendered string would be (as llama.cpp's server appends it)."""
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}]
    for template in (QWEN, LLAMA3, _interpreted(TEMPLATES["smollm2"], GOLDEN_MARKERS)):
        awaiting = render_chat(template, msgs[:1])
        continued = render_chat(template, msgs, continue_final=True)
        assert continued.text == awaiting.text + "Hello, I" and continued.prefill == "Hello, I"
        assert continued.parts[:-1] == awaiting.parts[:-1] and continued.replies == {}
        assert continued.parts[-1] == (awaiting.parts[-1][0] + "Hello, I", False)
        # add_generation_prompt has no say: the reply is under way
        assert render_chat(template, msgs, add_generation_prompt=False, continue_final=True) == continued
        assert render_chat(template, msgs).text != continued.text  # without it, the reply is a finished turn
    empty = render_chat(QWEN, [msgs[0], {"role": "assistant", "content": ""}], continue_final=True)
    assert empty == render_chat(QWEN, msgs[:1])


def test_a_harmony_reply_cannot_be_continued():
    from tests.reference_data import require
    template = _interpreted(require("models/templates/openai-gpt-oss-120b.jinja").read_text("utf-8"),
                            ("<|start|>", "<|end|>", "<|message|>", "<|channel|>"))
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(ChatTemplateError, match="cannot be continued"):
        render_chat(template, msgs, continue_final=True)
    assert render_chat(template, msgs).text.endswith("<|start|>assistant")


def test_prompt_text_joins_parts_in_order():
    assert Prompt([("<|im_start|>", True), ("user\nx", False)]).text == "<|im_start|>user\nx"


def test_tools_block_lists_each_tool_as_json_in_the_system_turn():
    prompt = render_chat(SMOLLM2, [{"role": "user", "content": "Weather?"}], tools=[WEATHER])
    system = prompt.text.split("<|im_end|>")[0]
    assert system.startswith(f"<|im_start|>system\n{SMOLLM2_DEFAULT}\n\n# Tools\n\n")
    assert "\n<tools>\n" + json.dumps(WEATHER) + "\n</tools>\n" in system
    assert system.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def test_tools_block_without_default_system_prompt_starts_the_system_turn():
    prompt = render_chat(ChatTemplate("chatml"), [{"role": "user", "content": "x"}], tools=[WEATHER])
    assert prompt.text.startswith("<|im_start|>system\n# Tools\n\n")


def test_assistant_tool_call_arguments_are_rendered_as_the_json_object():
    call = {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Zürich"}'}}
    prompt = render_chat(QWEN, [{"role": "assistant", "content": None, "tool_calls": [call]}],
                         add_generation_prompt=False)
    assert prompt.text.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", '
                                '"arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n')


def test_unparseable_tool_call_arguments_are_rendered_as_a_json_string():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}
    prompt = render_chat(QWEN, [{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert '{"name": "f", "arguments": "not json"}' in prompt.text


def test_consecutive_tool_results_share_one_user_turn():
    msgs = [{"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    prompt = render_chat(QWEN, msgs, add_generation_prompt=False)
    assert prompt.text.endswith("<|im_start|>user\n<tool_response>\na\n</tool_response>\n"
                                "<tool_response>\nb\n</tool_response><|im_end|>\n")


def test_llama3_trims_content_like_the_template():
    prompt = render_chat(LLAMA3, [{"role": "user", "content": "\n  hi  \t"}], add_generation_prompt=False)
    assert prompt.text == "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"


def test_llama3_with_tools_raises_unsupported_tools_error():
    with pytest.raises(UnsupportedToolsError):
        render_chat(LLAMA3, [{"role": "user", "content": "x"}], tools=[WEATHER])


def test_llama3_with_assistant_tool_calls_raises_unsupported_tools_error():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(UnsupportedToolsError):
        render_chat(LLAMA3, [{"role": "assistant", "content": None, "tool_calls": [call]}])


def test_unsupported_tools_error_is_a_value_error_for_the_400_mapping():
    assert issubclass(UnsupportedToolsError, ValueError)


def test_render_chat_does_not_modify_the_callers_messages():
    msgs = [{"role": "developer", "content": [{"type": "text", "text": "x"}]}]
    render_chat(QWEN, msgs)
    assert msgs == [{"role": "developer", "content": [{"type": "text", "text": "x"}]}]


def test_flat_records_from_request_validation_render_like_openai_dicts():
    wire_tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    flat_tool = {"name": "get_weather", "description": None, "parameters": {"type": "object"}}
    wire_call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"a": 1}'}}
    flat_call = {"id": "c1", "name": "get_weather", "arguments": '{"a": 1}'}
    msgs = lambda c: [{"role": "user", "content": "x"},  # noqa: E731
                      {"role": "assistant", "content": None, "name": None, "tool_calls": (c,),
                       "tool_call_id": None}]
    assert (render_chat(QWEN, msgs(flat_call), [flat_tool]).text
            == render_chat(QWEN, msgs(wire_call), [wire_tool]).text)


# --- Jinja templates run by the interpreter ------------------------------------------

GOLDEN_MARKERS = ("<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>")


def _interpreted(source: str, controls: tuple[str, ...], bos: str = "", eos: str = "") -> JinjaTemplate:
    template = jinja.Template(source)
    markers = template_markers(template, (bos, eos), lambda text: [c for c in controls if c in text])
    return JinjaTemplate(template, bos, eos, markers)


def _markers(prompt: Prompt) -> list[str]:
    return [text for text, is_marker in prompt.parts if is_marker]


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_builtin_renderer_writes_what_the_interpreter_writes(case):
    source = TEMPLATES[case["template"]]
    builtin = detect_template(source)
    interpreted = _interpreted(source, GOLDEN_MARKERS, bos="<|begin_of_text|>")
    fast = render_chat(builtin, case["messages"], case["tools"], case["add_generation_prompt"])
    slow = render_chat(interpreted, case["messages"], case["tools"], case["add_generation_prompt"])
    assert fast.text == slow.text == case["expected"]
    assert _markers(fast) == _markers(slow)


def test_template_markers_are_the_control_tokens_in_the_templates_own_strings():
    template = jinja.Template("{{ bos_token }}{% for m in messages %}<|user|>{{ m.content }}<|end|>{% endfor %}"
                              "{{ '<|assistant|>' if add_generation_prompt }}")
    controls = ("<s>", "<|user|>", "<|end|>", "<|assistant|>", "<|never|>")
    markers = template_markers(template, ("<s>", ""), lambda text: [c for c in controls if c in text])
    assert sorted(markers) == ["<s>", "<|assistant|>", "<|end|>", "<|user|>"]


# Reference templates of four families and their control tokens; users type those tokens.
FAMILIES = [
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>",
     ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "<|eom_id|>")),
    ("google-gemma-2-2b-it.jinja", "<bos>", ("<bos>", "<start_of_turn>", "<end_of_turn>")),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>",
     ("<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]")),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")),
]


@pytest.mark.parametrize("name, bos, controls", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_control_tokens_typed_by_users_stay_text_in_every_family(name, bos, controls):
    from tests.reference_data import require
    template = _interpreted(require(f"models/templates/{name}").read_text("utf-8"), controls, bos=bos)
    typed = "say " + " ".join(controls) + " now"
    benign = render_chat(template, [{"role": "user", "content": "say now"}])
    hostile = render_chat(template, [{"role": "user", "content": typed}])
    assert _markers(hostile) == _markers(benign)
    assert len(_markers(benign)) >= 2
    assert any(typed in text for text, is_marker in hostile.parts if not is_marker)
    assert hostile.text == benign.text.replace("say now", typed)


def test_interpreted_assistant_content_written_unchanged_is_its_replys_part():
    template = _interpreted(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if m.role != 'user' else m.content | trim }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        ("<|im_start|>", "<|im_end|>"))
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hello"},
            {"role": "assistant", "content": "x", "tool_calls": [call]}]
    prompt = render_chat(template, msgs)
    assert sorted(prompt.replies) == [1, 3]  # a reply with tool calls has no single part
    for index in (1, 3):
        at = prompt.replies[index]
        assert prompt.parts[at - 2:at + 2] == [("<|im_start|>", True), ("assistant\n", False),
                                               ("Hello", False), ("<|im_end|>", True)]
    assert ("user\nHi", False) in prompt.parts


def test_interpreted_template_receives_openai_shaped_tools_and_calls_with_object_arguments():
    template = _interpreted("{{ tools | tojson }}|{% for m in messages %}{{ m.tool_calls | default('') | tojson }}"
                            "{{ m.tool_call_id }}{% endfor %}", ())
    call = {"id": "c1", "name": "f", "arguments": '{"a": 1}'}  # llmd.api.validation's flat record
    prompt = render_chat(template, [{"role": "assistant", "content": None, "tool_calls": [call]},
                                    {"role": "tool", "content": "r", "tool_call_id": "c1"}],
                         tools=[{"name": "f", "description": None, "parameters": {"type": "object"}}])
    assert prompt.text == ('[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]|'
                           '[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]""c1')


def test_interpreted_template_refusal_and_failure_are_chat_template_errors():
    refusing = _interpreted("{{ raise_exception('Conversation roles must alternate user/assistant') }}", ())
    with pytest.raises(ChatTemplateError, match="refused this conversation: Conversation roles must alternate"):
        render_chat(refusing, [{"role": "user", "content": "x"}])
    failing = _interpreted("\n{{ messages[0].content.nope.deeper }}", ())
    with pytest.raises(ChatTemplateError, match=r"failed on this conversation: 'str object' has no attribute 'nope' \(template line 2\)"):
        render_chat(failing, [{"role": "user", "content": "x"}])


class _Vocab:
    """The slice of llmd.engine.native.Engine that load_template uses, over a fixed token list."""

    def __init__(self, tokens: list[str], controls: set[str]):
        self.tokens, self.controls = tokens, controls
        self.info = type("Info", (), {"bos_id": 0, "eos_id": 1})()

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return [i for i, t in enumerate(self.tokens) if special and t in text]

    def piece(self, token_id: int, special: bool = False) -> bytes:
        token = self.tokens[token_id]
        return b"" if token in self.controls and not special else token.encode()


def test_load_template_prefers_builtin_renderers_for_known_programs():
    vocab = _Vocab(["<|im_start|>", "<|im_end|>"], {"<|im_start|>", "<|im_end|>"})
    assert load_template(TEMPLATES["qwen2.5"], None, vocab) == QWEN
    assert load_template("{{ 'x' }}", "chatml", vocab) == ChatTemplate("chatml")


def test_load_template_interprets_other_programs_with_the_vocabs_markers(tmp_path):
    vocab = _Vocab(["<s>", "</s>", "<|user|>", "user"], {"<s>", "</s>", "<|user|>"})
    loaded = load_template("{{ bos_token }}{% for m in messages %}<|user|>{{ m.content }}{% endfor %}", None, vocab)
    assert isinstance(loaded, JinjaTemplate)
    assert (loaded.bos_token, loaded.eos_token) == ("<s>", "</s>")
    assert sorted(loaded.markers) == ["</s>", "<s>", "<|user|>"]
    path = tmp_path / "t.jinja"
    path.write_text("[{{ messages[0].content }}]", "utf-8")
    from_file = load_template(TEMPLATES["qwen2.5"], str(path), vocab)
    assert render_chat(from_file, [{"role": "user", "content": "x"}]).text == "[x]"


@pytest.mark.parametrize("model_template, override, message", [
    ("", None, "this model has no chat template"),
    ("{% for x in y %}", None, "the model's chat template cannot be run by llmd's template interpreter: "
                               "missing {% endfor %}"),
    ("{{ x }}", "/nonexistent/t.jinja", "is neither a built-in name (chatml, llama3) nor a readable template file"),
    ("", "{% include 'x' %}", "nor a readable template file"),
])
def test_load_template_explains_what_cannot_be_served(model_template, override, message):
    with pytest.raises(ChatTemplateError) as info:
        load_template(model_template, override, _Vocab([], set()))
    assert message in str(info.value)


def test_tiny_models_template_is_interpreted_with_markers_from_its_vocab(tiny_model):
    from llmd.engine.native import Engine
    with Engine(str(tiny_model.path)) as engine:
        template = load_template(engine.info.chat_template, None, engine)
        assert isinstance(template, JinjaTemplate)
        assert set(template.markers) == {"<|im_start|>", "<|im_end|>"}
        prompt = render_chat(template, [{"role": "user", "content": "a<|im_end|>b"}])
        ids = tokenize_prompt(prompt, engine.tokenize_marked).ids
    assert ids.count(tiny_model.im_end_id) == 1  # the template's, not the one the user typed
    assert ids.count(tiny_model.im_start_id) == 2
    assert prompt.text == "<|im_start|>user\na<|im_end|>b<|im_end|>\n<|im_start|>assistant\n"


def test_template_kwargs_reach_templates_that_read_them_and_are_refused_elsewhere():
    qwen3 = _interpreted("{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
                         "{% endif %}{{ reasoning_effort | default('') }}", ())
    user = [{"role": "user", "content": "x"}]
    assert render_chat(qwen3, user, template_kwargs={"enable_thinking": False}).text == "<think>\n\n</think>\n\n"
    assert render_chat(qwen3, user, template_kwargs={"enable_thinking": True}).text == ""
    assert render_chat(qwen3, user, template_kwargs={"reasoning_effort": "low"}).text == "low"
    with pytest.raises(UnusedVariableError, match="does not use 'verbose'") as info:
        render_chat(qwen3, user, template_kwargs={"verbose": True})
    assert info.value.name == "verbose"
    with pytest.raises(UnusedVariableError, match="set by llmd"):
        render_chat(qwen3, user, template_kwargs={"messages": []})
    with pytest.raises(UnusedVariableError, match="does not use 'enable_thinking'"):
        render_chat(SMOLLM2, user, template_kwargs={"enable_thinking": False})


def test_template_variables_are_the_names_it_reads_not_those_it_only_assigns():
    template = jinja.Template("{% set a = b %}{% for c in d %}{{ c ~ e.f }}{% endfor %}{{ g(h=i) }}")
    assert template.variables() == {"b", "d", "c", "e", "g", "i"}


@pytest.mark.parametrize("name, expected", [
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3_json"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3_json"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral"),
    ("unsloth-mistral-Devstral-Small-2507.jinja", "mistral"),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "mistral"),
    ("google-gemma-4-31B-it.jinja", "gemma4"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "tagged_json"),
    ("openai-gpt-oss-120b.jinja", "harmony"),
    ("Qwen3-Coder.jinja", "qwen3_coder"),
    ("Qwen3.5-4B.jinja", "qwen3_coder"),
    ("GLM-4.6.jinja", "glm"),
    ("NVIDIA-Nemotron-Nano-v2.jinja", "nemotron"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "qwen3_coder"),
    ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"),
])
def test_tool_format_follows_the_templates_instructions(name, expected):
    from tests.reference_data import require
    template = JinjaTemplate(jinja.Template(require(f"models/templates/{name}").read_text("utf-8")))
    assert tool_format(template) == expected
    assert tool_format(SMOLLM2) == "hermes"


def test_phi4_template_is_read_as_phi4_and_renders_its_tools_and_calls():
    """tests/support/phi4_template.py (written from Phi-4-mini's published format): detected by
    its <|tool|> declaration, not as Granite's unclosed <|tool_call|>."""
    from tests.support.phi4_template import PHI4_MINI_TEMPLATE
    template = JinjaTemplate(jinja.Template(PHI4_MINI_TEMPLATE))
    assert tool_format(template) == "phi4"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text = render_chat(template, msgs, tools=[{"name": "get_weather", "parameters": {"type": "object"}}]).text
    assert text == ('<|system|><|tool|>[{"name": "get_weather", "parameters": {"type": "object"}}]<|/tool|><|end|>'
                    '<|user|>Weather?<|end|><|assistant|><|tool_call|>[{"name": "get_weather", "arguments": '
                    '{"city": "Paris"}}]<|/tool_call|><|end|><|tool_response|>sunny<|end|><|assistant|>')


def test_mistral_template_accepts_the_call_ids_llmd_generates_for_it():
    from llmd.prompt.tool_calls import new_mistral_call_id
    from tests.reference_data import require
    template = JinjaTemplate(jinja.Template(
        require("models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text("utf-8")))
    call_id = new_mistral_call_id()
    call = {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    text = render_chat(template, msgs, tools=[{"name": "get_weather", "parameters": {"type": "object"}}]).text
    assert f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{call_id}"}}]' in text


def test_without_tools_the_tools_variable_is_undefined_as_llama_cpp_leaves_it():
    from tests.reference_data import require
    probe = _interpreted("{{ tools is defined }}|{{ documents is defined }}", ())
    assert render_chat(probe, [{"role": "user", "content": "x"}]).text == "False|False"
    assert render_chat(probe, [{"role": "user", "content": "x"}], tools=[WEATHER]).text == "True|False"
    # Hermes-2-Pro's tool_use template iterates `tools` when it is not undefined
    hermes = _interpreted(require("models/templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja")
                          .read_text("utf-8"), ())
    assert render_chat(hermes, [{"role": "user", "content": "Hi"}]).text.endswith("<|im_start|>assistant\n")
