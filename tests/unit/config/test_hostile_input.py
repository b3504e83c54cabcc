"""Hostile files are bad input: exit 2, FILE:LINE where a line exists, fast, bounded memory.

Every command that reads a profile, job, template or baseline file is run as a
real `clusterkit` process under an address-space limit and a timeout, against
each hostile file: recursive aliases, an alias bomb, deep nesting, huge files,
FIFOs, directories, devices, unreadable files, binary junk, bad UTF-8, control
characters, over-long lines and duplicate keys. Each must exit 2 with the
file's name, its line and a fix, print no traceback, write nothing, and finish
within TIME_BOUND_S. No cluster is touched: every case is refused first.
"""
from __future__ import annotations

import os
import random
import resource
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cluster_kit.config.textfile import MAX_BYTES, MAX_LINE_CHARS
from cluster_kit.config.yamlfile import MAX_DEPTH, MAX_NODES

MEMORY_LIMIT = 256 * 1024 * 1024
# The broken tool hung (killed at 20 s) on several of these; a refusal takes ~0.3 s of
# CPU. CPU time is what is bounded, so that a loaded test machine does not fail it; the
# wall clock only has the subprocess timeout.
TIME_BOUND_S = 5.0
JOB = "profile: local-dev\nscript: train.py\nnodes: 1\n"


def clusterkit_argv() -> list[str]:
    script = Path(sys.executable).parent / "clusterkit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cluster_kit"]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(cwd: Path, *args: str, prefix: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERKIT_PATH", "CLUSTERKIT_PROFILE")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([*prefix, *clusterkit_argv(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False,
                          env={**env, "HOME": str(cwd)}, preexec_fn=_limit_memory)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return done, cpu


def refused(cwd: Path, *args: str, prefix: tuple[str, ...] = ()) -> str:
    """stderr of a command refused as bad input: exit 2, no traceback, nothing on stdout, fast."""
    done, took = run(cwd, *args, prefix=prefix)
    assert done.returncode == 2, (args, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout
    assert took < TIME_BOUND_S, f"{args} took {took:.1f} s of CPU"
    return done.stderr


# --------------------------------------------------------------------------- hostile files

def alias_bomb() -> str:
    """Ten levels of nine aliases each: 9**10 values once expanded (CVE-2019-11253's shape)."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, 10):
        prev, cur = chr(ord("a") + level - 1), chr(ord("a") + level)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def write_text(text: str) -> Callable[[Path], None]:
    return lambda path: path.write_text(text, encoding="utf-8")


def write_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_dir(path: Path) -> None:
    path.mkdir()


def make_device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def make_sparse(size: int) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        with open(path, "wb") as handle:
            handle.truncate(size)
    return make


def make_huge(path: Path) -> None:
    with open(path, "w", encoding="utf-8") as handle:  # 25 MB of real YAML, not a sparse file
        handle.write("name: x\nsetup:\n" + "  - echo hello\n" * (25_000_000 // 15))


JUNK = random.Random(12).randbytes(4096)

# name, how to make it, expected "NAME:LINE: problem" start (the name is the file's)
CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("recursive-alias", write_text("name: x\nnodes: &a [*a]\n"),
     ":2: alias *a is used inside the value it names (&a on line 2)"),
    ("recursive-map", write_text("name: x\nslurm: &s\n  extra: *s\n"),
     ":3: alias *s is used inside the value it names"),
    ("alias-bomb", write_text(alias_bomb()), f":5: the file expands to more than {MAX_NODES:,} keys"),
    ("merge-bomb", write_text("a: &a {k0: 1, k1: 2, k2: 3}\n"
                              + "".join(f"m{i}: {{<<: *a, x: [*a, *a, *a]}}\n" for i in range(2000))),
     ":607: the file expands to more than 20,000 keys"),
    ("nested-one-line", write_text("x: " + "[" * 20_000 + "]" * 20_000 + "\n"),
     f":1: line is 40,003 characters long; lines are limited to {MAX_LINE_CHARS:,}"),
    ("nested-lines", write_text("x:\n" + "  [\n" * 20_000 + "  ]\n" * 20_000),
     f":{MAX_DEPTH + 1}: nested more than {MAX_DEPTH} levels deep"),
    ("nested-blocks", write_text("".join(" " * i + f"k{i}:\n" for i in range(200))),
     f":{MAX_DEPTH}: nested more than {MAX_DEPTH} levels deep"),
    ("huge", make_huge, ":1: is 23.8 MiB (25,000,005 bytes); profile and job files are limited to 1 MiB"),
    ("fifo", make_fifo, ":1: is a named pipe (FIFO), not a regular file"),
    ("directory", make_dir, ":1: is a directory, not a regular file"),
    ("device", make_device, ":1: is a character device, not a regular file"),
    ("junk", write_bytes(JUNK), ":1: not UTF-8 text (byte 0x"),
    ("latin1", write_bytes(b"name: x\nslurm:\n  partition: gr\xfcn\n"), ":3: not UTF-8 text (byte 0xfc"),
    ("long-line", write_text("name: x\nsetup: [" + "a" * 20_000 + "]\n"),
     ":2: line is 20,009 characters long"),
    ("escape-codes", write_text("name: x\nslurm:\n  partition: gpu\x1b[2J\n"),
     ":3: control character U+001B in column 17"),
    ("nul", write_bytes(b"name: x\n\n\nnodes: n1\x00\n"), ":4: control character U+0000 in column 10"),
    ("duplicate", write_text("name: x\nslurm:\n  partition: a\n  qos: b\n  partition: c\n"),
     ":5: duplicate key 'partition' (first defined on line 3)"),
    ("bad-int-tag", write_text("name: x\nslurm:\n  cpus_per_task: !!int eight\n"),
     ":3: cannot read 'eight' as int"),
    ("bad-date", write_text("name: x\nextends: 2024-13-45\n"),
     ":2: cannot read '2024-13-45' as timestamp: month must be in 1..12"),
    ("python-tag", write_text("name: x\nnodes: !!python/object/apply:os.system [id]\n"),
     ":2: could not determine a constructor for the tag"),
]


def _case_file(tmp_path: Path, name: str, make: Callable[[Path], None]) -> Path:
    path = tmp_path / f"{name}.yaml"
    make(path)
    return path


def _commands(file: str) -> dict[str, list[str]]:
    """Every command that reads the file as a profile or job."""
    return {
        "validate": ["validate", file],
        "render": ["render", file, "-o", "out.sbatch"],
        "submit": ["submit", "--dry-run", file],
        "preflight": ["preflight", "--profile", f"./{file}"],
        # a bad --max-bytes stops it before sbatch should the file ever be accepted
        "bench": ["bench", "allreduce", file, "--max-bytes", "lots"],
    }


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path


@pytest.mark.parametrize("command", ["validate", "render", "submit", "preflight", "bench"])
@pytest.mark.parametrize(("name", "make", "tail"), CASES, ids=[c[0] for c in CASES])
def test_hostile_file_exits_2_naming_file_and_line(folder: Path, name: str,
                                                    make: Callable[[Path], None], tail: str,
                                                    command: str) -> None:
    _case_file(folder, name, make)
    err = refused(folder, *_commands(f"{name}.yaml")[command])
    first = err.splitlines()[0]
    expected = f"{name}.yaml{tail}"
    assert first.startswith(expected), err
    assert "; " in first[len(expected):], err  # the fix follows the problem
    assert not (folder / "out.sbatch").exists()


def test_validate_reports_every_hostile_file_at_once(folder: Path) -> None:
    names = [name for name, make, _ in CASES if name != "huge"]
    for name, make, _ in CASES:
        if name in names:
            _case_file(folder, name, make)
    err = refused(folder, "validate", *[f"{name}.yaml" for name in names])
    assert [line.split(":", 1)[0] for line in err.splitlines()] == [f"{n}.yaml" for n in names]


def test_a_job_naming_a_hostile_profile_names_the_profile(folder: Path) -> None:
    (folder / "bomb.yaml").write_text(alias_bomb())
    (folder / "job.yaml").write_text(JOB.replace("local-dev", "./bomb.yaml"))
    for args in (["validate", "job.yaml"], ["render", "job.yaml"], ["submit", "--dry-run", "job.yaml"]):
        err = refused(folder, *args)
        assert err.startswith("bomb.yaml:5: the file expands to more than"), err


def test_a_hostlist_of_billions_of_hosts_is_refused_before_it_is_built(folder: Path) -> None:
    (folder / "wide.yaml").write_text("name: x\nnodes: n[1-65536]x[1-65536]\n")
    (folder / "job.yaml").write_text(JOB.replace("local-dev", "./wide.yaml"))
    for args in (["validate", "wide.yaml"], ["preflight", "--profile", "./wide.yaml"],
                 ["render", "job.yaml"], ["submit", "--dry-run", "job.yaml"]):
        err = refused(folder, *args)
        assert err.startswith("wide.yaml:2: nodes: 'n[1-65536]x[1-65536]' is not a Slurm hostlist "
                              "(invalid hostlist 'n[1-65536]x[1-65536]': it names more than 65536 hosts)"), err


def test_file_size_limit_is_stated_and_exact(folder: Path) -> None:
    line = "#" + "x" * (MAX_LINE_CHARS - 2) + "\n"
    text = "name: x\n" + line * ((MAX_BYTES - 8) // len(line))
    (folder / "fits.yaml").write_text(text + "#" * (MAX_BYTES - len(text) - 1) + "\n")
    assert (folder / "fits.yaml").stat().st_size == MAX_BYTES
    done, _took = run(folder, "validate", "fits.yaml")
    assert done.returncode == 0, done.stderr
    with open(folder / "fits.yaml", "a") as handle:
        handle.write("\n")
    assert refused(folder, "validate", "fits.yaml").startswith(
        "fits.yaml:1: is 1.0 MiB (1,048,577 bytes); profile and job files are limited to 1 MiB; ")


def test_a_1_mib_file_of_the_worst_allowed_content_is_read_in_seconds(folder: Path) -> None:
    """Under every limit, yet as slow as a profile can be: a megabyte of lines."""
    (folder / "big.yaml").write_text("name: big\n" + "#\n" * (MAX_BYTES // 2 - 10))
    (folder / "long.yaml").write_text("name: long\n" + ("#" + "x" * (MAX_LINE_CHARS - 1) + "\n") * 100)
    for name in ("big.yaml", "long.yaml"):
        done, took = run(folder, "validate", name)
        assert done.returncode == 0 and took < TIME_BOUND_S, (done.stderr, took)


def without_root_override() -> tuple[str, ...]:
    """A command prefix under which file modes bind: as root, drop the two capabilities
    that let root read any file (as `setpriv` does); for other users, nothing."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: every file is readable")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.parametrize("command", ["validate", "render", "submit", "preflight"])
def test_unreadable_file_exits_2_with_the_fix(folder: Path, command: str) -> None:
    path = folder / "secret.yaml"
    path.write_text(JOB)
    path.chmod(0)
    err = refused(folder, *_commands("secret.yaml")[command], prefix=without_root_override())
    assert "secret.yaml:1: cannot read: permission denied" in err, err
    assert "make it readable for this user (ls -l secret.yaml)" in err
    assert stat.S_IMODE(path.stat().st_mode) == 0


# --------------------------------------------------------------------------- templates

TEMPLATE_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("fifo", make_fifo, ":1: is a named pipe (FIFO), not a regular file"),
    ("device", make_device, ":1: is a character device"),
    ("junk", write_bytes(JUNK), ":1: not UTF-8 text"),
    ("escape", write_text("#!/bin/bash\n\necho \x1b[31m\n"), ":3: control character U+001B"),
    ("huge", make_sparse(30_000_000), ":1: is 28.6 MiB (30,000,000 bytes); templates are limited to 1 MiB"),
    ("long-line", write_text("#!/bin/bash\necho " + "x" * 12_000 + "\n"), ":2: line is 12,005"),
]


@pytest.mark.parametrize("command", ["render", "render-stdout", "submit"])
@pytest.mark.parametrize(("name", "make", "tail"), TEMPLATE_CASES, ids=[c[0] for c in TEMPLATE_CASES])
def test_hostile_template_exits_2_naming_it(folder: Path, name: str, make: Callable[[Path], None],
                                            tail: str, command: str) -> None:
    make(folder / f"{name}.j2")
    (folder / "job.yaml").write_text(JOB + f"template: ./{name}.j2\n")
    args = {"render": ["render", "job.yaml", "-o", "out.sbatch"],
            "submit": ["submit", "--dry-run", "job.yaml"],
            "render-stdout": ["render", "job.yaml"]}[command]
    err = refused(folder, *args)
    assert f"{name}.j2{tail}" in err.splitlines()[0], err
    assert "fix:" in err
    assert not (folder / "out.sbatch").exists()


def test_deeply_nested_template_expression_exits_2(folder: Path) -> None:
    (folder / "deep.j2").write_text("{{ " + "(\n" * 20_000 + "1" + ")\n" * 20_000 + "}}\n")
    (folder / "job.yaml").write_text(JOB + "template: ./deep.j2\n")
    err = refused(folder, "render", "job.yaml")
    assert "deep.j2" in err, err


# --------------------------------------------------------------------------- baselines

BASELINE_CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("fifo", make_fifo, ":1: is a named pipe (FIFO)"),
    ("directory", make_dir, ":1: is a directory"),
    ("device", make_device, ":1: is a character device"),
    ("junk", write_bytes(JUNK), ":1: not UTF-8 text"),
    ("huge", make_sparse(70 * 1024 * 1024), ":1: is 70 MiB (73,400,320 bytes); baselines are limited to 64 MiB"),
    ("nested", write_text("[" * 100_000), ":1: not a baseline: nested too deeply"),
    ("not-json", write_text('{\n "format": "clusterkit-audit-baseline",\n "version": 1,\n nodes\n}\n'),
     ":4: not a JSON baseline: Expecting property name enclosed in double quotes"),
    ("control", write_text('{\n "format": "clusterkit-audit-baseline\x07"\n}\n'), ":2: control character U+0007"),
    ("bad-nodes", write_text('{"format": "clusterkit-audit-baseline", "version": 1, "nodes": {"n1": 5}}'),
     ": node 'n1' of the baseline is not a map of fact names to text values"),
    ("bad-facts", write_text('{"format": "clusterkit-audit-baseline", "version": 1,'
                             ' "nodes": {"n1": {"gpu.count": [1, 2]}}}'),
     ": node 'n1' of the baseline is not a map"),
]


@pytest.mark.parametrize(("name", "make", "tail"), BASELINE_CASES, ids=[c[0] for c in BASELINE_CASES])
def test_hostile_baseline_exits_2_naming_it(folder: Path, name: str, make: Callable[[Path], None],
                                            tail: str) -> None:
    make(folder / f"{name}.json")
    err = refused(folder, "audit", "--profile", "local-dev", "--baseline", f"{name}.json",
                  "--save-baseline", "saved.json", "-o", "out.html", "--format", "html")
    assert f"{name}.json{tail}" in err.splitlines()[0], err
    assert "fix:" in err
    assert not (folder / "saved.json").exists() and not (folder / "out.html").exists()


# --------------------------------------------------------------------------- in-process

def test_yaml_syntax_errors_print_their_fix_in_validate(folder: Path) -> None:
    (folder / "bad.yaml").write_text("name: x\nslurm:\n  partition: [gpu\n  qos: high\n")
    (folder / "empty.yaml").write_text("# nothing\n")
    err = refused(folder, "validate", "bad.yaml", "empty.yaml")
    assert err.splitlines() == [
        ("bad.yaml:4: expected ',' or ']', but got ':' (while parsing a flow sequence started on "
         "line 3); a [ or { is not closed: close it on its line, e.g. [a, b], or write one "
         "`- item` (or `key: value`) per line"),
        "empty.yaml:1: the file is empty; write a mapping of keys, e.g. `name: mycluster`"]


@pytest.mark.parametrize(("data", "line"), [
    (b"a: 1\r\nb: 2\r\nc: \x01\r\n", 3),  # Windows line ends
    (b"a: 1\rb: 2\rc: \x01\r", 3),        # old Mac line ends, which YAML counts too
    (b"a: 1\n\n\n\nb: \x7f\n", 5),
])
def test_lines_are_counted_as_yaml_counts_them(tmp_path: Path, data: bytes, line: int) -> None:
    from cluster_kit.config.textfile import TextFileError, read_text_file

    (tmp_path / "f.yaml").write_bytes(data)
    with pytest.raises(TextFileError) as caught:
        read_text_file(tmp_path / "f.yaml")
    assert caught.value.line == line and "control character" in caught.value.problem


def test_a_fifo_with_a_writer_is_refused_too(tmp_path: Path) -> None:
    """A FIFO someone writes into is still not a regular file: refused, not read."""
    from cluster_kit.config.textfile import TextFileError, read_text_file

    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # keeps it open for writing
    try:
        os.write(writer, b"name: x\n")
        with pytest.raises(TextFileError, match="named pipe"):
            read_text_file(fifo)
    finally:
        os.close(writer)


def test_the_user_guide_states_the_limits_the_code_enforces() -> None:
    from cluster_kit.commands.audit import BASELINE_MAX_BYTES
    from cluster_kit.config.textfile import size_text
    from cluster_kit.hostlist import MAX_HOSTS

    guide = (Path(__file__).resolve().parents[3] / "docs" / "guide-submitting.md").read_text()
    section = guide.split("### Limits on input files", 1)[1].split("\n#", 1)[0]
    section = " ".join(section.split())
    for stated in (f"at most {size_text(MAX_BYTES)} of UTF-8", f"longer than {MAX_LINE_CHARS:,} characters",
                   f"up to {size_text(BASELINE_MAX_BYTES)}", f"at most {MAX_DEPTH} levels",
                   f"at most {MAX_NODES:,} keys and values", f"names at most {MAX_HOSTS} hosts"):
        assert stated in section, stated


@pytest.mark.parametrize(("name", "make", "tail"), [
    ("fifo", make_fifo, ":1: is a named pipe (FIFO), not a regular file"),
    ("device", make_device, ":1: is a character device, not a regular file"),
    ("huge", make_sparse(30_000_000), ":1: is 28.6 MiB (30,000,000 bytes); ssh_config files are limited"),
], ids=["fifo", "device", "huge"])
def test_a_hostile_ssh_config_file_is_refused_before_any_connection(
        folder: Path, name: str, make: Callable[[Path], None], tail: str) -> None:
    make(folder / f"{name}.conf")
    (folder / "p.yaml").write_text(f"name: p\nextends: local-dev\nssh:\n  config_file: ./{name}.conf\n")
    err = refused(folder, "preflight", "--profile", "./p.yaml", "--nodes", "n1")
    assert f"{name}.conf{tail}" in err, err
