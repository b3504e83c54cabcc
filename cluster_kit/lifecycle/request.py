"""The one implementation of submit, used by `clusterkit submit` and `cluster_kit.submit`.

Load the job (overrides set), render it, preflight its candidate nodes and route
around failing ones, then sbatch it with its record. A sweep becomes ONE array job
(render/array.py); `--after` a dependency. Nothing here prints or exits: lines for
people go to `notify`, failures are raised as ClusterKitError.
"""
from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cluster_kit.config.overrides import Override
from cluster_kit.errors import CheckFailed, ClusterRefused, InputError

if TYPE_CHECKING:
    from cluster_kit.config.documents import Job
    from cluster_kit.config.effective import Effective
    from cluster_kit.config.search import SearchPath
    from cluster_kit.fleet.preflight import FanOut
    from cluster_kit.fleet.routing import Candidates, Route
    from cluster_kit.hostlist import NodeSet
    from cluster_kit.slurm.runner import Runner

Notify = Callable[[str], None]


class Context(Protocol):
    """What submit needs of the command context (app.App gives it; so does the API)."""

    search: SearchPath
    verbose: bool

    def checked_job(self, path: str, offline: bool = False, overrides: Sequence[Override] = ()) -> Job: ...
    def runner(self, profile_data: dict[str, Any]) -> Runner: ...
    def fan_out(self, profile_data: dict[str, Any], deep: bool = False) -> FanOut: ...
    def log(self, line: str) -> None: ...


Progress = Callable[[int], Any]  # total nodes -> a per-node callback (or None)

DEPENDENCY_KINDS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}
AFTER_FIX = "write --after JOBID[:ok|any|notok], e.g. --after 1234 or --after 1234:any"


@dataclass(frozen=True)
class SubmitRequest:
    """What to submit and how: the job file, its overrides, a sweep and a dependency."""

    job_file: str
    overrides: Sequence[Override] = ()
    preflight: bool = True
    strict: bool = False
    dry_run: bool = False
    test_only: bool = False
    sweep: Sequence[Mapping[str, Any]] = ()   # one {key: value} per array task
    sweep_source: str = "--sweep"
    max_parallel: int | None = None
    after: Sequence[str] = ()                 # JOBID[:ok|any|notok]


@dataclass
class Submitted:
    """What submit did: the job id (None for a dry run or --test-only), the job, its
    effective settings and script, the preflight report and route, the array's tasks."""

    job_id: str | None
    job: Job
    settings: Effective
    script: str
    route: Route | None = None
    report: dict[str, Any] | None = None
    test_only: str | None = None
    array: str | None = None
    sweep: list[dict[str, Any]] = field(default_factory=list)  # index -> values
    dependency: str | None = None

    def sweep_map(self) -> dict[str, dict[str, Any]]:
        """{"0": {"env.LR": "1e-3"}, ...}: each array index and its values."""
        return {str(index): dict(values) for index, values in enumerate(self.sweep)}


def build_dependency(after: Sequence[str]) -> str | None:
    """`--after 12 --after 13:any` -> `afterok:12,afterany:13`; InputError (exit 2) otherwise."""
    from cluster_kit.slurm import builders as slurm

    parts = []
    for item in after:
        job_id, _, kind = str(item).strip().partition(":")
        if kind and kind not in DEPENDENCY_KINDS:
            raise InputError(f"--after {item}: {kind!r} is not one of ok, any, notok", fix=AFTER_FIX)
        try:
            job_id = slurm.check_job_id(job_id)
        except ValueError as exc:
            raise InputError(f"--after {item}: {exc}", fix=AFTER_FIX) from None
        parts.append(f"{DEPENDENCY_KINDS[kind or 'ok']}:{job_id}")
    return ",".join(parts) or None


def submit_job(app: Context, request: SubmitRequest, notify: Notify | None = None,
               progress: Progress | None = None) -> Submitted:
    """Load, render, preflight and route, sbatch: what was submitted. `app` is the
    command context (search path, runners, SSH fan-out); `notify` gets the lines
    for people (nodes routed around)."""
    from cluster_kit.lifecycle.submission import submit

    notify = notify or (lambda _line: None)
    dependency = build_dependency(request.after)
    tasks = load_tasks(app, request)
    job = tasks[0][0]
    if request.sweep and job.data.get("resilience") is not None:
        raise InputError("--sweep: a job with `resilience:` cannot run as an array job",
                         fix="remove resilience: (--set resilience=null) or submit one job per value")
    settings_list = [task_settings(task_job, dependency, bool(request.sweep)) for task_job, _ in tasks]
    array = None
    if request.sweep:
        from cluster_kit.render.array import array_spec
        array = array_spec(len(tasks), request.max_parallel)
    script = render_tasks(app, settings_list, request.sweep, array)  # bad input fails before any node is contacted
    route, report = None, None
    if request.preflight and not request.dry_run:
        route, report = preflight_and_route(app, job, settings_list[0], request.strict, progress)
        if route.exclude:
            for settings in settings_list:
                settings["slurm"]["exclude"] = route.exclude_expr
            script = render_tasks(app, settings_list, request.sweep, array)
            for line in excluded_lines(route, report):
                notify(line)
    done = Submitted(None, job, settings_list[0], script, route, report, array=array,
                     sweep=[dict(values) for values in request.sweep], dependency=dependency)
    if request.dry_run:
        return done
    runner = app.runner(job.profile.data)
    extra = {"sweep": done.sweep, "array": array, "dependency": dependency,
             "overrides": {item.key: item.value for item in request.overrides},
             **({} if request.test_only else script_provenance(runner, settings_list[0]))}
    result = submit(runner, job, done.settings, script, preflight=report,
                    excluded=dict(route.excluded) if route else None, test_only=request.test_only,
                    record_extra=extra)
    if request.test_only:
        done.test_only = result
    else:
        done.job_id = result
    return done


def load_tasks(app: Context, request: SubmitRequest) -> list[tuple[Job, dict[str, Any]]]:
    """The job with its overrides; for a sweep, one job per task with its values set
    after the overrides, each validated (a bad value is reported at `--sweep KEY`)."""
    points = list(request.sweep) or [{}]
    tasks = []
    for values in points:
        extra = [Override(key, value, f"{request.sweep_source} {key}") for key, value in values.items()]
        job = app.checked_job(request.job_file, offline=request.dry_run,
                              overrides=[*request.overrides, *extra])
        tasks.append((job, dict(values)))
    return tasks


def task_settings(job: Job, dependency: str | None, array: bool) -> Effective:
    """The effective settings of one job (one array task): a dependency in its sbatch
    options, an output file per task for an array."""
    from cluster_kit.config.effective import effective
    from cluster_kit.render.array import array_output

    settings = effective(job)
    if dependency:
        extra = settings["slurm"]["extra"]
        extra["dependency"] = ",".join(p for p in (extra.get("dependency"), dependency) if p)
    if array:
        settings["output"] = array_output(settings.get("output"))
    return settings


def render_tasks(app: Context, settings_list: Sequence[Effective], sweep: Sequence[Mapping[str, Any]],
                 array: str | None) -> str:
    """The job's script, or the array script of a sweep's tasks."""
    from cluster_kit.render.array import build_array_script
    from cluster_kit.render.environment import render_job

    dirs = app.search.template_dirs()
    if array is None:
        return render_job(settings_list[0], dirs)
    scripts = [render_job(settings, dirs, extra={"array_task": index})
               for index, settings in enumerate(settings_list)]
    return build_array_script(scripts, sweep, array)


def script_provenance(runner: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The git commit of the job's script and whether its tree was dirty (None when
    it is not in a git tree), read where the script is (through the runner)."""
    script = str(settings.get("script") or "")
    workdir = settings.get("workdir")
    path = posixpath.join(workdir, script) if workdir and not posixpath.isabs(script) else script
    folder = posixpath.dirname(path) or "."
    try:
        head = runner.run(["git", "-C", folder, "rev-parse", "HEAD"])
        if not head.ok:
            return {"git_commit": None, "git_dirty": None}
        status = runner.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"])
    except (OSError, ClusterRefused):
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": head.stdout.strip() or None, "git_dirty": bool(status.stdout.strip()) if status.ok else None}


def expand_setting(value: str | None) -> NodeSet:
    """A validated hostlist setting (slurm.nodelist/exclude) as a node set."""
    from cluster_kit.hostlist import NodeSet

    return NodeSet(value or "")


def job_candidates(app: Context, job: Job, settings: Effective) -> Candidates:
    """The nodes Slurm could give the job (routing.candidate_nodes on sinfo's view)."""
    from cluster_kit.fleet import routing
    from cluster_kit.slurm import jobs

    slurm_settings = settings["slurm"]
    runner = app.runner(job.profile.data)
    rows = jobs.node_states(runner, slurm_settings["partition"])
    if not rows:
        raise ClusterRefused(f"sinfo lists no nodes for partition {slurm_settings['partition']!r} "
                             f"{runner.where}", fix="check slurm.partition against `sinfo -s`")
    pool = expand_setting(job.profile.data.get("nodes")) or [row.node for row in rows]
    candidates = routing.candidate_nodes(pool, rows, expand_setting(slurm_settings["nodelist"]),
                                         expand_setting(slurm_settings["exclude"]))
    if app.verbose:
        for node, why in candidates.left_out.items():
            app.log(f"not a candidate for the job: {node} ({why})")
    if not candidates.nodes:
        left = ", ".join(f"{node} ({why})" for node, why in candidates.left_out.items()
                         if candidates.unchecked.get(node) != routing.UNCHECKED_POOL)
        raise CheckFailed(f"no node Slurm could give this job: {left or 'the partition is empty'}",
                          fix="resume or undrain nodes (clusterkit audit --undrain --apply), or check "
                              "nodes, slurm.partition, slurm.nodelist and slurm.exclude")
    return candidates


def preflight_and_route(app: Context, job: Job, settings: Effective, strict: bool,
                        progress: Progress | None = None) -> tuple[Route, dict[str, Any]]:
    """Preflight the job's candidates; the route around failing ones and the report.

    Raises CheckFailed (exit 1, nothing submitted) when the route is refused.
    """
    from cluster_kit.fleet import routing
    from cluster_kit.fleet.preflight import run_preflight
    from cluster_kit.report.preflight import preflight_table

    candidates = job_candidates(app, job, settings)
    # The job's own expectations: a job with gpus_per_node: 0 demands no GPUs of its nodes.
    checked = dataclasses.replace(job.profile, data={**job.profile.data, "expect": settings["expect"]})
    report, _facts = run_preflight(candidates.nodes, checked.data, app.fan_out(checked.data, False), deep=False,
                                   on_result=progress(len(candidates.nodes)) if progress else None)
    route = routing.plan_route(candidates, report, int(settings["nodes"]), strict,
                               expand_setting(settings["slurm"]["exclude"]))
    if route.refusal:
        raise CheckFailed(f"preflight failed; not submitting: {route.refusal}\n" + preflight_table(report),
                          fix=routing.refusal_fix(route, candidates))
    return route, report


def excluded_lines(route: Route, report: dict[str, Any]) -> list[str]:
    """One line per node routed around, with its failing checks, and one per reason
    for the nodes excluded because submit did not check them."""
    from cluster_kit.hostlist import fold

    entries = {entry["node"]: entry for entry in report.get("nodes", [])}
    unchecked: dict[str, list[str]] = {}
    lines = []
    for node in route.excluded:
        if node in route.unchecked:
            unchecked.setdefault(route.unchecked[node], []).append(node)
            continue
        checks = [f"{c['id']}: {c.get('message', '')}".rstrip(": ")
                  for c in entries[node].get("checks", []) if c.get("status") in ("fail", "unreachable")]
        lines.append(f"clusterkit: excluding {node} (--exclude): {'; '.join(checks)}")
    for why, nodes in unchecked.items():
        lines.append(f"clusterkit: excluding {fold(nodes)} (--exclude): not preflighted: {why}")
    return lines
