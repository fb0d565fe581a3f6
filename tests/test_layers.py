"""The package's folders are layers: each llmd/<layer>/__init__.py says on its line
"May import:" which other parts of llmd its modules may import. Every import of
every module (at the top, inside a function or under TYPE_CHECKING) is held to that
line, and no modules import each other in a loop.

Parts are the layer folders, the compiled engine (llmd._native, part of engine/), and
the modules at the package root: `errors` imports nothing of llmd, and the others
(cli, logs, __main__) are the entry layer, which may import anything."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "llmd"
ENTRY = {"llmd", "llmd.cli", "llmd.logs", "llmd.__main__"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
LAYERS = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def part(module: str) -> str:
    """The layer a module belongs to: llmd.<layer> for the folders, else the module."""
    if module == "llmd._native":
        return "llmd.engine"
    pieces = module.split(".")
    return ".".join(pieces[:2]) if len(pieces) > 2 or pieces[-1] in LAYERS else module


def allowed() -> dict[str, set[str]]:
    """Each layer's "May import:" line, read from its __init__ docstring."""
    rules = {}
    for layer in LAYERS:
        doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
        line = re.search(r"^May import: (.*)$", doc, re.M)
        assert line, f"llmd/{layer}/__init__.py says nothing of what it may import"
        named = set() if line.group(1).startswith("nothing") else {
            name.strip() for name in line.group(1).rstrip(".").split(",")}
        rules[f"llmd.{layer}"] = named | ({"llmd._native"} if layer == "engine" else set())
    rules["llmd.errors"] = set()
    return rules


def imports(module: str) -> set[str]:
    """The llmd modules `module` imports, wherever the import statement stands."""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from llmd.api import reply` imports the module llmd.api.reply
                name = f"{base}.{alias.name}"
                found.add(name if name in MODULES or name == "llmd._native" else base)
    return {m for m in found if m == "llmd" or m.startswith("llmd.")}


GRAPH = {module: imports(module) for module in MODULES}


def test_every_layer_is_a_known_part_and_its_rules_name_known_parts():
    rules = allowed()
    parts = set(rules) | {"llmd._native"}
    for layer, named in rules.items():
        assert named <= parts, f"{layer} may import {named - parts}, which are no parts of llmd"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if part(m) not in ENTRY))
def test_a_module_imports_only_its_own_layer_and_the_parts_it_may(module):
    rules, own = allowed(), part(module)
    assert own in rules, f"{module} belongs to no layer: put it in a folder or name it in tests/test_layers.py"
    wrong = sorted(m for m in GRAPH[module] if part(m) != own and part(m) not in rules[own]
                   and not (m == "llmd._native" and own == "llmd.engine"))
    assert not wrong, f"{module} ({own}) imports {wrong}; its layer may import {sorted(rules[own])}"


def test_no_layer_rules_run_in_a_loop():
    rules = allowed()
    state: dict[str, str] = {}

    def visit(layer: str, path: list[str]) -> None:
        state[layer] = "open"
        for below in rules.get(layer, ()):
            below = part(below)
            if below == layer:  # the engine's compiled module
                continue
            assert state.get(below) != "open", f"layers may import each other: {' -> '.join(path + [below])}"
            if below not in state:
                visit(below, path + [below])
        state[layer] = "done"

    for layer in rules:
        if layer not in state:
            visit(layer, [layer])


def test_no_modules_import_each_other_in_a_loop():
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for imported in sorted(GRAPH.get(module, ())):
            if imported not in MODULES:
                continue
            loop = path[path.index(imported):] + [imported] if imported in path else []
            assert not loop, f"import cycle: {' -> '.join(loop)}"
            if imported not in state:
                visit(imported, path + [imported])
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [module])
