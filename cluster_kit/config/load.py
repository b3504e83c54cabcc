"""Profile and job loading: extends chains, validation, cross-checks."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster_kit.config import jobchecks, spec, specs
from cluster_kit.config.documents import Job, Profile
from cluster_kit.config.jobscript import interpreter_path
from cluster_kit.config.overrides import Override
from cluster_kit.config.overrides import apply as apply_overrides
from cluster_kit.config.problems import Problems
from cluster_kit.config.search import same_file
from cluster_kit.config.yamlfile import KeyPath, YamlDoc, YamlError
from cluster_kit.config.yamlfile import load as load_yaml
from cluster_kit.errors import InputError

if TYPE_CHECKING:
    from cluster_kit.config.search import SearchPath


# ----------------------------------------------------------------------------
# profiles


def load_profile(ref: str, search: SearchPath, base: Path | None = None) -> Profile:
    """Find, load, validate and resolve one profile; every problem at once."""
    path = search.find_profile(ref, base)
    problems = Problems()
    profile = _resolve_profile(path, search, problems)
    problems.raise_if_any()
    assert profile is not None
    return profile


def _resolve_profile(path: Path, search: SearchPath, problems: Problems,
                     loaded: YamlDoc | None = None) -> Profile | None:
    """Load the extends chain of `path` (`loaded`: its file, already read); None when a
    problem prevents resolving it."""
    before = problems.count()
    chain = _load_chain(path, search, problems, loaded)
    if problems.count() > before or not chain:
        return None
    return _build_profile(chain)


def _load_chain(path: Path, search: SearchPath, problems: Problems,
                loaded: YamlDoc | None = None) -> list[YamlDoc]:
    """The profile file and its parents, child first; problems recorded, not raised."""
    chain: list[YamlDoc] = []
    while True:
        try:
            doc = loaded if loaded is not None and not chain else load_yaml(path)
        except YamlError as exc:
            problems.add_yaml_error(exc)
            return chain
        if looks_like_job(doc.data):
            problems.add(doc.path, 1, f"{doc.path.name} is a job file, not a cluster profile; "
                         + _JOB_NOT_PROFILE_FIX.format(profile=doc.data.get("profile") or "NAME"))
            return chain
        chain.append(doc)
        problems.add_doc(doc, spec.check(doc.data, specs.PROFILE))
        parent = _parent_of(doc, chain, search, problems)
        if parent is None:
            return chain
        path = parent


def _parent_of(doc: YamlDoc, chain: list[YamlDoc], search: SearchPath,
               problems: Problems) -> Path | None:
    ref = doc.data.get("extends")
    if not isinstance(ref, str) or not ref.strip():
        return None
    line = doc.line(("extends",))
    try:
        parent = search.find_profile(ref, base=doc.path.parent, skip=doc.path)
    except InputError as exc:
        problems.add(doc.path, line, f"extends: {exc.message}")
        return None
    if any(same_file(parent, seen.path) for seen in chain):
        names = " -> ".join(str(seen.path) for seen in chain) + f" -> {parent}"
        problems.add(doc.path, line, f"extends: cycle {names}; remove one of these `extends`")
        return None
    return parent


def _build_profile(chain: list[YamlDoc]) -> Profile:
    leaf = chain[0]
    merged: dict[str, Any] = {}
    for doc in reversed(chain):
        own = {k: v for k, v in doc.data.items() if k != "extends" and (doc is leaf or k != "name")}
        merged = deep_merge(merged, own)
    data = spec.with_defaults(merged, specs.PROFILE)
    data.pop("extends", None)
    data["name"] = merged.get("name") or leaf.path.stem
    origins = _origins(chain, merged)
    data["environment"]["python"] = _profile_python(data["environment"]["python"], origins)
    return Profile(name=data["name"], path=leaf.path, data=data,
                   chain=[doc.path for doc in chain], origins=origins)


def _profile_python(python: Any, origins: Mapping[KeyPath, str]) -> Any:
    """A relative `environment.python` starts at the folder of the profile file that set it."""
    where = origins.get(("environment", "python"))
    if not isinstance(python, str) or where is None:
        return python
    folder = os.path.dirname(os.path.abspath(where.rpartition(":")[0]))
    return interpreter_path(python, folder)


def without_unset(value: Any) -> Any:
    """`value` without None and empty mappings or lists, at any depth: a profile as
    `profiles show` prints it, whose unset keys validate only by being absent."""
    if isinstance(value, Mapping):
        kept = {key: without_unset(item) for key, item in value.items()}
        return {key: item for key, item in kept.items() if item is not None and item != {} and item != []}
    if isinstance(value, list):
        return [without_unset(item) for item in value]
    return value


def deep_merge(parent: Mapping[str, Any], child: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key, child wins; lists and scalars are replaced whole."""
    out = dict(parent)
    for key, value in child.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _origins(chain: list[YamlDoc], data: Mapping[str, Any]) -> dict[KeyPath, str]:
    """For each key path of the merged data, FILE:LINE of the file whose value won."""
    out: dict[KeyPath, str] = {}
    for key_path in _key_paths(data, ()):
        for doc in chain:  # child first: the first file that has the key won
            if key_path in doc.lines:
                out[key_path] = f"{doc.path}:{doc.lines[key_path]}"
                break
    return out


def _key_paths(value: Any, prefix: KeyPath) -> Iterable[KeyPath]:
    items: Iterable[tuple[Any, Any]] = ()
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    for key, item in items:
        yield prefix + (key,)
        yield from _key_paths(item, prefix + (key,))


# ----------------------------------------------------------------------------
# jobs


def load_job(path: Path, search: SearchPath, overrides: Sequence[Override] = ()) -> Job:
    """Load and validate a job file and its profile, `overrides` set first (validated
    like the file, reported at `--set KEY`); every problem at once."""
    problems = Problems()
    try:
        doc = load_yaml(path)
    except YamlError as exc:
        problems.add_yaml_error(exc)
        problems.raise_if_any()
        raise
    doc = apply_overrides(doc, overrides)
    if looks_like_profile(doc.data):
        problems.add(doc.path, 1, f"{doc.path.name} is a cluster profile, not a job file; "
                     + _PROFILE_NOT_JOB_FIX.format(path=doc.path))
        problems.raise_if_any()
    profile = _check_job(doc, search, problems)
    problems.raise_if_any()
    assert profile is not None
    return _job_from(doc, profile)


def _job_from(doc: YamlDoc, profile: Profile) -> Job:
    """The Job of a job file that has no problems."""
    data = spec.with_defaults(doc.data, specs.JOB)
    data["name"] = data.get("name") or default_job_name(doc.path)
    origins = {key: f"{doc.path}:{line}" for key, line in doc.lines.items()}
    origins.update(doc.overrides)
    return Job(name=data["name"], path=doc.path, data=data, profile=profile, origins=origins)


_PROFILE_NOT_JOB_FIX = ("give a job file (with `profile:` and `script:` keys) that names it, "
                        "e.g. `profile: {path}`, or pass it as --profile {path}")


_JOB_NOT_PROFILE_FIX = ("give a cluster profile instead (`clusterkit profiles list`), such as the one "
                        "this job file names: {profile}")


# Keys only one of the two kinds of file has; name, nodes and slurm are in both.
PROFILE_ONLY_KEYS = frozenset(specs.PROFILE.fields) - frozenset(specs.JOB.fields)


JOB_ONLY_KEYS = frozenset(specs.JOB.fields) - frozenset(specs.PROFILE.fields)


def looks_like_profile(data: Mapping[str, Any]) -> bool:
    """Keys that only profiles have, and none that only job files have."""
    return bool(data.keys() & PROFILE_ONLY_KEYS) and not data.keys() & JOB_ONLY_KEYS


def looks_like_job(data: Mapping[str, Any]) -> bool:
    """A `script` or `profile` key, and no key that only profiles have."""
    return is_job(data) and not data.keys() & PROFILE_ONLY_KEYS


def default_job_name(path: Path) -> str:
    """The file stem, made safe for `--job-name`."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "-", path.stem) or "job"


def _check_job(doc: YamlDoc, search: SearchPath, problems: Problems) -> Profile | None:
    """Record the problems of a job file and of its profile; return the profile."""
    problems.add_doc(doc, spec.check(doc.data, specs.JOB))
    for key in specs.JOB_REQUIRED:
        if key not in doc.data:
            problems.add(doc.path, 1, f"missing required key '{key}'; {_REQUIRED_HINT[key]}")
    profile = _job_profile(doc, search, problems)
    problems.add_doc(doc, _cross_check_job(doc.data, profile))
    _check_template(doc, search, problems)
    return profile


def _check_template(doc: YamlDoc, search: SearchPath, problems: Problems) -> None:
    """A `template:` that is on the search path, or a file relative to the job file."""
    ref = doc.data.get("template")
    if not isinstance(ref, str) or not ref.strip() or "\n" in ref or "\0" in ref:
        return  # absent (ddp) or already a schema problem
    try:
        search.find_template(ref, base=doc.path.parent)
    except InputError as exc:
        problems.add(doc.path, doc.line(("template",)), f"template: {exc.message}; {exc.fix}")


_REQUIRED_HINT = {
    "profile": "name the cluster profile, e.g. `profile: local-dev`",
    "script": "name the training script, e.g. `script: train.py`",
}


def _job_profile(doc: YamlDoc, search: SearchPath, problems: Problems) -> Profile | None:
    ref = doc.data.get("profile")
    if not isinstance(ref, str) or not ref.strip() or "\n" in ref:
        return None
    try:
        path = search.find_profile(ref, base=doc.path.parent)
    except InputError as exc:
        problems.add(doc.path, doc.line(("profile",)), f"profile: {exc.message}")
        return None
    if _is_job_file(path):
        problems.add(doc.path, doc.line(("profile",)), f"profile: {ref} is a job file, not a cluster "
                     "profile; name a cluster profile (`clusterkit profiles list`) or a path to one")
        return None
    return _resolve_profile(path, search, problems)


def _is_job_file(path: Path) -> bool:
    """Whether `path` loads as a job file (a file that does not load is not one)."""
    try:
        return looks_like_job(load_yaml(path).data)
    except YamlError:
        return False


def _cross_check_job(job: Mapping[str, Any], profile: Profile | None) -> list[spec.Problem]:
    """Problems that need the job and its profile together, or two keys of the job."""
    slurm = job.get("slurm")
    tasks = slurm.get("ntasks_per_node") if isinstance(slurm, dict) else None
    if job.get("launcher") == "torchrun" and isinstance(tasks, int) and tasks > 1:
        message = (f"slurm.ntasks_per_node: {tasks} with launcher torchrun starts {tasks} "
                   "torchrun agents per node; torchrun runs one task per node, so remove it "
                   "or use launcher: srun")
        return [(("slurm", "ntasks_per_node"), message)]
    return [*jobchecks.check_node_count(job, profile), *jobchecks.check_gpu_requests(job),
            *jobchecks.check_grace(job, profile), *jobchecks.check_compile(job), *jobchecks.check_min_nodes(job),
            *_check_container(job.get("container"))]


def _check_container(container: Any) -> list[spec.Problem]:
    """`container:` without an image runs nothing in a container: refuse it."""
    if not isinstance(container, dict):
        return []
    return [(("container",), (f"container: missing required key '{key}'; name the image, e.g. "
                              "`image: /shared/images/pytorch.sqsh` or `image: nvcr.io#nvidia/pytorch:24.05-py3`"))
            for key in specs.CONTAINER_REQUIRED if key not in container]


# ----------------------------------------------------------------------------
# validate


def is_job(data: Mapping[str, Any]) -> bool:
    """A job file names a `script` or a `profile`; anything else is a profile."""
    return "script" in data or "profile" in data


def _validates_as_job(data: Mapping[str, Any]) -> bool:
    """Whether `validate` checks a file as a job file: it names a script or profile,
    or it has only keys that job files have."""
    return is_job(data) or (bool(data.keys() & JOB_ONLY_KEYS) and not data.keys() & PROFILE_ONLY_KEYS)


JobCheck = Callable[[Job], Iterable[tuple[str, str]]]


def validate_files(paths: Sequence[Path], search: SearchPath,
                   check_job: JobCheck | None = None, overrides: Sequence[Override] = ()) -> list[str]:
    """Every problem of the given profiles and job files (the `validate` command);
    `overrides` (`--set`) are set in each job file first.

    `check_job(job)` adds what needs more than the files (the script on disk, the
    rendered template) for each job file without problems: (key, message) pairs,
    reported at the key's line.
    """
    problems = Problems()
    for path in paths:
        try:
            doc = load_yaml(path)
        except YamlError as exc:
            problems.add_yaml_error(exc)
            continue
        if not _validates_as_job(doc.data):
            _resolve_profile(path, search, problems, loaded=doc)
            continue
        doc = apply_overrides(doc, overrides)
        before = problems.count()
        profile = _check_job(doc, search, problems)
        if check_job is not None and profile is not None and problems.count() == before:
            for key, message in check_job(_job_from(doc, profile)):
                problems.add_key(doc, (key,), message)
    return problems.lines()
