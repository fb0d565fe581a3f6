"""Template source -> tokens: text, `{{ }}` / `{% %}` tags with their whitespace control
(trim_blocks, lstrip_blocks, `-` and `+`), comments and raw blocks."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from typing import Any

from llmd.prompt.jinja.values import TemplateSyntaxError


_TAG_START = re.compile(r"\{([{%#])([-+]?)")
_RAW_BEGIN = re.compile(r"\{%[-+]?\s*raw\s*(?:-%\}\s*|%\})")
_RAW_END = re.compile(r"(.*?)\{%([-+]?)\s*endraw\s*(?:\+%\}|-%\}\s*|%\}\n?)", re.S)
_COMMENT_END = re.compile(r"(.*?)(\+#\}|-#\}\s*|#\}\n?)", re.S)
_BLOCK_END = re.compile(r"\+%\}|-%\}\s*|%\}\n?")
_VAR_END = re.compile(r"-\}\}\s*|\}\}")
_SPACE = re.compile(r"\s+")
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_STRING = re.compile(r"'([^'\\]*(?:\\.[^'\\]*)*)'|\"([^\"\\]*(?:\\.[^\"\\]*)*)\"", re.S)
_FLOAT = re.compile(r"(?<!\.)\d+(?:_\d+)*(?:\.\d+(?:_\d+)*(?:[eE][+-]?\d+(?:_\d+)*)?|[eE][+-]?\d+(?:_\d+)*)")
_INTEGER = re.compile(r"0[bB](?:_?[01])+|0[oO](?:_?[0-7])+|0[xX](?:_?[\da-fA-F])+|[1-9](?:_?\d)*|0(?:_?0)*")
_OPERATORS = ("//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(", ")",
              "{", "}", ">", "<", "=", ".", ":", "|", ",", ";")


@dataclass
class _Tok:
    kind: str   # data, var_begin, var_end, block_begin, block_end, name, string, int, float, op, eof
    value: Any
    line: int


def _strip_before_tag(text: str, sign: str, lstrip: bool, line_starting: bool) -> str:
    """Text before a tag after whitespace control: `-` strips all trailing whitespace;
    otherwise, for block tags and comments (lstrip), spaces from the line's start."""
    if sign == "-":
        return text.rstrip()
    if sign != "+" and lstrip:
        l_pos = text.rfind("\n") + 1
        if (l_pos > 0 or line_starting) and _SPACE.fullmatch(text, l_pos):
            return text[:l_pos]
    return text


def _lex(source: str) -> list[_Tok]:
    lines = re.split(r"\r\n|\r|\n", source)
    if lines[-1] == "":
        lines.pop()  # Jinja drops one trailing newline
    source = "\n".join(lines)
    toks: list[_Tok] = []
    pos, line, line_starting = 0, 1, True
    while pos < len(source):
        m = _TAG_START.search(source, pos)
        text = source[pos:m.start()] if m else source[pos:]
        if not m:
            toks.append(_Tok("data", text, line))
            break
        kind, sign = m.group(1), m.group(2)
        text = _strip_before_tag(text, sign, kind != "{", line_starting)
        if text:
            toks.append(_Tok("data", text, line))
        if kind == "%" and (raw := _RAW_BEGIN.match(source, m.start())):
            # {% raw %}...{% endraw %}: the text between is data, tags and all
            end = _RAW_END.match(source, raw.end())
            if not end:
                raise TemplateSyntaxError("{% raw %} is not closed with {% endraw %}", line)
            body = _strip_before_tag(end.group(1), end.group(2), True, raw.group(0).endswith("\n"))
            line += source.count("\n", pos, raw.end())
            if body:
                toks.append(_Tok("data", body, line))
            line += source.count("\n", raw.end(), end.end())
            pos = end.end()
            line_starting = end.group(0).endswith("\n")
            continue
        line += source.count("\n", pos, m.end())
        pos = m.end()
        if kind == "#":
            end = _COMMENT_END.match(source, pos)
            if not end:
                raise TemplateSyntaxError("comment is not closed with #}", line)
            line += end.group(0).count("\n")
            pos = end.end()
            line_starting = end.group(0).endswith("\n")
            continue
        toks.append(_Tok("var_begin" if kind == "{" else "block_begin", None, line))
        pos, line, last = _lex_tag(source, pos, line, kind, toks)
        line_starting = last.endswith("\n")
    toks.append(_Tok("eof", None, line))
    return toks


def _lex_tag(source: str, pos: int, line: int, kind: str, toks: list[_Tok]) -> tuple[int, int, str]:
    end_re = _VAR_END if kind == "{" else _BLOCK_END
    depth = 0
    start_line = line
    while True:
        space = _SPACE.match(source, pos)
        if space:
            line += space.group(0).count("\n")
            pos = space.end()
        if pos >= len(source):
            raise TemplateSyntaxError("tag is not closed with " + ("}}" if kind == "{" else "%}"), start_line)
        end = end_re.match(source, pos) if depth == 0 else None
        if end:
            toks.append(_Tok("var_end" if kind == "{" else "block_end", None, line))
            line += end.group(0).count("\n")
            return end.end(), line, end.group(0)
        if m := _NAME.match(source, pos):
            toks.append(_Tok("name", m.group(0), line))
        elif m := _STRING.match(source, pos):
            body = m.group(1) if m.group(1) is not None else m.group(2)
            value = codecs.decode(body.encode("ascii", "backslashreplace"), "unicode-escape")
            toks.append(_Tok("string", value, line))
            line += m.group(0).count("\n")
        elif m := _FLOAT.match(source, pos):
            toks.append(_Tok("float", float(m.group(0).replace("_", "")), line))
        elif m := _INTEGER.match(source, pos):
            toks.append(_Tok("int", int(m.group(0).replace("_", ""), 0), line))
        else:
            op = next((o for o in _OPERATORS if source.startswith(o, pos)), None)
            if op is None:
                raise TemplateSyntaxError(f"unexpected character {source[pos]!r}", line)
            depth += op in "([{"
            depth -= op in ")]}" and depth > 0
            toks.append(_Tok("op", op, line))
            pos += len(op)
            continue
        pos = m.end()
