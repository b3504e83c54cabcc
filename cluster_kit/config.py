"""Search path, profile and job loading (extends, validation), effective job settings.

Loading collects every problem of every file involved (the job, its profile and
the profile's parents) before failing, as `FILE:LINE: message` lines in file
order, so one `clusterkit validate` run shows all there is to fix.

This module is on the path of `clusterkit render`, which must start fast: it
imports no paramiko, subprocess, torch or jinja2.
"""
from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster_kit import jobscript, schema
from cluster_kit.errors import InputError, ValidationError, printable
from cluster_kit.launch import default_tasks_per_node
from cluster_kit.slurm import SBATCH_VALUE_KEYS
from cluster_kit.yamlfile import KeyPath, YamlDoc, YamlError, nearest
from cluster_kit.yamlfile import load as load_yaml

_PACKAGE_DIR = Path(__file__).resolve().parent
PROFILE_SUFFIXES = (".yaml", ".yml")
TEMPLATE_SUFFIXES = (".j2",)


# --------------------------------------------------------------------------- search path

def builtin_dir(kind: str) -> Path:
    """Built-in `profiles` or `templates`: inside the package when installed from a
    wheel (setup.cfg maps them there), else the checkout's top-level directory."""
    installed = _PACKAGE_DIR / kind
    return installed if installed.is_dir() else _PACKAGE_DIR.parent / kind


def _unique(dirs: Iterable[Path]) -> tuple[Path, ...]:
    seen: dict[str, Path] = {}
    for directory in dirs:
        seen.setdefault(os.path.abspath(directory), directory)
    return tuple(seen.values())


@dataclass(frozen=True)
class SearchPath:
    """Where profiles and templates are looked up, first hit wins.

    Order: `--profile-path` dirs, `$CLUSTERKIT_PATH` (colon-separated), `./profiles`
    and `./templates`, `~/.config/clusterkit/{profiles,templates}`, the built-ins.
    A given dir is searched itself and through its `profiles/` or `templates/`.
    """

    profile_path: tuple[Path, ...]
    template_path: tuple[Path, ...]

    @classmethod
    def from_environment(cls, extra_dirs: Sequence[Path] = (),
                         environ: Mapping[str, str] | None = None,
                         cwd: Path | None = None, home: Path | None = None) -> SearchPath:
        """The search path for `--profile-path` dirs and this process's environment."""
        environ = os.environ if environ is None else environ
        cwd = Path.cwd() if cwd is None else cwd
        home = Path.home() if home is None else home
        env_dirs = [Path(p).expanduser() for p in environ.get("CLUSTERKIT_PATH", "").split(":") if p]
        given = [Path(d).expanduser() for d in extra_dirs] + env_dirs
        user = home / ".config" / "clusterkit"
        return cls(
            profile_path=_unique([*_with_sub(given, "profiles"), cwd / "profiles",
                                  user / "profiles", user, builtin_dir("profiles")]),
            template_path=_unique([*_with_sub(given, "templates"), cwd / "templates",
                                   user / "templates", user, builtin_dir("templates")]),
        )

    def profile_dirs(self) -> list[Path]:
        """Directories searched for `NAME.yaml`, in order."""
        return list(self.profile_path)

    def template_dirs(self) -> list[Path]:
        """Directories searched for `NAME.j2`, in order."""
        return list(self.template_path)

    def find_profile(self, ref: str, base: Path | None = None,
                     skip: Path | None = None) -> Path:
        """The file of a profile name or path; `skip` passes over one file, so that
        a user's `base.yaml` can extend the built-in `base`."""
        if _looks_like_path(ref, PROFILE_SUFFIXES):
            return _existing_path(ref, base, "profile")
        for candidate in self._profile_candidates(ref):
            if skip is None or not _same_file(candidate, skip):
                return candidate
        raise InputError(self.missing_profile_message(ref),
                         fix="use a name from `clusterkit profiles list`, or a path to a .yaml file")

    def missing_profile_message(self, ref: str) -> str:
        """`no profile 'x' ...; did you mean 'y'? looked in: ...`."""
        names = [name for name, _ in self.list_profiles()]
        close = difflib.get_close_matches(ref, names, n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        looked = ", ".join(str(d) for d in self.profile_path)
        return f"no profile '{ref}' on the search path{hint} (looked in: {looked})"

    def find_template(self, ref: str, base: Path | None = None) -> Path:
        """The file of a template name (`ddp` -> `ddp.j2`) or path."""
        if _looks_like_path(ref, TEMPLATE_SUFFIXES):
            return _existing_path(ref, base, "template")
        dirs, name = template_lookup(ref, self.template_path)
        for directory in dirs:
            if _is_file(directory / name):
                return directory / name
        looked = ", ".join(str(d) for d in self.template_path)
        close = difflib.get_close_matches(ref, self.template_names(), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise InputError(f"no template '{ref}' on the search path{hint} (looked in: {looked})",
                         fix="use a built-in template name such as ddp, or a path to a .j2 file")

    def template_names(self) -> list[str]:
        """Names of the job templates on the search path (partials `_x.j2` left out)."""
        names = {path.stem for directory in self.template_path if directory.is_dir()
                 for path in directory.glob("*.j2") if not path.name.startswith("_")}
        return sorted(names)

    def list_profiles(self) -> list[tuple[str, Path]]:
        """Every profile name on the search path with the file that wins, by name."""
        found: dict[str, Path] = {}
        for directory in self.profile_path:
            for suffix in PROFILE_SUFFIXES:
                for path in sorted(directory.glob(f"*{suffix}")) if directory.is_dir() else []:
                    found.setdefault(path.stem, path)
        return sorted(found.items())

    def _profile_candidates(self, name: str) -> list[Path]:
        return [directory / f"{name}{suffix}" for directory in self.profile_path
                for suffix in PROFILE_SUFFIXES if _is_file(directory / f"{name}{suffix}")]


def template_lookup(ref: str, template_dirs: Sequence[Path]) -> tuple[list[Path], str]:
    """The one template resolver: the directories to search for `ref`, and its file name.

    A name (`ddp`) is `ddp.j2` on the search dirs; a path (`t/mine.j2`, `~/x.j2`) is
    that file, whose own directory is searched first so it can include the built-in
    partials.
    """
    dirs = [Path(d) for d in template_dirs]
    if _looks_like_path(ref, TEMPLATE_SUFFIXES):
        path = Path(ref).expanduser()
        return [path.parent, *dirs], path.name
    return dirs, f"{ref}{TEMPLATE_SUFFIXES[0]}"


def _with_sub(dirs: Iterable[Path], sub: str) -> list[Path]:
    return [path for directory in dirs for path in (directory, directory / sub)]


def _looks_like_path(ref: str, suffixes: tuple[str, ...]) -> bool:
    return "/" in ref or ref.endswith(suffixes) or ref.startswith("~")


def _existing_path(ref: str, base: Path | None, what: str) -> Path:
    path = Path(ref).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if not _exists(path):  # a directory, FIFO or device is named by the reader, with the fix
        # validate and job problems print only the message, so it says where relative paths start
        relative = base is not None and not Path(ref).expanduser().is_absolute()
        where = f" (a relative path starts at {base or '.'}, the folder of the file naming it)" if relative else ""
        raise InputError(f"no {what} file {path}{where}", fix="check the path")
    return path


def _exists(path: Path) -> bool:
    """`path.exists()`, False for names no file can have (too long, a NUL, a lone surrogate)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _is_file(path: Path) -> bool:
    """`path.is_file()`, False for names no file can have."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _same_file(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def list_profiles(search: SearchPath) -> list[tuple[str, Path]]:
    """Module-level form of `SearchPath.list_profiles`."""
    return search.list_profiles()


# --------------------------------------------------------------------------- problems

class Problems:
    """`FILE:LINE: message` lines from several files, reported in file order."""

    def __init__(self) -> None:
        self._items: list[tuple[str, int, str]] = []

    def add(self, path: Path, line: int, message: str) -> None:
        """One problem at a file and line."""
        self._items.append((str(path), line, printable(message, keep_newlines=False)))

    def add_doc(self, doc: YamlDoc, problems: Iterable[schema.Problem]) -> None:
        """Schema problems of one loaded file."""
        for key_path, message in problems:
            self.add(doc.path, doc.line(key_path), message)

    def add_yaml_error(self, exc: YamlError) -> None:
        """A file that could not be loaded at all, with the fix (validate prints lines only)."""
        self.add(exc.path, exc.line, f"{exc.problem}; {exc.fix}" if exc.fix else exc.problem)

    def count(self) -> int:
        """How many problems so far."""
        return len(self._items)

    def lines(self) -> list[str]:
        """Each problem once, files in the order first met, lines ascending within a file."""
        order: dict[str, int] = {}
        for path, _, _ in self._items:
            order.setdefault(path, len(order))
        ranked = sorted(enumerate(self._items), key=lambda it: (order[it[1][0]], it[1][1], it[0]))
        out = [f"{path}:{line}: {message}" for _, (path, line, message) in ranked]
        return list(dict.fromkeys(out))

    def raise_if_any(self) -> None:
        """ValidationError (exit 2) with every problem, if there are any."""
        if self._items:
            raise ValidationError(self.lines())


# --------------------------------------------------------------------------- profiles

@dataclass
class Profile:
    """A fully resolved profile: extends merged, defaults filled, `extends` removed.

    `chain` is the files merged, this one first. `origins` maps each key path of
    `data` that came from a file to `FILE:LINE` (defaults have none).
    """

    name: str
    path: Path
    data: dict[str, Any]
    chain: list[Path] = field(default_factory=list)
    origins: dict[KeyPath, str] = field(default_factory=dict)

    def where(self, *path: Any) -> str:
        """`FILE:LINE` of a key path, or of its nearest ancestor that has one."""
        return _where(self.origins, tuple(path), self.path)


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
        problems.add_doc(doc, schema.check(doc.data, schema.PROFILE))
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
    if any(_same_file(parent, seen.path) for seen in chain):
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
    data = schema.with_defaults(merged, schema.PROFILE)
    data.pop("extends", None)
    data["name"] = merged.get("name") or leaf.path.stem
    return Profile(name=data["name"], path=leaf.path, data=data,
                   chain=[doc.path for doc in chain], origins=_origins(chain, merged))


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


def _where(origins: Mapping[KeyPath, str], path: KeyPath, default: Path) -> str:
    where = nearest(origins, path)
    return f"{default}:1" if where is None else where


# --------------------------------------------------------------------------- jobs

@dataclass
class Job:
    """A validated job file with its resolved profile.

    `data` holds every key of the job spec (defaults filled; `name` defaults to
    the file stem). `origins` maps key paths of the job file to `FILE:LINE`.
    """

    name: str
    path: Path
    data: dict[str, Any]
    profile: Profile
    origins: dict[KeyPath, str] = field(default_factory=dict)

    def where(self, *path: Any) -> str:
        """`FILE:LINE` of a key path of the job file."""
        return _where(self.origins, tuple(path), self.path)


def load_job(path: Path, search: SearchPath) -> Job:
    """Load and validate a job file and its profile; every problem at once."""
    problems = Problems()
    try:
        doc = load_yaml(path)
    except YamlError as exc:
        problems.add_yaml_error(exc)
        problems.raise_if_any()
        raise
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
    data = schema.with_defaults(doc.data, schema.JOB)
    data["name"] = data.get("name") or default_job_name(doc.path)
    origins = {key: f"{doc.path}:{line}" for key, line in doc.lines.items()}
    return Job(name=data["name"], path=doc.path, data=data, profile=profile, origins=origins)


_PROFILE_NOT_JOB_FIX = ("give a job file (with `profile:` and `script:` keys) that names it, "
                        "e.g. `profile: {path}`, or pass it as --profile {path}")
_JOB_NOT_PROFILE_FIX = ("give a cluster profile instead (`clusterkit profiles list`), such as the one "
                        "this job file names: {profile}")

# Keys only one of the two kinds of file has; name, nodes and slurm are in both.
PROFILE_ONLY_KEYS = frozenset(schema.PROFILE.fields) - frozenset(schema.JOB.fields)
JOB_ONLY_KEYS = frozenset(schema.JOB.fields) - frozenset(schema.PROFILE.fields)


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
    problems.add_doc(doc, schema.check(doc.data, schema.JOB))
    for key in schema.JOB_REQUIRED:
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


def _cross_check_job(job: Mapping[str, Any], profile: Profile | None) -> list[schema.Problem]:
    """Problems that need the job and its profile together."""
    slurm = job.get("slurm")
    tasks = slurm.get("ntasks_per_node") if isinstance(slurm, dict) else None
    if job.get("launcher") == "torchrun" and isinstance(tasks, int) and tasks > 1:
        message = (f"slurm.ntasks_per_node: {tasks} with launcher torchrun starts {tasks} "
                   "torchrun agents per node; torchrun runs one task per node, so remove it "
                   "or use launcher: srun")
        return [(("slurm", "ntasks_per_node"), message)]
    return _check_container(job.get("container"))


def _check_container(container: Any) -> list[schema.Problem]:
    """`container:` without an image runs nothing in a container: refuse it."""
    if not isinstance(container, dict):
        return []
    return [(("container",), (f"container: missing required key '{key}'; name the image, e.g. "
                              "`image: /shared/images/pytorch.sqsh` or `image: nvcr.io#nvidia/pytorch:24.05-py3`"))
            for key in schema.CONTAINER_REQUIRED if key not in container]


# --------------------------------------------------------------------------- effective settings

_SLURM_KEYS = (*SBATCH_VALUE_KEYS, "exclusive")


def effective(job: Job) -> dict[str, Any]:
    """The job's settings as templates and slurm.py consume them (docs/architecture.md).

    Job values win over the profile's: `gpus_per_node`, `time`, `slurm`, `nccl`
    (any network key, plus `debug`), `env` (merged over the profile's env).
    """
    j, p = job.data, job.profile.data
    gpus = _first(j.get("gpus_per_node"), j["slurm"].get("gpus_per_node"),
                  p["slurm"].get("gpus_per_node"))
    return {
        "name": j["name"],
        "profile_name": job.profile.name,
        "nodes": j["nodes"],
        "gpus_per_node": gpus,
        "ntasks_per_node": _tasks_per_node(j, p, gpus),
        "launcher": j["launcher"],
        "script": jobscript.runtime_script(j["script"], j["workdir"], job.path),
        "args": [str(a) for a in j["args"]],
        "workdir": j["workdir"],
        "output": j["output"],
        "preflight": j["preflight"],
        "cuda_graphs": j["cuda_graphs"],
        "template": job_template(j["template"], job.path),
        "master_port": j["master_port"],
        "slurm": _effective_slurm(p["slurm"], j["slurm"], j.get("time")),
        "network": _effective_network(p["network"], j["nccl"]),
        "environment": _effective_environment(p["environment"], j["env"]),
        "expect": dict(p["expect"]),
        "container": j.get("container"),
    }


def job_template(ref: str, job_file: Path) -> str:
    """A template name as is; a template path resolved against the job file's folder."""
    if not _looks_like_path(ref, (".j2",)):
        return ref
    path = Path(ref).expanduser()
    return str(path if path.is_absolute() else Path(os.path.abspath(job_file)).parent / path)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _tasks_per_node(job: Mapping[str, Any], profile: Mapping[str, Any], gpus: Any) -> int:
    """Explicit job value; else 1 for torchrun; else the profile's value (unless the job
    changed the GPU count); else one task per GPU."""
    explicit = job["slurm"].get("ntasks_per_node")
    if explicit is not None:
        return int(explicit)
    if job["launcher"] == "torchrun":
        return 1
    job_gpus = _first(job.get("gpus_per_node"), job["slurm"].get("gpus_per_node"))
    if job_gpus is None and profile["slurm"].get("ntasks_per_node") is not None:
        return int(profile["slurm"]["ntasks_per_node"])
    return default_tasks_per_node(job["launcher"], gpus)


def _effective_slurm(profile: Mapping[str, Any], job: Mapping[str, Any],
                     job_time: Any) -> dict[str, Any]:
    out: dict[str, Any] = {key: _first(job.get(key), profile.get(key)) for key in _SLURM_KEYS}
    out["time"] = _first(job_time, job.get("time"), profile.get("time"))
    for key in ("mem", "time"):
        out[key] = None if out[key] is None else str(out[key])
    extra = {**_sbatch_extra(profile), **_sbatch_extra(job)}
    out["extra"] = {option: value for option, value in extra.items() if value is not None}
    return out


def _sbatch_extra(slurm: Mapping[str, Any]) -> dict[str, str | None]:
    """Extra sbatch options of one slurm section, dashed; true -> "" (a bare flag),
    false -> None (switched off, so a job can drop a profile's flag)."""
    named = set(schema.SLURM_NAMED) | {"sbatch"}
    pairs = [(k, v) for k, v in slurm.items() if k not in named]
    pairs += list((slurm.get("sbatch") or {}).items())
    out: dict[str, str | None] = {}
    for key, value in pairs:
        option = schema.sbatch_option(str(key).lstrip("-"))
        out.pop(option, None)  # a later spelling moves the option to its new place
        out[option] = "" if value is True else None if value is False else str(value)
    return out


def _effective_network(profile: Mapping[str, Any], nccl: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: nccl[key] if nccl.get(key) is not None else profile.get(key)
                           for key in schema.NETWORK_FIELDS if key != "nccl_env"}
    out["ib_hca"] = [str(hca) for hca in out.get("ib_hca") or []]
    env = {**(profile.get("nccl_env") or {}), **(nccl.get("nccl_env") or {})}
    out["nccl_env"] = {name: str(value) for name, value in env.items()}
    debug = nccl.get("debug")
    out["debug"] = debug.upper() if isinstance(debug, str) else None
    return out


def _effective_environment(profile: Mapping[str, Any], job_env: Mapping[str, Any]) -> dict[str, Any]:
    env = {**(profile.get("env") or {}), **job_env}
    return {
        "modules": [str(m) for m in profile.get("modules") or []],
        "setup": [str(s) for s in profile.get("setup") or []],
        "python": profile.get("python") or "python3",
        "env": {name: str(value) for name, value in env.items()},
    }


# --------------------------------------------------------------------------- validate

def is_job(data: Mapping[str, Any]) -> bool:
    """A job file names a `script` or a `profile`; anything else is a profile."""
    return "script" in data or "profile" in data


def _validates_as_job(data: Mapping[str, Any]) -> bool:
    """Whether `validate` checks a file as a job file: it names a script or profile,
    or it has only keys that job files have."""
    return is_job(data) or (bool(data.keys() & JOB_ONLY_KEYS) and not data.keys() & PROFILE_ONLY_KEYS)


JobCheck = Callable[[Job], Iterable[tuple[str, str]]]


def validate_files(paths: Sequence[Path], search: SearchPath,
                   check_job: JobCheck | None = None) -> list[str]:
    """Every problem of the given profiles and job files (the `validate` command).

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
        before = problems.count()
        profile = _check_job(doc, search, problems)
        if check_job is not None and profile is not None and problems.count() == before:
            for key, message in check_job(_job_from(doc, profile)):
                problems.add(doc.path, doc.line((key,)), message)
    return problems.lines()
