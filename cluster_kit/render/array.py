"""A sweep as ONE Slurm array job: task i runs the job with its values.

Each task's script is rendered on its own (its values set as `--set` would), so any
key of the job file may be swept as long as the tasks' `#SBATCH` options stay the
same (an array job's tasks share them). The array script keeps those options once
and runs task i's body in branch i of a `case` on `SLURM_ARRAY_TASK_ID`. Text in,
text out.
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from cluster_kit.errors import InputError
from cluster_kit.render.quoting import oneline, shq

# sbatch's default MaxScriptSize (slurm.conf max_script_size): a larger script is refused.
MAX_SCRIPT_BYTES = 4 * 1024 * 1024


def array_spec(tasks: int, max_parallel: int | None) -> str:
    """`0-K` or `0-K%N` (at most N tasks at a time)."""
    if tasks < 1:
        raise InputError("a sweep needs at least one combination of values", fix="give each --sweep a value")
    if max_parallel is not None and max_parallel < 1:
        raise InputError(f"--max-parallel {max_parallel}: must be 1 or more",
                         fix="give how many array tasks may run at once, e.g. --max-parallel 2")
    limit = f"%{max_parallel}" if max_parallel else ""
    return f"0-{tasks - 1}{limit}"


def array_output(output: str | None) -> str | None:
    """A job's `output` made per task: `%j` -> `%A_%a`; a name without `%a` gets `-%a`
    before its extension. None stays None (sbatch's default is per task already)."""
    if not output or "%a" in output:
        return output
    if "%j" in output:
        return output.replace("%j", "%A_%a")
    folder, name = posixpath.split(output)
    stem, dot, ext = name.rpartition(".")
    name = f"{stem}-%a.{ext}" if dot and stem else f"{name}-%a"
    return posixpath.join(folder, name) if folder else name


def describe(values: Mapping[str, Any]) -> str:
    """`env.LR=1e-3 env.BS=32`: a task's values as `--set` would take them."""
    return " ".join(f"{key}={_text(value)}" for key, value in values.items())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def split_header(script: str) -> tuple[list[str], list[str]]:
    """The leading `#!` and `#SBATCH` lines of a rendered script, and the rest."""
    lines = script.splitlines()
    end = 0
    while end < len(lines) and (lines[end].startswith("#SBATCH") or (end == 0 and lines[0].startswith("#!"))):
        end += 1
    return lines[:end], lines[end:]


def build_array_script(task_scripts: Sequence[str], points: Sequence[Mapping[str, Any]], array: str) -> str:
    """One array-job script from the tasks' own scripts (task i = `task_scripts[i]`,
    run with `points[i]`). InputError (exit 2) when the sweep changes an #SBATCH option."""
    headers = [split_header(text) for text in task_scripts]
    first = headers[0][0]
    for index, (header, _body) in enumerate(headers):
        if header != first:
            changed = sorted(set(header) ^ set(first))
            raise InputError(f"--sweep: task {index} ({describe(points[index])}) changes the job's "
                             f"#SBATCH options ({'; '.join(changed)}); the tasks of an array job share them",
                             fix="sweep keys that do not change #SBATCH options (env, args, ...), "
                                 "or set such a key with --set and submit one job per value")
    out = [*first, f"#SBATCH --array={array}",
           f"# clusterkit sweep: {len(points)} array task(s), index -> values:"]
    out += [f"#   {index}: {oneline(describe(values))}" for index, values in enumerate(points)]
    out += ["# shellcheck disable=SC2016 # single quotes keep values and per-task code literal",
            "set -euo pipefail",
            'CLUSTERKIT_SWEEP_INDEX="${SLURM_ARRAY_TASK_ID:?clusterkit: this script runs as an array job}"',
            "export CLUSTERKIT_SWEEP_INDEX",
            'case "$CLUSTERKIT_SWEEP_INDEX" in']
    for index, ((_header, body), values) in enumerate(zip(headers, points)):
        out += [f"{index})", f"export CLUSTERKIT_SWEEP_VALUES={shq(describe(values))}",
                'echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"',
                *body, ";;"]
    out += ["*)", 'echo "clusterkit: no sweep values for array task $CLUSTERKIT_SWEEP_INDEX" >&2',
            "exit 2", ";;", "esac"]
    text = "\n".join(out) + "\n"
    if len(text.encode()) > MAX_SCRIPT_BYTES:
        raise InputError(f"--sweep: the array script of {len(points)} tasks is over "
                         f"{MAX_SCRIPT_BYTES // (1024 * 1024)} MiB, more than sbatch takes",
                         fix="sweep fewer values, or turn the in-job preflight off (--set preflight=false)")
    return text
