"""What a YAML syntax error most likely means, in the words of the file's own lines.

PyYAML says where parsing stopped ("expected <block end>, but found '<block
mapping start>'"), not what is wrong. For the usual slips in hand-written
profiles and job files (a key indented by the wrong number of spaces, a tab, a
value holding `: `, an unclosed quote or bracket) `hint(text, line, problem)`
returns the fix naming the lines involved, or None when it has no better word.
Pure text in, text out.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_KEY_RE = re.compile(r"^\s*(?:-\s+)?([^\s:#'\"][^:#]*?|'[^']*'|\"[^\"]*\")\s*:(?:\s|$)")


@dataclass(frozen=True)
class Line:
    """One content line of the file: its number, indentation and text."""

    number: int
    indent: int
    text: str

    @property
    def key(self) -> str | None:
        """The mapping key the line starts (after a `- `), if it starts one."""
        match = _KEY_RE.match(self.text)
        return match.group(1) if match else None

    @property
    def has_value(self) -> bool:
        """True for `key: value` (a scalar after the colon), False for `key:` alone."""
        key = self.key
        if key is None:
            return False
        rest = self.text.split(":", 1)[1].split(" #", 1)[0].strip()
        return bool(rest) and rest[0] not in "|>&!"


def content_lines(text: str) -> list[Line]:
    """Lines that hold something: not blank, not only a comment, not `---`."""
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if stripped and not stripped.startswith("#") and stripped not in ("---", "..."):
            out.append(Line(number, len(raw) - len(raw.lstrip(" ")), raw))
    return out


def hint(text: str, line: int, problem: str) -> str | None:
    """The likely fix for a YAML error at `line` (1-based), or None."""
    lines = content_lines(text)
    here = next((item for item in lines if item.number == line), None)
    before = [item for item in lines if item.number < line]
    if "'\\t'" in problem:
        return (f"line {line} is indented with a tab; YAML indents with spaces only: "
                "replace the tab with spaces")
    if here is None:
        return _unclosed(problem, line)
    if "mapping values are not allowed" in problem:
        return _colon_in_value(here) or _deeper_than_a_value(here, before)
    if "expected <block end>" in problem:
        return _misaligned(here, before)
    return _unclosed(problem, line)


def _spaces(count: int) -> str:
    return "1 space" if count == 1 else f"{count} spaces"


def _shown(item: Line) -> str:
    return f"`{item.key}:`" if item.key else f"`{item.text.strip()}`"


def _colon_in_value(here: Line) -> str | None:
    """`key: a: b`: the value holds `: `, which YAML reads as another key."""
    if here.key is None:
        return None
    value = here.text.split(":", 1)[1].strip()
    if ": " in value and value[:1] not in "'\"{[":
        return (f"the value of `{here.key}:` on line {here.number} holds ': ', which YAML reads as "
                f"another key: quote it, e.g. {here.key}: \"{value}\"")
    return None


def _deeper_than_a_value(here: Line, before: list[Line]) -> str | None:
    """A key indented under a line that already has a scalar value."""
    if not before or here.indent <= before[-1].indent or not before[-1].has_value:
        return None
    above = before[-1]
    return (f"line {here.number} ({_shown(here)}) is indented {_spaces(here.indent)}, deeper than line "
            f"{above.number} ({_shown(above)}), which already has a value: indent it "
            f"{_spaces(above.indent)} to line up with {_shown(above)}")


def _open_blocks(before: list[Line]) -> list[Line]:
    """The lines that open the blocks still open after `before`, outermost first."""
    stack: list[Line] = []
    for item in before:
        while stack and stack[-1].indent >= item.indent:
            stack.pop()
        stack.append(item)
    return stack


def _misaligned(here: Line, before: list[Line]) -> str | None:
    """A line whose indentation matches no block it could belong to."""
    stack = _open_blocks(before)
    if not stack or any(item.indent == here.indent for item in stack):
        return None
    choices = [item for item in reversed(stack) if item.indent != here.indent][:2]
    options = " or ".join(f"{_spaces(item.indent)} like {_shown(item)} on line {item.number}" for item in choices)
    return (f"line {here.number} ({_shown(here)}) is indented {_spaces(here.indent)}, which lines up "
            f"with no key above it: indent it {options}")


def _unclosed(problem: str, line: int) -> str | None:
    if "quoted scalar" in problem or "end of stream" in problem:
        return "a quote is not closed: close it on the line where it opens"
    if "flow sequence" in problem or "flow mapping" in problem:
        return ("a [ or { is not closed: close it on its line, e.g. [a, b], or write one "
                "`- item` (or `key: value`) per line")
    if "could not find expected ':'" in problem:
        return (f"line {line} or the one before it is not `key: value`: add the colon, "
                "or close the quote it opens")
    return None
