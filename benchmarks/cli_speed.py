"""CLI start-up: wall time of clusterkit commands against `python -c pass` (the same
interpreter) and `sbatch --version`, and what the render path imports.

    .venv/bin/python benchmarks/cli_speed.py [--runs 15]

Each command runs `--runs` times after one warm-up run, round-robin (one run of
each command in turn), so that load from other processes spreads evenly over
them; the figure is the median wall time, with min and max. Commands run as a user
runs them: the `clusterkit` script of this interpreter's environment, from the
repository root, with bytecode caches written (the warm-up writes them). Two
extra rows show render without caches: cluster_kit's modules not byte-compiled
(an editable install run with PYTHONDONTWRITEBYTECODE=1, as on this dev box), and no
module byte-compiled at all, stdlib included (the worst case).

Then `python -X importtime` of `clusterkit render` lists the slowest imports and
checks that no heavy module (paramiko, torch, ...) is on the render path.
Exit status 1 when render's median is 0.5 s or more or a heavy module is imported.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sshbench import clusterkit_argv

ROOT = Path(__file__).resolve().parent.parent
RENDER_LIMIT_S = 0.5
HEAVY = ("paramiko", "cryptography", "nacl", "bcrypt", "invoke", "torch", "numpy")
JOB = "examples/cpu-ddp.yaml"


def commands() -> dict[str, list[str]]:
    ck = clusterkit_argv()
    profiles = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "profiles").glob("*.yaml"))
    table = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "clusterkit --help": [*ck, "--help"],
        f"clusterkit render {JOB}": [*ck, "render", JOB],
        "clusterkit validate profiles/*.yaml": [*ck, "validate", *profiles],
    }
    if shutil.which("sbatch"):
        table["sbatch --version"] = ["sbatch", "--version"]
    return table


def time_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return elapsed


def uncached_envs(env: dict[str, str], render: list[str], scratch: Path) -> dict[str, dict[str, str]]:
    """Environments whose bytecode caches lack cluster_kit, or lack everything.

    Both keep their caches under PYTHONPYCACHEPREFIX in `scratch` and write none.
    The first is filled by one render run, then cluster_kit's part is removed.
    """
    ours, none = scratch / "all-but-cluster_kit", scratch / "empty"
    none.mkdir()
    subprocess.run(render, cwd=ROOT, env=dict(env, PYTHONPYCACHEPREFIX=str(ours)),
                   stdout=subprocess.DEVNULL, check=True)
    shutil.rmtree(ours / ROOT.relative_to(ROOT.anchor) / "cluster_kit")
    return {
        f"clusterkit render {JOB} (cluster_kit not compiled)":
            dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(ours)),
        f"clusterkit render {JOB} (nothing compiled)":
            dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=str(none)),
    }


def time_all(table: dict[str, list[str]], runs: int, env: dict[str, str],
             cold: dict[str, dict[str, str]]) -> dict[str, list[float]]:
    """Wall times of every command, round-robin; the uncached render rows too."""
    times: dict[str, list[float]] = {name: [] for name in [*table, *cold]}
    for argv in table.values():  # warm-up: page cache and bytecode caches
        time_once(argv, env)
    render = table[f"clusterkit render {JOB}"]
    for _ in range(runs):
        for name, argv in table.items():
            times[name].append(time_once(argv, env))
        for name, cold_env in cold.items():
            times[name].append(time_once(render, cold_env))
    return times


def print_table(times: dict[str, list[float]]) -> dict[str, float]:
    medians = {name: statistics.median(values) for name, values in times.items()}
    python = medians["python -c pass"]
    sbatch = medians.get("sbatch --version")
    print(f"\n{'command':<72} {'median ms':>9} {'min-max ms':>15} {'/ python':>9} {'/ sbatch':>9}")
    for name, values in times.items():
        ratio_sbatch = f"{medians[name] / sbatch:9.1f}" if sbatch else f"{'-':>9}"
        print(f"{name:<72} {1000 * medians[name]:9.1f} "
              f"{f'{1000 * min(values):.1f}-{1000 * max(values):.1f}':>15} "
              f"{medians[name] / python:9.2f} {ratio_sbatch}")
    return medians


def import_times(env: dict[str, str]) -> list[tuple[int, int, str]]:
    """(self us, cumulative us, module) of every import of `clusterkit render`."""
    ck = clusterkit_argv()
    script = ck if len(ck) == 1 else ["-m", "cluster_kit"]
    argv = [sys.executable, "-X", "importtime", *script, "render", JOB]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, total, module = line[len("import time:"):].split("|")
        rows.append((int(own), int(total), module.rstrip()))
    return rows


def print_imports(rows: list[tuple[int, int, str]], top: int) -> list[str]:
    """Print the slowest imports; return the heavy modules that were imported."""
    total = sum(own for own, _, _ in rows)
    print(f"\n`clusterkit render {JOB}` imports {len(rows)} modules, {total / 1000:.1f} ms in all "
          f"(python -X importtime, one run)")
    print("slowest top-level imports (cumulative ms):")
    outer = sorted((r for r in rows if not r[2].startswith("  ")), key=lambda r: -r[1])
    for _own, cumulative, module in outer[:top]:
        print(f"  {cumulative / 1000:7.1f}  {module.strip()}")
    names = {module.strip() for _, _, module in rows}
    heavy = sorted(h for h in HEAVY if any(n == h or n.startswith(h + ".") for n in names))
    print(f"heavy modules on the render path ({', '.join(HEAVY)}): {', '.join(heavy) or 'none'}")
    return heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--top", type=int, default=12, help="import rows to print")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    table = commands()
    with tempfile.TemporaryDirectory(prefix="ck-pycache-") as scratch:
        cold = uncached_envs(env, table[f"clusterkit render {JOB}"], Path(scratch))
        print(f"python {sys.version.split()[0]} ({sys.executable}), {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}; {args.runs} runs each")
        times = time_all(table, args.runs, env, cold)
    medians = print_table(times)
    heavy = print_imports(import_times(env), args.top)
    render = medians[f"clusterkit render {JOB}"]
    fast = render < RENDER_LIMIT_S
    print(f"render median {1000 * render:.0f} ms: {'under' if fast else 'NOT under'} "
          f"{1000 * RENDER_LIMIT_S:.0f} ms; load average at end {os.getloadavg()[0]:.1f}")
    return 0 if fast and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
