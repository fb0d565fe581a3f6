"""docs/configuration.md lists exactly the flags `python -m llmd COMMAND --help` prints.

The page has one section per command, headed "## `python -m llmd COMMAND`", whose table
rows name each flag in backquotes and the LLMD_* variable it reads. The flags are read
from the `--help` output of a subprocess, not from llmd's modules, so the test holds
wherever the argument parser lives.
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMANDS = ("serve", "pull", "tokenize", "perplexity", "bench", "quantize")


def help_text(*args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "llmd", *args, "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def help_flags(text: str) -> dict[str, str]:
    """{flag: its environment variable} from the options section of a --help text."""
    options = text.split("options:", 1)[1]
    # An entry is its option strings, then its help; an entry's variable is the next
    # "[env ...]" after it (argparse wraps the help, so it may be lines further down).
    entries = re.split(r"\n  (?=-)", "\n" + options)
    flags = {}
    for entry in entries:
        signature = re.split(r"\s{2,}|\n", entry.strip(), maxsplit=1)[0]
        names = [f for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", signature) if f != "--help"]
        env = re.search(r"\[env\s+(LLMD_[A-Z0-9_]+)\]", entry)
        for name in names:
            flags[name] = env.group(1) if env else ""
    return flags


def page_sections() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8")
    parts = re.split(r"^## `python -m llmd (\w+)`.*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def page_flags(section: str) -> set[str]:
    """The flags named in the first cell of the section's table rows."""
    flags = set()
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            first = line.split("|")[1]
            flags.update(re.findall(r"`(--[a-z][a-z0-9-]*)", first))
    return flags


def test_the_page_has_a_section_for_every_command():
    assert set(page_sections()) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_of_a_command_is_on_the_page_and_nothing_else(command):
    documented = help_flags(help_text(command))
    section = page_sections()[command]
    on_page = page_flags(section)
    assert sorted(set(documented) - on_page) == [], f"flags of `{command}` missing from {PAGE.name}"
    assert sorted(on_page - set(documented)) == [], f"flags on {PAGE.name} that `{command}` does not have"
    for flag, variable in documented.items():
        assert variable, f"{command} {flag} names no environment variable in --help"
        row = next(line for line in section.splitlines()
                   if line.startswith("|") and re.search(f"`{re.escape(flag)}[ `]", line.split("|")[1]))
        assert f"`{variable}`" in row, f"{command} {flag}: its row does not name {variable}"


def test_python_m_llmd_help_is_the_serve_help():
    assert help_flags(help_text()) == help_flags(help_text("serve"))


def test_every_quantize_type_is_on_the_page():
    types = re.search(r"one of ([A-Z0-9_, \n]+)", help_text("quantize")).group(1)
    section = page_sections()["quantize"]
    for name in re.findall(r"[A-Z0-9_]+", types):
        assert f"`{name}`" in section, name

