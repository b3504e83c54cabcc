"""Where and how to reach one SSH host: profile settings merged with ssh_config.

Pure data in, data out: `resolve_endpoint` takes the options ssh_config gives for
a host (a plain mapping, as paramiko's `SSHConfig.lookup` returns it) and the
profile's settings, and applies OpenSSH's precedence: values set on the command
line win over the config file, and the profile plays the command line's part.
No paramiko here; `ssh/config_index.py` parses ssh_config and `ssh/connect.py` does the network.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster_kit.config import spec as config_spec
from cluster_kit.config import specs
from cluster_kit.errors import InputError
from cluster_kit.ssh.known_hosts import lookup_name

DEFAULT_PORT = 22
DEFAULT_IDENTITY_FILES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
SETTING_KEYS = (
    "user", "port", "identity_file", "proxy_jump", "known_hosts", "host_key_policy",
    "connect_timeout", "command_timeout", "fanout", "config_file",
)
# `login:` sections also name the host; that is the caller's business, not ours.
IGNORED_PROFILE_KEYS = ("host",)
@dataclass(frozen=True)
class SshSettings:
    """How clusterkit reaches hosts; a profile's `ssh:` or `login:` section.

    None means "not set": ssh_config's value applies, then OpenSSH's default.
    `connect_timeout` is an upper bound: a lower ConnectTimeout in ssh_config wins.
    """

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    known_hosts: str | None = None
    host_key_policy: str = "strict"
    connect_timeout: float = 10
    command_timeout: float = 60
    fanout: int = 64
    config_file: str | None = "~/.ssh/config"

    @classmethod
    def from_profile(cls, section: Mapping[str, Any] | None) -> SshSettings:
        """Settings from a profile section; raises InputError for bad keys or values.

        The keys and their rules are config/specs.py's (`ssh:` and `login:`), the one
        place that validates them; loaded profiles have passed it with FILE:LINE.
        """
        section = dict(section or {})
        unknown = sorted(k for k in section if k not in SETTING_KEYS + IGNORED_PROFILE_KEYS)
        if unknown:
            raise InputError(f"unknown ssh setting(s): {', '.join(unknown)}",
                             fix=f"valid keys: {', '.join(SETTING_KEYS)}")
        values = {k: v for k, v in section.items() if k in SETTING_KEYS and v is not None}
        for key, value in values.items():
            problem = _SETTING_SPECS[key].check(value)
            if problem:
                raise InputError(f"ssh {key}: {problem}")
        for key in ("connect_timeout", "command_timeout"):
            if key in values:
                values[key] = float(values[key])
        parse_proxy_jump(values.get("proxy_jump"))  # a malformed chain is an input error now
        return cls(**values)


_SETTING_SPECS = {key: spec for key, spec in {**specs.SSH.fields, **specs.LOGIN.fields}.items()
                  if isinstance(spec, config_spec.Field)}


@dataclass(frozen=True)
class Hop:
    """One host of a ProxyJump chain: `[user@]host[:port]`."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        text = f"{self.user}@{self.host}" if self.user else self.host
        return f"{text}:{self.port}" if self.port else text


def parse_proxy_jump(text: str | None) -> tuple[Hop, ...]:
    """ProxyJump's comma-separated `[user@]host[:port]` list; "none" means no jump."""
    if text is None or text.strip().lower() in ("", "none"):
        return ()
    return tuple(parse_hop(part) for part in text.split(","))


def parse_hop(text: str) -> Hop:
    """One `[ssh://][user@]host[:port]` (IPv6 in brackets); InputError if malformed."""
    spec = text.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):].rstrip("/")
    user, _, hostport = spec.rpartition("@")
    host, port = _split_host_port(hostport)
    if not host or any(c.isspace() for c in host):
        raise InputError(f"bad ProxyJump host {text!r}", fix="write it as [user@]host[:port]")
    return Hop(host=host, user=user or None, port=port)


def _split_host_port(text: str) -> tuple[str, int | None]:
    """`host`, `host:port`, `[v6]`, `[v6]:port` -> (host, port or None)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InputError(f"bad port in ProxyJump host {text!r}")
    return host, int(port_text)


@dataclass(frozen=True)
class Endpoint:
    """Everything needed to connect to one host, resolved like OpenSSH would."""

    name: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    default_identities: bool
    identities_only: bool
    proxy_jump: tuple[Hop, ...]
    user_known_hosts: tuple[str, ...]
    global_known_hosts: tuple[str, ...]
    host_key_alias: str | None
    hash_known_hosts: bool
    connect_timeout: float

    @property
    def host_key_name(self) -> str:
        """The name known_hosts files list this host's key under."""
        return lookup_name(self.hostname, self.port, self.host_key_alias)

    @property
    def address(self) -> str:
        """`hostname port N` for messages."""
        return f"{self.hostname} port {self.port}"


def resolve_endpoint(
    name: str,
    options: Mapping[str, Any],
    settings: SshSettings,
    local_user: str,
    hop: Hop | None = None,
) -> Endpoint:
    """Merge ssh_config `options` for `name` with the profile `settings`.

    For the target host the profile wins over ssh_config (it plays the part of
    ssh's command line). For a jump host (`hop` given) the hop's own user/port
    win, then ssh_config, then the profile's user; ProxyJump of a jump host is
    ssh_config's only, as OpenSSH does for the first host of a chain.
    """
    is_jump = hop is not None
    user = (hop.user if hop else None) if is_jump else settings.user
    port = (hop.port if hop else None) if is_jump else settings.port
    identities = _identity_files(options, settings.identity_file)
    jump_text = options.get("proxyjump") if is_jump or settings.proxy_jump is None else settings.proxy_jump
    return Endpoint(
        name=name,
        hostname=str(options.get("hostname") or name),
        port=port or _int_option(options, "port") or DEFAULT_PORT,
        user=user or options.get("user") or settings.user or local_user,
        identity_files=identities or _expand_all(DEFAULT_IDENTITY_FILES),
        default_identities=not identities,
        identities_only=_yes(options.get("identitiesonly")),
        proxy_jump=parse_proxy_jump(jump_text),
        user_known_hosts=_known_hosts_files(options, settings.known_hosts),
        global_known_hosts=_expand_all(_split_paths(options.get("globalknownhostsfile"))
                                       or DEFAULT_GLOBAL_KNOWN_HOSTS),
        host_key_alias=options.get("hostkeyalias") or None,
        hash_known_hosts=_yes(options.get("hashknownhosts")),
        connect_timeout=_connect_timeout(options, settings.connect_timeout),
    )


def _identity_files(options: Mapping[str, Any], profile_file: str | None) -> tuple[str, ...]:
    """The profile's identity file first (like `ssh -i`), then ssh_config's, no duplicates."""
    configured = options.get("identityfile") or []
    if isinstance(configured, str):
        configured = [configured]
    candidates = ([profile_file] if profile_file else []) + list(configured)
    return tuple(dict.fromkeys(_expand_all(candidates)))


def _known_hosts_files(options: Mapping[str, Any], profile_file: str | None) -> tuple[str, ...]:
    """User known_hosts files; the first is where accept-new records keys."""
    if profile_file:
        return (os.path.expanduser(profile_file),)
    return _expand_all(_split_paths(options.get("userknownhostsfile")) or DEFAULT_USER_KNOWN_HOSTS)


def _connect_timeout(options: Mapping[str, Any], profile_timeout: float) -> float:
    """The profile's timeout, or ssh_config's ConnectTimeout when that is lower."""
    configured = _int_option(options, "connecttimeout")
    return float(min(profile_timeout, configured)) if configured else float(profile_timeout)


def _int_option(options: Mapping[str, Any], key: str) -> int | None:
    value = options.get(key)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        raise InputError(f"ssh_config: {key} must be a number, not {value!r}") from None


def _split_paths(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(p for item in value for p in str(item).split())
    return tuple(str(value).split())


def _expand_all(paths: Any) -> tuple[str, ...]:
    return tuple(os.path.expanduser(str(p)) for p in paths)


def _yes(value: Any) -> bool:
    return str(value).lower() in ("yes", "true")


def unresolved_fix(hostname: str, where: str = "this machine") -> str:
    """What to do about a node name that does not resolve (on this machine or a jump host)."""
    return (f"{hostname} does not resolve on {where}: check the name's spelling, its DNS entry or "
            "/etc/hosts line, or give it a HostName in the ssh_config (ssh.config_file)")
