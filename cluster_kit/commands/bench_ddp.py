"""`clusterkit bench ddp`: the user's job with step profiling on, and its traces back.

The job runs as the user wrote it, with ``CLUSTERKIT_PROFILE_STEPS`` and
``CLUSTERKIT_PROFILE_DIR`` exported: a trainer that uses cluster_kit.ddp
(``build_step`` or ``StepProfiler``) writes one trace per rank into a fresh folder
beside the job's output. With ``--sweep`` the launch runs once per DDP variant
(``CLUSTERKIT_DDP_VARIANT``), each variant's traces named after it.

Every launch writes its own output into ``scratch/<variant>/`` of that folder
(``CLUSTERKIT_SCRATCH_DIR``, with ``CLUSTERKIT_CHECKPOINT_DIR`` inside it), never
into the job's checkpoints, and the job script appends each launch's exit status
to ``launches.tsv`` there, so that a variant that failed says why.
"""
from __future__ import annotations

import json
import posixpath
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster_kit.errors import CheckFailed, InputError

if TYPE_CHECKING:
    from cluster_kit.config.effective import Effective

DEFAULT_STEPS = 20
BUCKET_SIZES_MB = (1, 5, 25, 100)
READ_TIMEOUT_S = 120.0


def sweep_variants(cuda_graphs: bool) -> list[str]:
    """The DDP variants of ``--sweep``, the job as it is first."""
    return (["as-is"] + [f"bucket_cap_mb={mb}" for mb in BUCKET_SIZES_MB]
            + ["gradient_as_bucket_view", "static_graph", "cuda_graphs=off" if cuda_graphs else "cuda_graphs=on"])


def choose_variants(cuda_graphs: bool, picked: tuple[str, ...]) -> list[str]:
    """``--variant`` choices (``as-is`` always first), else the whole sweep."""
    known = sweep_variants(cuda_graphs) + ["cuda_graphs=on", "cuda_graphs=off"]
    unknown = [v for v in picked if v not in known]
    if unknown:
        raise InputError(f"--variant {unknown[0]!r} is not a DDP variant of the sweep",
                         fix="use one of: " + ", ".join(dict.fromkeys(known)))
    return ["as-is"] + [v for v in dict.fromkeys(picked) if v != "as-is"] if picked else sweep_variants(cuda_graphs)


def profile_dir(output_dir: str | None, workdir: str | None, now: float | None = None) -> str:
    """A fresh folder for this run's traces, beside the job's output."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    base = output_dir or workdir or "."
    return posixpath.join(base, f"clusterkit-ddp-{stamp}-{secrets.token_hex(3)}")


def bench_paths(trace_dir: str) -> dict[str, str]:
    """The ``bench`` template variable: the launches' scratch root and their exit-status file."""
    return {"scratch": posixpath.join(trace_dir, "scratch"), "launches": posixpath.join(trace_dir, "launches.tsv")}


def parse_launches(text: str) -> dict[str, int]:
    """``launches.tsv`` (``VARIANT<TAB>EXIT_STATUS`` per line) -> {variant: status}; the last line of a variant wins."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        variant, _, code = line.rpartition("\t")
        if variant and code.strip().lstrip("-").isdigit():
            out[variant] = int(code)
    return out


def read_launches(runner: Any, path: str) -> dict[str, int]:
    """The launches' exit statuses the job recorded ({} when it recorded none)."""
    done = runner.run(["cat", path], timeout=READ_TIMEOUT_S)
    return parse_launches(done.stdout) if done.returncode == 0 else {}


def profiled_settings(settings: Effective, steps: int, trace_dir: str) -> Effective:
    """The job's settings with step profiling exported to every rank."""
    if steps < 1:
        raise InputError(f"--steps {steps}: profile at least 1 step", fix="use e.g. --steps 20")
    environment = dict(settings["environment"])
    environment["env"] = {**environment["env"], "CLUSTERKIT_PROFILE_STEPS": str(steps),
                          "CLUSTERKIT_PROFILE_DIR": trace_dir}
    out = settings.copy()
    out["environment"] = environment
    return out


def read_allreduce_json(path: str) -> list[dict[str, Any]]:
    """The rows of a saved ``bench allreduce --json`` document."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"--allreduce-json {path}: cannot read it: {exc.strerror}",
                         fix="save one with: clusterkit bench allreduce JOB.yaml --json > FILE") from None
    except ValueError as exc:
        raise InputError(f"--allreduce-json {path}: not JSON ({exc})",
                         fix="save one with: clusterkit bench allreduce JOB.yaml --json > FILE") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise InputError(f"--allreduce-json {path}: no \"rows\" list: not a bench allreduce result",
                         fix="save one with: clusterkit bench allreduce JOB.yaml --json > FILE")
    return [r for r in rows if isinstance(r, dict)]


def fetch_traces(runner: Any, trace_dir: str, job_id: str,
                 launches: dict[str, int] | None = None) -> tuple[list[Any], dict[str, str]]:
    """Every trace the job wrote (read through the runner: here or on the login host).

    Also, per variant, why a trace file of it could not be read (the first such
    file); the caller decides whether that ends the run or fails one variant.
    """
    from cluster_kit.analysis.traces import TraceError, parse_trace, variant_of

    listing = runner.run(["find", trace_dir, "-maxdepth", "1", "-name", "*.json", "-type", "f"],
                         timeout=READ_TIMEOUT_S)
    files = sorted(line for line in listing.stdout.splitlines() if line.strip())
    if not files:
        raise CheckFailed(f"job {job_id} wrote no profiler traces into {trace_dir}{_launch_summary(launches)}",
                          fix="profile the training loop: use cluster_kit.ddp.build_step, or wrap it "
                              "in `with cluster_kit.ddp.StepProfiler() as prof:` with prof.step() after "
                              f"each step; read the job's log: clusterkit logs {job_id}")
    traces: list[Any] = []
    unreadable: dict[str, str] = {}
    for path in files:
        done = runner.run(["cat", path], timeout=READ_TIMEOUT_S)
        try:
            if done.returncode != 0:
                raise TraceError(f"{path}: cannot read it {runner.where}: {done.stderr.strip()}")
            traces.append(parse_trace(done.stdout, path))
        except TraceError as exc:
            unreadable.setdefault(variant_of(path) or "as-is", str(exc))
    return traces, unreadable


def _launch_summary(launches: dict[str, int] | None) -> str:
    """`` (launches: as-is exited 1, static_graph exited 0)`` or nothing."""
    if not launches:
        return ""
    return " (launches: " + ", ".join(f"{v} exited {c}" for v, c in launches.items()) + ")"
