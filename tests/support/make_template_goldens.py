"""Writes tests/data/template_goldens.json: every chat template in llama.cpp's
models/templates/ rendered by Jinja2 for each conversation in tests/support/template_cases.py.

Run from the repository root with a Python that has jinja2 (not a dependency of llmd):
    python3 -m tests.reference_data && python3 -m tests.support.make_template_goldens
The environment is the one transformers gives chat templates (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps with ensure_ascii False,
raise_exception, strftime_now, the {% generation %} block). For each rendering the file
keeps its sha256 and length, or the error Jinja2 raised; tests/prompt/test_jinja.py renders the
same with llmd.prompt.jinja and compares.
"""
from __future__ import annotations

import copy
import hashlib
import json
import pathlib
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tests.reference_data import reference_dir
from tests.support.template_cases import CONVERSATIONS, NOW, variables

OUT = pathlib.Path(__file__).parents[1] / "data" / "template_goldens.json"


class Generation(Extension):
    """transformers' {% generation %} block, minus its bookkeeping: renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def render_all(template_dir: pathlib.Path) -> dict:
    env = environment()
    out: dict = {"_about": __doc__.split("\n\n")[0].replace("\n", " "), "jinja2": jinja2.__version__,
                 "templates": {}}
    for path in sorted(template_dir.glob("*.jinja")):
        source = path.read_text("utf-8")
        entry = {"source_sha256": hashlib.sha256(source.encode()).hexdigest(), "renderings": {}}
        try:
            compiled = env.from_string(source)
        except jinja2.TemplateError as exc:
            compiled, compile_error = None, f"{type(exc).__name__}: {exc}"
        for name, case in CONVERSATIONS.items():
            if compiled is None:
                entry["renderings"][name] = {"raises": compile_error}
                continue
            try:
                text = compiled.render(**copy.deepcopy(variables(case)))
            except Exception as exc:  # what Jinja2 refuses is a golden fact too
                entry["renderings"][name] = {"raises": f"{type(exc).__name__}: {exc}"}
                continue
            data = text.encode("utf-8")
            entry["renderings"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "length": len(text)}
        out["templates"][path.name] = entry
    return out


def main() -> int:
    template_dir = reference_dir() / "models" / "templates"
    if not template_dir.is_dir():
        print(f"{template_dir} is missing: run `python3 -m tests.reference_data` first", file=sys.stderr)
        return 1
    goldens = render_all(template_dir)
    OUT.write_text(json.dumps(goldens, indent=1, ensure_ascii=False, sort_keys=True) + "\n", "utf-8")
    counts = [r for t in goldens["templates"].values() for r in t["renderings"].values()]
    print(f"{len(goldens['templates'])} templates, {len(counts)} renderings, "
          f"{sum('raises' in r for r in counts)} raise in Jinja2 -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
