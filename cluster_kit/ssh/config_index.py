"""ssh_config files parsed once and indexed by Host pattern."""
from __future__ import annotations

import os
from typing import Any

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.config.textfile import read_text_file
from cluster_kit.errors import InputError
from cluster_kit.ssh.filecache import FileCache


class _LeanSSHConfig(paramiko.SSHConfig):
    """paramiko's SSHConfig, expanding %-tokens and ~ only in values that hold one.

    paramiko works out every token for every value of a host's options: the local
    user, the home directory, a SHA-1, and the local FQDN (`%l`, a reverse DNS
    lookup that takes seconds where DNS is broken, once per host) even when the
    value holds no token. A value without one comes out unchanged either way.
    """

    def _expand_variables(self, config: dict[str, Any], target_hostname: str) -> dict[str, Any]:
        tokenize = self._tokenize  # type: ignore[attr-defined]
        for key, value in config.items():
            if isinstance(value, list):
                config[key] = [tokenize(config, target_hostname, key, v) if _has_token(v) else v for v in value]
            elif _has_token(value):
                config[key] = tokenize(config, target_hostname, key, value)
        return config


def _has_token(value: object) -> bool:
    return isinstance(value, str) and ("%" in value or "~" in value)


class _IndexedConfig:
    """A parsed ssh_config whose lookups read only the blocks that can apply.

    paramiko's `SSHConfig.lookup` walks every block twice per host, and asks the
    OS for the local user name for every block the host does not match (its Match
    support): with one `Host` block per node, a 500-node config cost 3 ms of CPU
    per host, 12 ms where $USER is unset and each of those asks reads the passwd
    database: more than the SSH connection itself. Here blocks whose patterns
    are all literal names are indexed by name; wildcard, negated and `Match`
    blocks are always kept. paramiko then matches and merges that short list in
    file order, so the result is what it would return. A config that
    canonicalizes host names (which re-matches under another name) is looked up
    whole.
    """

    def __init__(self, config: paramiko.SSHConfig) -> None:
        self.config = config
        blocks = getattr(config, "_config", None)  # paramiko's parsed blocks, in file order
        self._blocks: list[dict[str, Any]] = blocks if isinstance(blocks, list) else []
        self._indexed = isinstance(blocks, list) and not any(
            str(b.get("config", {}).get("canonicalizehostname", "no")).lower() in ("yes", "always")
            for b in self._blocks)
        self._by_name: dict[str, list[int]] = {}
        self._always: list[int] = []
        for index, block in enumerate(self._blocks):
            patterns = block.get("host")
            if "matches" in block or not isinstance(patterns, list) or not all(
                    isinstance(p, str) and not any(c in p for c in "*?[!") for p in patterns):
                self._always.append(index)
                continue
            for pattern in dict.fromkeys(os.path.normcase(p) for p in patterns):
                self._by_name.setdefault(pattern, []).append(index)

    def lookup(self, name: str) -> dict[str, Any]:
        """paramiko's options for `name` (an `SSHConfigDict`)."""
        if not self._indexed:
            return self.config.lookup(name)
        wanted = sorted(self._by_name.get(os.path.normcase(name), []) + self._always)
        subset = _LeanSSHConfig()
        subset._config = [self._blocks[i] for i in wanted]  # type: ignore[attr-defined]
        return subset.lookup(name)


def _parse_ssh_config(path: str) -> _IndexedConfig:
    # read as profiles are, so that a FIFO or a device named as config_file cannot hang the command
    text = read_text_file(path, max_line_chars=None, what="ssh_config files")
    try:
        return _IndexedConfig(_LeanSSHConfig.from_text(text))
    except (paramiko.SSHException, ValueError) as exc:
        raise InputError(f"cannot read ssh config {path}: {exc}") from None


def _empty_ssh_config() -> _IndexedConfig:
    return _IndexedConfig(_LeanSSHConfig())


_SSH_CONFIGS = FileCache(_parse_ssh_config, lambda _path: _empty_ssh_config())


def load_ssh_config(path: str | None) -> _IndexedConfig:
    """The parsed ssh_config (empty if absent), parsed once while unchanged."""
    return _SSH_CONFIGS.get(os.path.expanduser(path)) if path else _empty_ssh_config()
