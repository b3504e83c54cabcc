"""The shared state of one call: settings, parsed ssh_config, jump hosts."""
from __future__ import annotations

import getpass
import os

from cluster_kit.ssh.config_index import load_ssh_config
from cluster_kit.ssh.jumps import JumpPool
from cluster_kit.ssh.settings import (
    Endpoint,
    Hop,
    SshSettings,
    resolve_endpoint,
)


def _local_user() -> str:
    """The user ssh would log in as by default."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry, e.g. in some containers
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


class Context:
    """What every host of one call shares: settings, parsed ssh_config, jump hosts."""

    def __init__(self, settings: SshSettings) -> None:
        self.settings = settings
        self.ssh_config = load_ssh_config(settings.config_file)
        self.local_user = _local_user()
        self.jumps = JumpPool(self.endpoint, settings.host_key_policy)

    def endpoint(self, name: str, hop: Hop | None = None) -> Endpoint:
        options = self.ssh_config.lookup(name)
        return resolve_endpoint(name, options, self.settings, self.local_user, hop)

    def close(self) -> None:
        self.jumps.close()
