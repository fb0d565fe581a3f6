"""A sandboxed interpreter for the subset of Jinja that chat templates are written in.

Theory of operation. `Template(source)` lexes and parses once; `render(**variables)`
walks the tree and returns the text. The dialect is the one Hugging Face transformers
gives chat templates: trim_blocks and lstrip_blocks on, `break`/`continue`, a
`tojson` that is `json.dumps` (non-ASCII kept, optional indent / separators /
sort_keys), `raise_exception(message)`, `strftime_now(format)` and the transparent
`{% generation %}` block. The goal is byte-identical output to Jinja2 for the same
template and values, including where Jinja2 fails: what it cannot render, this
interpreter refuses too, with a TemplateError naming the construct and its line.

Values are plain Python data (dict, list, str, int, float, bool, None) plus a few
template objects (Undefined, namespaces, loops, macros). Nothing reaches Python
objects beyond that: names never start with `_`, attributes resolve only to dict keys,
the read-only methods of str/dict/list listed below, and template objects' own fields;
the only callables are those methods, macros and the listed globals. Work is bounded:
output size, loop iterations, call depth and `range` length all have limits.

Provenance. Strings that come from the caller's data (`render_parts(..., data)` wraps
them) are `Text`: a str that knows which of its characters are data, each range with a
source tag (0, or the tag the caller gave with `data_text`). Concatenation, slicing,
strip, split, join and output keep that knowledge exactly; every other operation that
reads data marks its whole result as untagged data. `render_parts` then returns the
output as runs with their source, so a caller can treat control-token strings the
template wrote as markers while the same characters typed by a user stay text.

The interpreter in its parts: lexer.py (source -> tokens), parser.py (tokens -> the
tree), runtime.py (the tree's nodes and the state of one rendering), filters.py (the
filters and tests), values.py (limits, errors, provenance and template values), and
template.py (`Template`, which puts them together). Outside this folder only the
names below are used.
"""
from llmd.prompt.jinja.template import Template
from llmd.prompt.jinja.values import (TemplateError, TemplateRaised, TemplateRuntimeError,
                                      TemplateSyntaxError, data_text)

__all__ = ["Template", "TemplateError", "TemplateRaised", "TemplateRuntimeError", "TemplateSyntaxError", "data_text"]
