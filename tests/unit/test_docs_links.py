"""The documentation stays walkable: README.md and every page under docs/.

- every relative link resolves to a file or folder of the checkout, and a
  `#anchor` into a Markdown file names one of its headings as GitHub slugs them;
- every `clusterkit ...` line of a code block names a command (and subcommand)
  of the click CLI;
- every script shown in code (`scripts/...`, `.ci/run`, `benchmarks/...`) exists.

The checkers are plain functions that return their findings, so that the last
tests can plant a broken link, a made-up command and a missing script and see
each one reported.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from cluster_kit.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
# The front door and the user guide: the pages a user follows from README.md.
GUIDE = [ROOT / "README.md", *sorted(DOCS.glob("guide-*.md")), DOCS / "index.md", DOCS / "dev-cluster.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
COMMAND_LINE = re.compile(r"^(?:\$\s+)?clusterkit(?:\s+(.*))?$")
SCRIPT_PATH = re.compile(r"(?<![\w./-])(scripts/[\w./-]*|\.ci/run\b|benchmarks/[\w./-]*)")
HELP_FLAGS = {"-h", "--help", "--version"}


def split_code(text: str) -> tuple[list[str], list[str]]:
    """The lines outside fenced code blocks, and the lines inside them."""
    prose: list[str] = []
    code: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        marker = FENCE.match(line)
        if marker and (fence is None or marker.group(1) == fence):
            fence = marker.group(1) if fence is None else None
            continue
        (prose if fence is None else code).append(line)
    return prose, code


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lower-cased, every
    character but letters, digits, '_', '-' and spaces dropped, spaces to '-'."""
    text = LINK.sub(lambda m: m.group(1), heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (a repeated slug
    gets -1, -2, ... as on GitHub) and explicit `<a name=...>` / `<a id=...>`."""
    prose, _ = split_code(md.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose:
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if not heading:
            continue
        slug = github_slug(heading.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_targets(md: Path) -> Iterator[str]:
    """The targets of the file's inline and reference links, outside code."""
    prose, _ = split_code(md.read_text(encoding="utf-8"))
    for line in prose:
        reference = REFERENCE_LINK.match(line)
        if reference:
            yield reference.group(1)
            continue
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            yield match.group(2)


def link_problems(md: Path) -> list[str]:
    """Relative links of `md` that name no file, or an anchor the target lacks."""
    problems: list[str] = []
    for target in link_targets(md):
        if SCHEME.match(target):
            continue  # http:, https:, mailto: ...
        path_part, _, anchor = target.partition("#")
        dest = (md.parent / path_part).resolve() if path_part else md
        if not dest.exists():
            problems.append(f"{md.name}: link to {target}: {path_part} does not exist")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{md.name}: link to {target}: no heading of {dest.name} has the anchor #{anchor}")
    return problems


def shown_commands(md: Path) -> Iterator[list[str]]:
    """The words after `clusterkit` of every command line in the file's code
    blocks, with its shell comment stripped."""
    _, code = split_code(md.read_text(encoding="utf-8"))
    for line in code:
        command = COMMAND_LINE.match(re.sub(r"(^|\s)#.*$", "", line).strip())
        if command:
            yield (command.group(1) or "").split()


def command_problem(words: list[str], group: click.Group) -> str | None:
    """Why `clusterkit WORDS...` names no command of `group`, or None when it does.

    Leading options of a group (and the value of one that takes a value) are
    skipped; options after the command are not checked."""
    path = ["clusterkit"]
    ctx = click.Context(group)
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("-"):
            option = next((p for p in group.params if isinstance(p, click.Option)
                           and word.split("=", 1)[0] in p.opts + p.secondary_opts), None)
            if option is None and word not in HELP_FLAGS:
                return f"{' '.join(path)} has no option {word}"
            takes_value = option is not None and not option.is_flag and not option.count and "=" not in word
            index += 2 if takes_value else 1
            continue
        command = group.get_command(ctx, word)
        if command is None:
            return f"{' '.join(path)} has no command {word!r} (it has: {', '.join(group.list_commands(ctx))})"
        path.append(word)
        if not isinstance(command, click.Group):
            return None
        group = command
        index += 1
    if any(word in HELP_FLAGS for word in words):
        return None
    return f"{' '.join(path)} needs a command (one of: {', '.join(group.list_commands(ctx))})"


def command_problems(md: Path, group: click.Group = cli) -> list[str]:
    """The command lines of `md`'s code blocks that name no command of `group`."""
    problems: list[str] = []
    for words in shown_commands(md):
        problem = command_problem(words, group)
        if problem:
            problems.append(f"{md.name}: `clusterkit {' '.join(words)}`: {problem}")
    return problems


def script_problems(md: Path, root: Path = ROOT) -> list[str]:
    """Script paths shown in code (code blocks and `code spans`) that do not exist."""
    prose, code = split_code(md.read_text(encoding="utf-8"))
    snippets = code + [span.group(2) for line in prose for span in CODE_SPAN.finditer(line)]
    problems: list[str] = []
    for snippet in snippets:
        for match in SCRIPT_PATH.finditer(snippet):
            shown = match.group(1).rstrip(".")
            if not (root / shown).exists():
                problems.append(f"{md.name}: {shown} does not exist")
    return problems


@pytest.mark.parametrize("md", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(md: Path) -> None:
    assert link_problems(md) == []


@pytest.mark.parametrize("md", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_exists_in_the_cli(md: Path) -> None:
    assert command_problems(md) == []


@pytest.mark.parametrize("md", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_shown_exists(md: Path) -> None:
    assert script_problems(md) == []


def test_the_readme_shows_commands_and_scripts() -> None:
    readme = ROOT / "README.md"
    commands = [words[0] for words in shown_commands(readme) if words]
    assert {"validate", "submit", "logs"} <= set(commands), commands
    assert "scripts/test" in readme.read_text(encoding="utf-8")


@pytest.mark.parametrize("md", GUIDE[1:], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_guide_page_links_back_to_the_readme(md: Path) -> None:
    assert "../README.md" in list(link_targets(md)), f"{md.name} has no link to ../README.md"


def test_every_guide_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in link_targets(ROOT / "README.md")}
    assert [md.name for md in GUIDE[1:] if md.resolve() not in linked] == []


@pytest.mark.parametrize(("heading", "slug"), [
    ("Jobs that keep training (`resilience:`)", "jobs-that-keep-training-resilience"),
    ("Trainer side: `cluster_kit.checkpoint`", "trainer-side-cluster_kitcheckpoint"),
    ("`preflight --json`", "preflight---json"),
    ("Inductor's kernels inside the graph (`compile=`)", "inductors-kernels-inside-the-graph-compile"),
    ("Limits on input files", "limits-on-input-files"),
])
def test_github_slug(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_the_checkers_report_what_is_planted(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Some section (`x`)\n", encoding="utf-8")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "demo").write_text("#!/bin/sh\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#some-section-x), [here](#page), [web](https://example.com/x.md),\n"
        "[gone](missing.md), [bad anchor](other.md#no-such-section), [`code`](#nowhere)\n"
        "`[not a link](in-code.md)` and `scripts/demo`, `scripts/nope`\n\n"
        "```sh\n"
        "clusterkit submit job.yaml --wait      # exists\n"
        "$ clusterkit profiles show roce-v2\n"
        "clusterkit --verbose status 42\n"
        "clusterkit bench --help\n"
        "clusterkit sumbit job.yaml             # a typo\n"
        "clusterkit profiles frobnicate\n"
        "clusterkit bench\n"
        "benchmarks/nothing.py --fast\n"
        "# clusterkit made-up in a comment\n"
        "[skipped](inside-a-code-block.md)\n"
        "```\n",
        encoding="utf-8")

    links = link_problems(page)
    assert len(links) == 3, links
    assert "missing.md does not exist" in links[0]
    assert "no heading of other.md has the anchor #no-such-section" in links[1]
    assert "no heading of page.md has the anchor #nowhere" in links[2]

    commands = command_problems(page)
    assert len(commands) == 3, commands
    assert "has no command 'sumbit'" in commands[0]
    assert "clusterkit profiles has no command 'frobnicate'" in commands[1]
    assert "clusterkit bench needs a command" in commands[2]

    assert script_problems(page, root=tmp_path) == [
        "page.md: benchmarks/nothing.py does not exist", "page.md: scripts/nope does not exist"]
