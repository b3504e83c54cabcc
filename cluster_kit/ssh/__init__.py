"""SSH: the only paramiko user: settings, known_hosts, connect, jumps, exec, fan-out, session."""

# Before any module of this package imports paramiko (see deferred.py).
from cluster_kit.ssh import deferred as _deferred  # noqa: F401
