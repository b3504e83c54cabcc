"""Seeded mutation fuzzing of the real profiles and jobs through validate's code path.

Thousands of mutants of the example, built-in and test profiles and jobs (lines
deleted, doubled, swapped, re-indented or cut; YAML syntax, tags, anchors,
aliases, odd scalars and escapes spliced in) go through `validate_files`, and
those that pass through loading, effective settings and rendering, as
`clusterkit validate` and `render` would. Each must come back as a list of
problems or a ClusterKitError: any other exception is a traceback a user would
see. Every problem must be one printable `FILE:LINE: message` line.

The seed is fixed, so a failure names its mutant and is reproduced by rerunning.
"""
from __future__ import annotations

import random
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from cluster_kit.config.effective import effective
from cluster_kit.config.load import is_job, load_job, load_profile, validate_files
from cluster_kit.config.search import SearchPath
from cluster_kit.config.yamlfile import load as load_yaml
from cluster_kit.errors import ClusterKitError
from cluster_kit.render.environment import render_script

REPO = Path(__file__).resolve().parents[3]
SOURCES = sorted([*REPO.glob("profiles/*.yaml"), *REPO.glob("examples/*.yaml"),
                  *REPO.glob("tests/data/config/*.yaml")])
MUTANTS = 3000
SEED = 20261203
CPU_BUDGET_S = 20  # about 6 s of CPU here; CPU time, so that a loaded machine does not fail it

SNIPPETS = [
    "[", "]", "{", "}", ":", ": ", "- ", "-", ",", "? ", "|", ">", "|-", '"', "'", "#", "\t", "  ",
    "&a ", "*a", "&b [*a, *a]", "<<: *a", "<<: [*a, *b]", "*undefined", "&a &a ",
    "!!int ", "!!float ", "!!bool ", "!!str ", "!!binary ", "!!timestamp ", "!!set ", "!!omap ",
    "!!map ", "!!seq ", "!!null ", "!!python/object:os.system ", "!custom ", "!!merge ",
    "~", "null", "true", "yes", "off", ".inf", "-.inf", ".nan", "0x", "0x_", "0o17", "010", "1_0",
    "1e999", "-0", "2024-13-45", "2024-02-30 25:61:61", "12:30:45", "1:2:3:4", "999999999999999999999",
    "\"\\u0000\"", "\"\\ud800\"", "\"\\e[31m\"", "\"\\x85\"", "\"\\U0010FFFF\"", "\"\\N\"", "\"\\_\"",
    "\"a\\\nb\"", "'it''s'", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "---\n", "...\n", "--- |\n",
    "\u00e9", "\u2028", "\u00a0", "\U0001F600", "\ufeff", "gpu[001-", "gpu[1-0]", "n[1-99999999]",
    "$(reboot)", "`id`", "\\", "%", "@", "*", "&", "!", "=", "{a: [b, {c: d}]}",
    "[[[[[[[[[[]]]]]]]]]]", "{a: 1, a: 2}", "? [a, b]\n: c", "? {a: b}\n: c",
]
VALUES = [
    "", "0", "-1", "65536", "1.5", "true", "null", "[]", "{}", "[1, 2]", "{a: b}", "\"\"",
    "gpu[001-064]", "n[1-65536]x[1-65536]", "a[1-65536],b[1-65536]", "x" * 300, "\"\\u0000\"", "!!binary aGVsbG8=", "2024-01-01", "04:00:00",
    "*a", "&a [1]", "\"a\\nb\"", "'$(id)'", "mlx5_0:1", "infiniband", "roce", "tcp", "srun",
    "torchrun", ">=2.18", "unlimited", "8M", "-8", "1e3", "0x10", ".inf",
]


def mutate(text: str, rng: random.Random) -> str:
    """One to three random edits of `text`."""
    for _ in range(rng.randint(1, 3)):
        lines = text.split("\n")
        i = rng.randrange(len(lines))
        op = rng.randrange(10)
        if op == 0 and len(lines) > 1:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[i])
        elif op == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == 3:
            lines[i] = " " * rng.choice([1, 2, 3, 4, 8]) + lines[i] if rng.random() < 0.5 else lines[i].lstrip()
        elif op == 4 and ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            lines[i] = f"{key}: {rng.choice(VALUES)}"
        elif op == 5:
            at = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:at] + rng.choice(SNIPPETS) + lines[i][at:]
        elif op == 6:
            at = rng.randint(0, len(lines[i]))
            char = chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0, 0x1f), rng.randint(0x80, 0x2fff),
                                   rng.randint(0x10000, 0x10ffff)]))
            lines[i] = lines[i][:at] + char + lines[i][at + 1:]
        elif op == 7:
            lines = lines[:i + 1]
            lines[-1] = lines[-1][:rng.randint(0, len(lines[-1]))]
        elif op == 8 and ":" in lines[i]:
            key, value = lines[i].split(":", 1)
            lines[i] = f"{key}: {rng.choice(['[', '{', '&a '])}{value.strip()}{rng.choice([']', '}', ''])}"
        else:
            lines.insert(i, rng.choice(SNIPPETS).rstrip("\n") + rng.choice(["", ": 1", ": x", ":"]))
        text = "\n".join(lines)
    return text


def exercise(path: Path, search: SearchPath, templates: list[Path]) -> str:
    """What `validate`, then `render` or `profiles show`, do with the file: "problems"
    or "clean"."""
    problems = validate_files([path], search)
    for line in problems:
        assert "\n" not in line and re.match(r"[^\n]+:[0-9]+: ", line), line
        line.encode("utf-8")  # printable on a UTF-8 terminal (no lone surrogates)
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", line), line  # no terminal controls
    if problems:
        return "problems"
    if is_job(load_yaml(path).data):
        job = load_job(path, search)
        render_script(effective(job), templates, job.data["template"])
    else:
        yaml.safe_dump(load_profile(str(path), search).data, sort_keys=False)
    return "clean"


def test_mutated_profiles_and_jobs_are_problems_never_crashes(tmp_path: Path) -> None:
    for source in SOURCES:
        shutil.copy(source, tmp_path / source.name)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train_ddp.py").write_text("print('hi')\n")
    search = SearchPath.from_environment([REPO / "tests" / "data" / "config"], environ={},
                                         cwd=tmp_path, home=tmp_path)
    templates = search.template_dirs()
    rng = random.Random(SEED)
    outcomes = {"problems": 0, "clean": 0, "refused": 0}
    start = time.process_time()
    for number in range(MUTANTS):
        source = rng.choice(SOURCES)
        text = mutate(source.read_text(encoding="utf-8"), rng)
        path = tmp_path / f"mutant-{source.stem}.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            outcomes[exercise(path, search, templates)] += 1
        except ClusterKitError:
            outcomes["refused"] += 1
        except Exception as exc:  # noqa: BLE001 - any other exception is the bug being hunted
            pytest.fail(f"mutant {number} of {source.name} raised {type(exc).__name__}: {exc}\n"
                        f"--- mutant ---\n{text}")
    took = time.process_time() - start
    assert took < CPU_BUDGET_S, f"{MUTANTS} mutants took {took:.1f} s of CPU"
    # the mutations must reach both sides: most broken, yet some still valid
    assert outcomes["problems"] > MUTANTS // 3 and outcomes["clean"] > MUTANTS // 20, outcomes
