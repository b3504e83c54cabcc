"""yamlhints: the fix for the usual YAML slips, fed the real text and PyYAML's own error."""
from __future__ import annotations

from pathlib import Path

import pytest

from cluster_kit.config.yamlfile import YamlError, loads
from cluster_kit.config.yamlhints import hint


def error_of(text: str) -> YamlError:
    """The YamlError our loader raises for `text`."""
    with pytest.raises(YamlError) as caught:
        loads(text, Path("job.yaml"))
    return caught.value


JOB = "name: x\nprofile: local-dev\nscript: t.py\n"


def test_a_key_between_two_indentation_levels_names_both() -> None:
    exc = error_of(JOB + "slurm:\n    partition: debug\n  time: \"00:01:00\"\n")
    assert exc.line == 6 and exc.problem.startswith("expected <block end>, but found '<block mapping start>'")
    assert exc.fix == ("line 6 (`time:`) is indented 2 spaces, which lines up with no key above it: indent it "
                       "4 spaces like `partition:` on line 5 or 0 spaces like `slurm:` on line 4")


def test_a_key_indented_under_a_value_says_to_line_it_up() -> None:
    exc = error_of(JOB + "slurm:\n  partition: debug\n   time: \"00:01:00\"\n")
    assert (exc.line, exc.problem) == (6, "mapping values are not allowed here")
    assert exc.fix == ("line 6 (`time:`) is indented 3 spaces, deeper than line 5 (`partition:`), which "
                       "already has a value: indent it 2 spaces to line up with `partition:`")


def test_a_top_level_key_indented_by_one_space() -> None:
    exc = error_of(JOB + " env: {A: '1'}\n")
    assert exc.line == 4
    assert exc.fix == ("line 4 (`env:`) is indented 1 space, deeper than line 3 (`script:`), which "
                       "already has a value: indent it 0 spaces to line up with `script:`")


def test_a_value_holding_colon_space_is_to_be_quoted() -> None:
    exc = error_of(JOB + "env:\n  NOTE: see: here\n")
    assert exc.fix == ("the value of `NOTE:` on line 5 holds ': ', which YAML reads as another key: "
                       'quote it, e.g. NOTE: "see: here"')


def test_a_tab_is_named() -> None:
    exc = error_of("name: x\n\tscript: t.py\n")
    assert exc.line == 2 and "tab" in (exc.fix or "") and "spaces" in (exc.fix or "")


def test_unclosed_quote_and_bracket() -> None:
    assert "quote is not closed" in (error_of('name: "x\nscript: t.py\n').fix or "")
    assert "[ or { is not closed" in (error_of("slurm:\n  partition: [gpu\n  time: 1\n").fix or "")


def test_no_hint_for_a_line_it_cannot_place() -> None:
    assert hint("a: 1\n", 9, "expected <block end>, but found '<block mapping start>'") is None
    assert hint("a: 1\nb: 2\n", 2, "expected <block end>, but found '<scalar>'") is None
