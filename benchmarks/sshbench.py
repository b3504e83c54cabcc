"""What the SSH benchmarks share: the test user, keys, an sshd config, waiting for it.

Each benchmark starts its own OpenSSH sshds on loopback addresses of its own
range and stops them by pid; the user `ckbench` logs in with a fresh key.
"""
from __future__ import annotations

import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

USER = "ckbench"


def ensure_user() -> None:
    """The test user, with an unlocked account (sshd refuses locked ones)."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
    subprocess.run(["usermod", "-p", "*", USER], check=True)


def keygen(path: Path) -> str:
    """A new ed25519 key at `path`; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", USER, "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def sshd_config(directory: Path, address: str, port: int, name: str, extra: str = "") -> str:
    """Key-only sshd for USER on address:port, ready for hundreds of concurrent logins."""
    return f"""\
ListenAddress {address}:{port}
HostKey {directory}/host_ed25519
PidFile {directory}/sshd-{name}.pid
AuthorizedKeysFile {directory}/authorized_keys
AllowUsers {USER}
PermitRootLogin no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 1000:30:1000
MaxSessions 64
UseDNS no
PrintMotd no
PrintLastLog no
X11Forwarding no
{extra}LogLevel ERROR
"""


def wait_listening(address: str, port: int, deadline: float) -> None:
    """Return once something accepts on address:port; exit the benchmark past `deadline`."""
    while True:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"sshd on {address}:{port} did not start") from None
            time.sleep(0.05)


def stop_daemons(daemons: Iterable[subprocess.Popen]) -> None:
    """Terminate every daemon this benchmark started (by its pid), killing what lingers."""
    daemons = list(daemons)
    for daemon in daemons:
        daemon.terminate()
    for daemon in daemons:
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def clusterkit_argv() -> list[str]:
    """The installed `clusterkit` script next to this interpreter, else `python -m`."""
    script = Path(sys.executable).parent / "clusterkit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cluster_kit"]
