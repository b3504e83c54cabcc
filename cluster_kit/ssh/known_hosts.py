"""OpenSSH known_hosts files: lookup names, matching, verdicts, appending new keys.

Follows sshd(8)'s SSH_KNOWN_HOSTS FILE FORMAT: comma-separated host patterns
(`*`, `?`, `!negation`, `[host]:port`), hashed names (`|1|salt|hmac`), and the
`@revoked` / `@cert-authority` markers. Keys are compared as raw blobs, so this
module needs no SSH library; `ssh/connect.py` hands it the server's key type and blob.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import shlex
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from cluster_kit.ssh.filecache import FileCache

try:  # POSIX only: guards appends against other ssh clients writing the same file
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"
KEY_LABELS = {
    "ssh-ed25519": "ED25519",
    "ssh-rsa": "RSA",
    "ecdsa-sha2-nistp256": "ECDSA",
    "ecdsa-sha2-nistp384": "ECDSA",
    "ecdsa-sha2-nistp521": "ECDSA",
    "sk-ssh-ed25519@openssh.com": "ED25519-SK",
    "sk-ecdsa-sha2-nistp256@openssh.com": "ECDSA-SK",
}


def lookup_name(hostname: str, port: int, alias: str | None = None) -> str:
    """The name OpenSSH files a host's key under: HostKeyAlias as is, else
    the lower-cased host name, as `[host]:port` when the port is not 22."""
    if alias:
        return alias
    host = hostname.lower()
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(blob: bytes) -> str:
    """OpenSSH's default fingerprint: `SHA256:` + unpadded base64."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode()
    return "SHA256:" + digest.rstrip("=")


def describe_key(key_type: str, blob: bytes) -> str:
    """`ED25519 key SHA256:...`, as ssh prints it."""
    return f"{KEY_LABELS.get(key_type, key_type)} key {fingerprint(blob)}"


def hash_name(name: str, salt: bytes | None = None) -> str:
    """`|1|salt|hmac` form of `name`, as `HashKnownHosts yes` writes it."""
    salt = os.urandom(20) if salt is None else salt
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


@dataclass(frozen=True)
class Entry:
    """One known_hosts line."""

    patterns: tuple[str, ...]
    key_type: str
    blob: bytes
    marker: str = ""
    origin: str = ""

    def matches(self, name: str) -> bool:
        """True when `name` matches a pattern and no negated pattern."""
        return host_matches(self.patterns, name)

    def describe(self) -> str:
        return describe_key(self.key_type, self.blob)


def host_matches(patterns: Iterable[str], name: str) -> bool:
    """OpenSSH's rule: any positive match, and no matching `!pattern`."""
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if _pattern_matches(pattern[1:] if negated else pattern, name):
            if negated:
                return False
            matched = True
    return matched


def _pattern_matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        return _hashed_matches(pattern, name)
    if "*" not in pattern and "?" not in pattern:
        return pattern.lower() == name.lower()
    return _wildcard_regex(pattern).fullmatch(name.lower()) is not None


def _hashed_matches(pattern: str, name: str) -> bool:
    parts = pattern.split("|")
    if len(parts) != 4:
        return False
    try:
        salt, mac = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), mac)


_REGEX_CACHE: dict[str, re.Pattern[str]] = {}


def _wildcard_regex(pattern: str) -> re.Pattern[str]:
    regex = _REGEX_CACHE.get(pattern)
    if regex is None:
        body = re.escape(pattern.lower()).replace(r"\*", ".*").replace(r"\?", ".")
        regex = _REGEX_CACHE.setdefault(pattern, re.compile(body))
    return regex


def parse_line(line: str, origin: str = "") -> Entry | None:
    """An Entry, or None for blank, comment and unreadable lines (ssh skips those too)."""
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return None
    marker = ""
    if fields[0].startswith("@"):
        marker, fields = fields[0], fields[1:]
        if marker not in (REVOKED, CERT_AUTHORITY):
            return None
    if len(fields) < 3:
        return None
    try:
        blob = base64.b64decode(fields[2], validate=True)
    except (binascii.Error, ValueError):
        return None
    return Entry(tuple(fields[0].split(",")), fields[1], blob, marker, origin)


def parse_text(text: str, path: str = "") -> list[Entry]:
    """Every usable entry of a known_hosts file's text, each with `path:line`."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = parse_line(line, f"{path}:{number}")
        if entry is not None:
            entries.append(entry)
    return entries


def format_line(name: str, key_type: str, blob: bytes, hashed: bool = False) -> str:
    """A known_hosts line for a newly accepted key (no newline)."""
    host = hash_name(name) if hashed else name
    return f"{host} {key_type} {base64.b64encode(blob).decode()}"


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking a host's key: match, unknown, changed or revoked.

    `entry` is the matching, conflicting or revoking known_hosts entry.
    """

    status: str
    entry: Entry | None = None


def check(entries: Iterable[Entry], name: str, key_type: str, blob: bytes) -> Verdict:
    """Judge the key a host offered against the entries for `name`.

    A host with known keys that offers a key not among them has CHANGED, also
    when the known keys are of another type: clusterkit asks for the known types
    first, so a host that cannot offer one is not the host we knew.
    """
    relevant = [e for e in entries if e.marker != CERT_AUTHORITY and e.matches(name)]
    for entry in relevant:
        if entry.marker == REVOKED and entry.blob == blob:
            return Verdict("revoked", entry)
    plain = [e for e in relevant if not e.marker]
    for entry in plain:
        if entry.key_type == key_type and entry.blob == blob:
            return Verdict("match", entry)
    if plain:
        same_type = [e for e in plain if e.key_type == key_type]
        return Verdict("changed", (same_type or plain)[0])
    return Verdict("unknown")


def known_key_types(entries: Iterable[Entry], name: str) -> list[str]:
    """Key types on file for `name`, in file order, without duplicates."""
    types = (e.key_type for e in entries if not e.marker and e.matches(name))
    return list(dict.fromkeys(types))


# One lock for all appends in this process; flock guards against other processes.
_APPEND_LOCK = threading.Lock()


class EntryIndex:
    """One file's entries, indexed by the literal host names they list.

    With one line per node, scanning every entry for every host of a fan-out is
    quadratic. An entry whose positive patterns are all plain names can match
    only those names (negations only narrow it), so it is filed under them;
    hashed and wildcard entries can match any name and are always scanned.
    """

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self._by_name: dict[str, list[int]] = {}
        self._always: list[int] = []
        for index, entry in enumerate(entries):
            positive = [p for p in entry.patterns if not p.startswith("!")]
            if not all(_is_literal(p) for p in positive):
                self._always.append(index)
                continue
            for name in dict.fromkeys(p.lower() for p in positive):
                self._by_name.setdefault(name, []).append(index)

    def candidates(self, name: str) -> list[Entry]:
        """The entries that may match `name`, in file order (`Entry.matches` decides)."""
        indexes = self._by_name.get(name.lower(), [])
        if self._always:
            indexes = sorted(indexes + self._always)
        return [self.entries[i] for i in indexes]


def _is_literal(pattern: str) -> bool:
    """A pattern `_pattern_matches` compares as a plain (case-insensitive) name."""
    return not pattern.startswith("|1|") and "*" not in pattern and "?" not in pattern


def _read_entries(path: str) -> EntryIndex:
    """A known_hosts file's entries; a FIFO or device is never opened (it could block),
    and reads, like a missing file, as no entries: the host is then unknown."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return EntryIndex([])
        with open(path, encoding="utf-8", errors="replace") as handle:
            return EntryIndex(parse_text(handle.read(), path))
    except OSError:
        return EntryIndex([])


_FILES: FileCache[EntryIndex] = FileCache(_read_entries, lambda _path: EntryIndex([]))


def load_file(path: str) -> EntryIndex:
    """Entries of one file (none when it does not exist), re-read only when it changed."""
    return _FILES.get(path)


class KnownHosts:
    """The known_hosts files one host is checked against.

    Reads are cached per file and re-read when a file changes, so many threads
    and many `KnownHosts` share one parse. `accept` appends under a lock and
    re-checks first, so concurrent first connections record a key once.
    """

    def __init__(self, user_files: Iterable[str], global_files: Iterable[str] = ()) -> None:
        self.user_files = tuple(user_files)
        self.global_files = tuple(global_files)

    def entries(self, name: str) -> list[Entry]:
        """The entries of every file that may match `name`, in file order."""
        return [e for path in self.user_files + self.global_files
                for e in load_file(path).candidates(name)]

    def check(self, name: str, key_type: str, blob: bytes) -> Verdict:
        return check(self.entries(name), name, key_type, blob)

    def key_types(self, name: str) -> list[str]:
        return known_key_types(self.entries(name), name)

    @property
    def record_file(self) -> str:
        """Where new keys go: the first user file, like OpenSSH."""
        return self.user_files[0]

    def accept(self, name: str, key_type: str, blob: bytes, hashed: bool = False) -> Verdict:
        """Record an unknown key; returns the verdict it had (match/changed/... if
        another thread recorded or changed it meanwhile, then nothing is written)."""
        with _APPEND_LOCK:
            verdict = self.check(name, key_type, blob)
            if verdict.status == "unknown":
                _append_line(self.record_file, format_line(name, key_type, blob, hashed))
            return verdict


def _append_line(path: str, line: str) -> None:
    """Append one line, creating the file (0600) and its directory (0700) if needed."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    # O_NONBLOCK: a FIFO with no reader fails at once (ENXIO) instead of hanging
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        if handle.tell() > 0 and not _ends_with_newline(path):
            handle.write("\n")
        handle.write(line + "\n")


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def problem_message(verdict: Verdict, name: str, offered: str, files: KnownHosts,
                    hostname: str, port: int) -> str:
    """One line saying why a host key was refused (what to do is `problem_fix`'s).

    `offered` is `describe_key(...)` of the key the host presented.
    """
    head = "host key verification failed:"
    entry = verdict.entry
    if verdict.status == "revoked" and entry is not None:
        return f"{head} {name} offered {offered}, which {entry.origin} marks {REVOKED}"
    if verdict.status == "changed" and entry is not None:
        return (f"{head} REMOTE HOST IDENTIFICATION HAS CHANGED for {name}: it offered {offered}, "
                f"but {entry.origin} has {entry.describe()}; someone could be intercepting the "
                "connection, or the host was reinstalled")
    return (f"{head} {name} is not in {', '.join(files.user_files + files.global_files)} "
            f"(it offered {offered})")


def problem_fix(verdict: Verdict, name: str, files: KnownHosts, hostname: str, port: int) -> str:
    """What to do about a refused host key, said once, with the commands to run."""
    entry = verdict.entry
    scan = _keyscan_command(name, hostname, port, files.record_file)
    if verdict.status == "revoked":
        return ("do not connect: the key was revoked on purpose; ask the node's administrators "
                "for the node's new key")
    if verdict.status == "changed" and entry is not None:
        path = entry.origin.rpartition(":")[0]
        return (f"verify the new fingerprint out of band, then replace the old key: "
                f"`ssh-keygen -R '{name}' -f {path}` and `{_keyscan_command(name, hostname, port, path)}`")
    return f"verify that fingerprint out of band, then run `{scan}`, or {ACCEPT_NEW_IN_PROFILE}"


# The other way to trust a new host: a command without a profile (init) says its own.
ACCEPT_NEW_IN_PROFILE = "set `host_key_policy: accept-new` in the profile's ssh section"


def _keyscan_command(name: str, hostname: str, port: int, record_file: str) -> str:
    """The line that records the host's key; it creates the file's folder when that is missing."""
    port_option = f" -p {port}" if port != 22 else ""
    scan = f"ssh-keyscan{port_option} {hostname}"
    folder = os.path.dirname(record_file)
    mkdir = f"mkdir -p -m 700 {shlex.quote(folder)} && " if folder and not os.path.isdir(folder) else ""
    if name != lookup_name(hostname, port):  # HostKeyAlias: file it under the alias
        return f"{mkdir}{scan} | sed 's/^[^ ]*/{name}/' >> {record_file}"
    return f"{mkdir}ssh-keyscan -H{port_option} {hostname} >> {record_file}"
