"""A Phi-4-mini-instruct chat template for tests. llama.cpp ships none, so this one is
written from the published facts of the format (Phi-4-mini-instruct's model card and
chat template, llama.cpp pull request 12288): the system turn declares the tools as a
JSON list of {"name", "description", "parameters"} between <|tool|> and <|/tool|>, the model answers a call with
<|tool_call|>[{"name": ..., "arguments": {...}}]<|/tool_call|>, and a tool's result
comes back in a <|tool_response|> turn; turns are <|system|>, <|user|>, <|assistant|>,
each closed by <|end|>."""

PHI4_MINI_TEMPLATE = (
    "{%- if tools or messages[0].role == 'system' -%}<|system|>"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}{% endif -%}"
    "{%- if tools %}<|tool|>[{% for t in tools %}{{ (t.function if t.function is defined else t) | tojson }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}]<|/tool|>{% endif %}<|end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' %}<|user|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' %}<|assistant|>{% if m.content %}{{ m.content }}{% endif -%}"
    "{%- if m.tool_calls %}<|tool_call|>[{% for c in m.tool_calls %}"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "{% if not loop.last %}, {% endif %}{% endfor %}]<|/tool_call|>{% endif %}<|end|>"
    "{%- elif m.role == 'tool' %}<|tool_response|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)
