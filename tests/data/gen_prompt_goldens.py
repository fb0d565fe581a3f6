"""Writes tests/data/prompt_goldens.json: chat prompts as llama.cpp tokenizes them.

Not run by the tests (they read the JSON). Run it by hand with the reference build and
a Python that has jinja2:
    LLAMA=/path/to/llama.cpp python3 -m tests.data.gen_prompt_goldens
For each case (a reference vocabulary, a chat template of that family, a conversation)
it renders the prompt with Jinja2 as tests/support/make_template_goldens.py does, and records
the text and its ids from llama_tokenize with special tokens parsed and no BOS (the
tool of tests/data/gen_tokenizer_goldens.py): what llama.cpp's server feeds the model.
"""
from __future__ import annotations

import copy
import json
import subprocess
import tempfile
from pathlib import Path

from tests.data.gen_tokenizer_goldens import parse_special_tool
from tests.support.make_template_goldens import environment
from tests.reference_data import reference_dir
from tests.support.template_cases import CONVERSATIONS

OUT = Path(__file__).with_name("prompt_goldens.json")

# Llama 2's chat template (the format SentencePiece Llama and Mistral v0.1 models use):
# "[INST]" is plain text in that vocabulary, and replies follow it after a space.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}")

# Content that meets the template's text at every kind of seam: leading spaces,
# digits, non-ASCII, newlines, punctuation right after a role header.
CONVERSATION = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "  Hello there: 3.14159, naïve café 你好\nsecond line"},
    {"role": "assistant", "content": "Sure — 42 is the answer!"},
    {"role": "user", "content": "Why?"},
]

# A tools conversation (tool definitions, a call, its result, a reply): tests/support/template_cases.py's.
TOOLS_CASE = CONVERSATIONS["tool_call_with_content"]

# (vocab, template file in models/templates or None for LLAMA2_TEMPLATE, bos, eos); the
# cases named "+tools" render TOOLS_CASE, the others CONVERSATION.
CASES = {
    "llama-spm/llama2": ("llama-spm", None, "<s>", "</s>"),
    "phi-3/phi-3.5": ("phi-3", "microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    "llama-bpe/llama-3.1": ("llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>",
                            "<|end_of_text|>"),
    "qwen2/qwen2.5": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|endoftext|>"),
    "qwen35/qwen3.5": ("qwen35", "Qwen3.5-4B.jinja", "", "<|endoftext|>"),
    "gemma-4/gemma-4": ("gemma-4", "google-gemma-4-31B-it.jinja", "<bos>", "<eos>"),
    "command-r/command-r7b": ("command-r", "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<BOS_TOKEN>",
                              "<|END_OF_TURN_TOKEN|>"),
    "llama-bpe/llama-3.1+tools": ("llama-bpe", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>",
                                  "<|end_of_text|>"),
    "qwen2/qwen2.5+tools": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|endoftext|>"),
    "qwen35/qwen3.5+tools": ("qwen35", "Qwen3.5-4B.jinja", "", "<|endoftext|>"),
    "gemma-4/gemma-4+tools": ("gemma-4", "google-gemma-4-31B-it.jinja", "<bos>", "<eos>"),
}


def main() -> None:
    models = reference_dir() / "models"
    env = environment()
    out: dict = {"_about": __doc__.split("\n\n")[0], "conversation": CONVERSATION, "tools_case": TOOLS_CASE,
                 "llama2_template": LLAMA2_TEMPLATE, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tool = parse_special_tool(Path(tmp))
        for name, (vocab, template, bos, eos) in CASES.items():
            source = LLAMA2_TEMPLATE if template is None else (models / "templates" / template).read_text()
            tools = TOOLS_CASE["tools"] if name.endswith("+tools") else None
            messages = TOOLS_CASE["messages"] if tools else CONVERSATION
            text = env.from_string(source).render(messages=copy.deepcopy(messages), add_generation_prompt=True,
                                                  bos_token=bos, eos_token=eos,
                                                  **({"tools": copy.deepcopy(tools)} if tools else {}))
            prompt = Path(tmp) / "prompt.txt"
            prompt.write_bytes(text.encode())
            run = subprocess.run([str(tool), str(models / f"ggml-vocab-{vocab}.gguf"), str(prompt)],
                                 capture_output=True, check=True)
            out["cases"][name] = {"vocab": vocab, "template": template, "text": text,
                                  "ids": json.loads(run.stdout.decode().strip().splitlines()[-1])}
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", "utf-8")
    print(f"{len(out['cases'])} prompts -> {OUT}")


if __name__ == "__main__":
    main()
