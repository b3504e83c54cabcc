"""The search path of profiles and templates (the one template resolver)."""
from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster_kit.errors import InputError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


PROFILE_SUFFIXES = (".yaml", ".yml")


TEMPLATE_SUFFIXES = (".j2",)


# ----------------------------------------------------------------------------
# search path


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
        if looks_like_path(ref, PROFILE_SUFFIXES):
            return _existing_path(ref, base, "profile")
        for candidate in self._profile_candidates(ref):
            if skip is None or not same_file(candidate, skip):
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
        if looks_like_path(ref, TEMPLATE_SUFFIXES):
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
    if looks_like_path(ref, TEMPLATE_SUFFIXES):
        path = Path(ref).expanduser()
        return [path.parent, *dirs], path.name
    return dirs, f"{ref}{TEMPLATE_SUFFIXES[0]}"


def _with_sub(dirs: Iterable[Path], sub: str) -> list[Path]:
    return [path for directory in dirs for path in (directory, directory / sub)]


def looks_like_path(ref: str, suffixes: tuple[str, ...]) -> bool:
    """Whether `ref` names a file (a slash, ~ or one of `suffixes`) rather than a name to search for."""
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


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name the same file once made absolute (links are not followed)."""
    return os.path.abspath(a) == os.path.abspath(b)


def list_profiles(search: SearchPath) -> list[tuple[str, Path]]:
    """Module-level form of `SearchPath.list_profiles`."""
    return search.list_profiles()
