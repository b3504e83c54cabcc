"""Authentication: identity files, then ssh-agent; keys only, never a prompt."""
from __future__ import annotations

import os
import stat
import time

import paramiko  # after ssh/deferred.py (ssh/__init__.py)

from cluster_kit.ssh.filecache import FileCache
from cluster_kit.ssh.known_hosts import (
    describe_key,
)
from cluster_kit.ssh.results import HostError, one_line, short_path
from cluster_kit.ssh.settings import (
    Endpoint,
)


def _read_key(path: str) -> tuple[paramiko.PKey | None, str]:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read
            return None, f"{short_path(path)} is not a regular file: point identity_file at the key file"
        return paramiko.PKey.from_path(path), ""
    except (paramiko.PasswordRequiredException, TypeError):
        return None, (f"{short_path(path)} needs a passphrase: load it into ssh-agent "
                      f"(`ssh-add {short_path(path)}`)")
    except (paramiko.SSHException, ValueError, OSError) as exc:
        return None, f"{short_path(path)} is not a usable private key ({one_line(exc)})"


def _missing_key(path: str) -> tuple[paramiko.PKey | None, str]:
    return None, f"{short_path(path)} not found"


# (key, "") or (None, why not); each file is read once while unchanged
_KEYS = FileCache(_read_key, _missing_key)


def authenticate(transport: paramiko.Transport, endpoint: Endpoint, deadline: float) -> None:
    """Public-key auth with each identity file, then each agent key, until one works."""
    tried: list[str] = []
    notes: list[str] = []
    for path in endpoint.identity_files:
        key, problem = _KEYS.get(path)
        if key is None:
            if not (endpoint.default_identities and problem.endswith("not found")):
                notes.append(problem)
            continue
        if _try_key(transport, endpoint, key, short_path(path), tried, deadline):
            return
    use_agent = not endpoint.identities_only and os.environ.get("SSH_AUTH_SOCK")
    if use_agent and _try_agent(transport, endpoint, tried, deadline):
        return
    raise HostError(_auth_failure(endpoint.user, tried, notes, transport.is_active()))


def _try_agent(transport: paramiko.Transport, endpoint: Endpoint, tried: list[str],
               deadline: float) -> bool:
    """Each ssh-agent key in turn; one agent connection per host keeps threads apart."""
    agent = paramiko.Agent()
    try:
        for key in agent.get_keys():
            label = f"agent {describe_key(key.get_name(), key.asbytes())}"
            if _try_key(transport, endpoint, key, label, tried, deadline):
                return True
        return False
    finally:
        agent.close()


def _try_key(transport: paramiko.Transport, endpoint: Endpoint, key: paramiko.PKey,
             label: str, tried: list[str], deadline: float) -> bool:
    """True when `key` authenticated; False when refused (recorded in `tried`)."""
    if not transport.is_active():
        return False
    transport.auth_timeout = max(0.05, deadline - time.monotonic())
    try:
        remaining_methods = transport.auth_publickey(endpoint.user, key)
    except paramiko.BadAuthenticationType as exc:
        raise HostError(f"authentication failed for user {endpoint.user}: the server does not "
                        f"accept keys (it allows: {', '.join(exc.allowed_types)})") from None
    except paramiko.AuthenticationException as exc:
        if "timeout" in str(exc).lower():
            raise HostError(f"no answer within {endpoint.connect_timeout:g}s "
                            f"during authentication ({endpoint.address})") from None
        tried.append(label)
        return False
    if remaining_methods and not transport.is_authenticated():
        raise HostError(f"authentication failed for user {endpoint.user}: the server also wants "
                        f"{', '.join(remaining_methods)}, and clusterkit uses keys only")
    return True


def _auth_failure(user: str, tried: list[str], notes: list[str], still_connected: bool) -> str:
    """`authentication failed for user X (tried: ...)` with the reasons keys were skipped."""
    parts = [f"tried: {', '.join(tried)}" if tried else "no usable key"]
    parts += notes
    if not still_connected:
        parts.append("the server closed the connection (MaxAuthTries?)")
    return f"authentication failed for user {user} ({'; '.join(parts)})"
