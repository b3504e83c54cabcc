"""Pure parts of the SSH edge: known_hosts rules, ssh_config precedence, messages.

Key lines and fingerprints below were made by OpenSSH's ssh-keygen (`-H` for the
hashed line, `-l` for the fingerprints), so they check compatibility, not just us.
"""
from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import paramiko
import pytest

from cluster_kit.errors import InputError
from cluster_kit.ssh import auth, config_index, deferred, fanout, hosts, results
from cluster_kit.ssh import known_hosts as kh
from cluster_kit.ssh.settings import (
    Hop,
    SshSettings,
    parse_proxy_jump,
    resolve_endpoint,
)

KEY1 = "AAAAC3NzaC1lZDI1NTE5AAAAIEjTCF+gjsncUMyF8P0u1knZmhGAQwfG75aN7MBJ3FzV"
KEY1_FP = "SHA256:/BuK56/nbFlXXkvD6U1vYLcH8w0Whh6WKE10v1YBMvQ"
KEY2 = "AAAAC3NzaC1lZDI1NTE5AAAAIIdLVKbPjlPKcgT6okjc7uGZVBuGx6xp4YMkc+MqAYhn"
KEY2_FP = "SHA256:w2QuS6+o9EycuCDuefJj39B6G0hxc0H/v+QNgdsGOZM"
HASHED_GPU001 = "|1|SVuthhYBa0/WF5+eud9OF6n44Qs=|XsZNrCKlQMvDfg3Nb5Q3ySd7aIw="
BLOB1, BLOB2 = base64.b64decode(KEY1), base64.b64decode(KEY2)
ED = "ssh-ed25519"


# --- known_hosts ----------------------------------------------------------------


@pytest.mark.parametrize(("host", "port", "alias", "name"), [
    ("gpu001", 22, None, "gpu001"),
    ("GPU001.Cluster", 22, None, "gpu001.cluster"),
    ("10.0.0.5", 2222, None, "[10.0.0.5]:2222"),
    ("gpu001", 2222, "gpu001-bmc", "gpu001-bmc"),
])
def test_lookup_name_follows_openssh(host: str, port: int, alias: str | None, name: str) -> None:
    assert kh.lookup_name(host, port, alias) == name


def test_fingerprints_match_ssh_keygen() -> None:
    assert kh.fingerprint(BLOB1) == KEY1_FP
    assert kh.describe_key(ED, BLOB2) == f"ED25519 key {KEY2_FP}"


def test_hashed_entry_written_by_ssh_keygen_matches_its_host_only() -> None:
    entry = kh.parse_line(f"{HASHED_GPU001} {ED} {KEY1}")
    assert entry is not None
    assert entry.matches("gpu001")
    assert not entry.matches("gpu002")


def test_patterns_wildcards_negation_and_ports() -> None:
    entry = kh.parse_line(f"gpu*.cluster,!gpu013.cluster,[login?]:2222 {ED} {KEY1}")
    assert entry is not None
    assert entry.matches("gpu001.cluster") and entry.matches("GPU002.cluster")
    assert not entry.matches("gpu013.cluster")
    assert entry.matches("[login1]:2222")
    assert not entry.matches("login1") and not entry.matches("[login10]:2222")


def test_unusable_lines_are_skipped_like_ssh_does() -> None:
    text = "\n".join([
        "# comment", "", "gpu001", f"gpu001 {ED} not*base64",
        f"@unknown-marker gpu001 {ED} {KEY1}",
        f"gpu002 {ED} {KEY2}",
    ])
    entries = kh.parse_text(text, "/k")
    assert [(e.patterns, e.origin) for e in entries] == [(("gpu002",), "/k:6")]


def test_check_verdicts() -> None:
    entries = kh.parse_text("\n".join([
        f"gpu001 {ED} {KEY1}",
        f"gpu002 {ED} {KEY1}",
        f"@revoked * {ED} {KEY2}",
        f"@cert-authority *.cluster {ED} {KEY2}",
    ]), "/k")
    assert kh.check(entries, "gpu001", ED, BLOB1).status == "match"
    assert kh.check(entries, "gpu003", ED, BLOB1).status == "unknown"
    assert kh.check(entries, "gpu003", ED, BLOB2).status == "revoked"
    changed = kh.check(entries[:2], "gpu002", ED, BLOB2)
    assert (changed.status, changed.entry and changed.entry.origin) == ("changed", "/k:2")


def test_a_known_key_of_another_type_counts_as_changed() -> None:
    entries = kh.parse_text(f"gpu001 ssh-rsa {KEY1}", "/k")
    assert kh.check(entries, "gpu001", ED, BLOB2).status == "changed"
    assert kh.known_key_types(entries, "gpu001") == ["ssh-rsa"]


def test_index_looks_at_a_hosts_own_lines_and_the_patterned_ones() -> None:
    index = kh.EntryIndex(kh.parse_text("\n".join([
        f"gpu001,GPU002 {ED} {KEY1}",
        f"gpu* {ED} {KEY2}",
        f"gpu003,!gpu001 {ED} {KEY2}",
        f"{HASHED_GPU001} {ED} {KEY1}",
        f"gpu001 ssh-rsa {KEY2}",
    ]), "/k"))
    assert [e.origin for e in index.candidates("GPU001")] == ["/k:1", "/k:2", "/k:4", "/k:5"]
    assert [e.origin for e in index.candidates("gpu002")] == ["/k:1", "/k:2", "/k:4"]
    assert [e.origin for e in index.candidates("login1")] == ["/k:2", "/k:4"]


@pytest.mark.parametrize("name", ["gpu001", "GPU002", "gpu003", "gpu013", "[gpu001]:2222",
                                  "login1", "x"])
def test_indexed_verdicts_are_the_full_scans(tmp_path: Path, name: str) -> None:
    text = "\n".join([
        f"gpu001,gpu002 {ED} {KEY1}",
        f"[gpu001]:2222 ssh-rsa {KEY2}",
        f"gpu0?3,!gpu013 {ED} {KEY2}",
        f"@revoked gpu002 {ED} {KEY1}",
        f"{HASHED_GPU001} ssh-rsa {KEY1}",
        f"@cert-authority * {ED} {KEY2}",
        f"!gpu001 {ED} {KEY2}",
    ])
    path = tmp_path / "known_hosts"
    path.write_text(text)
    store, entries = kh.KnownHosts([str(path)]), kh.parse_text(text, str(path))
    for key_type, blob in [(ED, BLOB1), (ED, BLOB2), ("ssh-rsa", BLOB1)]:
        assert store.check(name, key_type, blob) == kh.check(entries, name, key_type, blob)
    assert store.key_types(name) == kh.known_key_types(entries, name)


def test_accept_appends_once_and_reads_its_own_write(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "known_hosts"
    store = kh.KnownHosts([str(path)])
    assert store.accept("[gpu001]:2222", ED, BLOB1).status == "unknown"
    assert store.accept("[gpu001]:2222", ED, BLOB1).status == "match"
    assert store.accept("[gpu001]:2222", ED, BLOB2).status == "changed"
    assert path.read_text() == f"[gpu001]:2222 {ED} {KEY1}\n"
    assert path.stat().st_mode & 0o777 == 0o600


def test_accept_adds_a_newline_to_a_file_that_lacks_one(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(f"gpu001 {ED} {KEY1}")
    kh.KnownHosts([str(path)]).accept("gpu002", ED, BLOB2)
    assert path.read_text().splitlines() == [f"gpu001 {ED} {KEY1}", f"gpu002 {ED} {KEY2}"]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_hashed_lines_we_write_are_found_by_ssh_keygen(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    kh.KnownHosts([str(path)]).accept("gpu042", ED, BLOB1, hashed=True)
    assert path.read_text().startswith("|1|")
    found = subprocess.run(["ssh-keygen", "-F", "gpu042", "-f", str(path)],
                           capture_output=True, text=True, check=False)
    assert found.returncode == 0 and KEY1 in found.stdout


@pytest.fixture
def ssh_dir(tmp_path: Path) -> Path:
    """An existing ~/.ssh-like folder (a keyscan line into it needs no mkdir)."""
    folder = tmp_path / ".ssh"
    folder.mkdir(mode=0o700)
    return folder


def test_messages_name_the_host_the_fingerprints_and_the_fix(ssh_dir: Path) -> None:
    store = kh.KnownHosts([f"{ssh_dir}/known_hosts"], ["/etc/ssh/ssh_known_hosts"])
    offered = kh.describe_key(ED, BLOB2)
    unknown = kh.problem_message(kh.Verdict("unknown"), "[gpu001]:2222", offered, store, "gpu001", 2222)
    assert unknown.startswith("host key verification failed: [gpu001]:2222 is not in")
    assert KEY2_FP in unknown
    unknown_fix = kh.problem_fix(kh.Verdict("unknown"), "[gpu001]:2222", store, "gpu001", 2222)
    assert f"`ssh-keyscan -H -p 2222 gpu001 >> {ssh_dir}/known_hosts`" in unknown_fix
    assert "accept-new" in unknown_fix
    old = kh.parse_line(f"gpu001 {ED} {KEY1}", f"{ssh_dir}/known_hosts:7")
    changed = kh.problem_message(kh.Verdict("changed", old), "gpu001", offered, store, "gpu001", 22)
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED for gpu001" in changed
    assert KEY1_FP in changed and KEY2_FP in changed and "known_hosts:7" in changed
    assert "\n" not in unknown + changed


def test_changed_key_says_its_fix_once_with_the_commands(ssh_dir: Path) -> None:
    store = kh.KnownHosts([f"{ssh_dir}/known_hosts"])
    old = kh.parse_line(f"gpu001 {ED} {KEY1}", f"{ssh_dir}/known_hosts:7")
    verdict = kh.Verdict("changed", old)
    message = kh.problem_message(verdict, "gpu001", kh.describe_key(ED, BLOB2), store, "gpu001", 22)
    fix = kh.problem_fix(verdict, "gpu001", store, "gpu001", 22)
    # the message says what happened, the fix what to do: nothing of the fix in the message
    assert "verify" not in message and "ssh-keygen" not in message and "ssh-keyscan" not in message
    assert fix.count("verify") == 1
    assert fix == ("verify the new fingerprint out of band, then replace the old key: "
                   f"`ssh-keygen -R 'gpu001' -f {ssh_dir}/known_hosts` and "
                   f"`ssh-keyscan -H gpu001 >> {ssh_dir}/known_hosts`")


def test_a_keyscan_line_into_a_missing_folder_creates_it_first(tmp_path: Path) -> None:
    """`init` on a fresh machine: ~/.ssh does not exist yet, and `>>` alone would fail."""
    record = tmp_path / "home" / ".ssh" / "known_hosts"
    fix = kh.problem_fix(kh.Verdict("unknown"), "ib-ok", kh.KnownHosts([str(record)]), "ib-ok", 22)
    assert f"`mkdir -p -m 700 {record.parent} && ssh-keyscan -H ib-ok >> {record}`" in fix
    assert fix.endswith(f"or {kh.ACCEPT_NEW_IN_PROFILE}")


def test_alias_fix_files_the_key_under_the_alias() -> None:
    store = kh.KnownHosts(["/kh"])
    text = kh.problem_fix(kh.Verdict("unknown"), "bmc-alias", store, "10.0.0.9", 22)
    assert "ssh-keyscan 10.0.0.9 | sed 's/^[^ ]*/bmc-alias/' >> /kh" in text


# --- settings and ssh_config precedence ---------------------------------------------


def test_settings_from_a_profile_section() -> None:
    settings = SshSettings.from_profile({"host": "login01", "user": "alice", "port": 2222,
                                         "connect_timeout": 5, "fanout": 16,
                                         "host_key_policy": "accept-new"})
    assert (settings.user, settings.port, settings.connect_timeout, settings.fanout) == ("alice", 2222, 5.0, 16)
    assert SshSettings.from_profile(None) == SshSettings()


def test_unset_profile_values_leave_room_for_ssh_config() -> None:
    settings = SshSettings.from_profile({"port": None, "known_hosts": None, "identity_file": None})
    assert (settings.port, settings.known_hosts, settings.identity_file) == (None, None, None)
    ep = resolve_endpoint("gpu001", {"port": "2222", "userknownhostsfile": "/cfg/kh"}, settings, "me")
    assert (ep.port, ep.user_known_hosts) == (2222, ("/cfg/kh",))


def test_explicit_profile_port_22_overrides_ssh_config() -> None:
    settings = SshSettings.from_profile({"port": 22})
    ep = resolve_endpoint("gpu001", {"port": "2222"}, settings, "me")
    assert ep.port == 22


@pytest.mark.parametrize("section", [
    {"host_key_policy": "no"}, {"fanout": 0}, {"port": "ssh"}, {"conect_timeout": 3},
    {"command_timeout": True},
])
def test_bad_profile_settings_are_input_errors(section: dict[str, object]) -> None:
    with pytest.raises(InputError):
        SshSettings.from_profile(section)


def test_proxy_jump_specs() -> None:
    assert parse_proxy_jump("none") == ()
    assert parse_proxy_jump("bastion,alice@login01:2222,[fe80::1]:22,ssh://bob@gw") == (
        Hop("bastion"), Hop("login01", "alice", 2222), Hop("fe80::1", None, 22), Hop("gw", "bob"))
    with pytest.raises(InputError):
        parse_proxy_jump("login01:notaport")


def test_profile_wins_over_ssh_config_like_the_command_line() -> None:
    options = {"hostname": "10.0.0.5", "user": "cfguser", "port": "2200",
               "identityfile": ["/cfg/id"], "proxyjump": "cfgjump", "connecttimeout": "30"}
    settings = SshSettings(user="alice", port=22, identity_file="/p/id", proxy_jump="bastion",
                           known_hosts="/p/kh", connect_timeout=10)
    ep = resolve_endpoint("gpu001", options, settings, "local")
    assert (ep.hostname, ep.user, ep.port) == ("10.0.0.5", "alice", 22)
    assert ep.identity_files == ("/p/id", "/cfg/id") and not ep.default_identities
    assert ep.proxy_jump == (Hop("bastion"),)
    assert ep.user_known_hosts == ("/p/kh",) and ep.connect_timeout == 10


def test_ssh_config_fills_what_the_profile_leaves_open() -> None:
    options = {"hostname": "10.0.0.5", "user": "cfguser", "port": "2200", "hostkeyalias": "n5",
               "connecttimeout": "3", "userknownhostsfile": "/a/kh /b/kh", "proxyjump": "none"}
    ep = resolve_endpoint("gpu001", options, SshSettings(), "local")
    assert (ep.user, ep.port, ep.host_key_name) == ("cfguser", 2200, "n5")
    assert ep.connect_timeout == 3 and ep.user_known_hosts == ("/a/kh", "/b/kh")
    assert ep.proxy_jump == () and ep.default_identities


def test_a_jump_host_uses_its_own_spec_then_config_then_profile_user() -> None:
    settings = SshSettings(user="alice", port=2222, proxy_jump="login01")
    ep = resolve_endpoint("login01", {"proxyjump": "bastion"}, settings, "local", hop=Hop("login01"))
    assert (ep.user, ep.port, ep.proxy_jump) == ("alice", 22, (Hop("bastion"),))
    ep = resolve_endpoint("login01", {"user": "ops"}, settings, "local", hop=Hop("login01", "root", 2022))
    assert (ep.user, ep.port) == ("root", 2022)


# --- ssh_config lookups -------------------------------------------------------------

# Literal, wildcard, negated, bracket, multi-name and Match blocks, an IdentityFile
# list built from several blocks, and a global section before the first Host.
MIXED_CONFIG = """\
ConnectTimeout 7
Host gpu001 gpu002
    HostName 10.0.0.1
    IdentityFile ~/.ssh/first
Host gpu*
    User gpuuser
    IdentityFile ~/.ssh/second
Host !gpu002 gpu00?
    Port 2201
Host gpu00[34]
    HostKeyAlias bracketed
Match user gpuuser
    ForwardAgent yes
Host gpu001
    User late
    Port 2299
Host login
    ProxyJump none
Host GPU005
    User upper
Host *
    User fallback
    ServerAliveInterval 9
"""


@pytest.mark.parametrize("name", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu005", "GPU005",
                                  "gpu0010", "login", "other", "10.0.0.1"])
def test_indexed_config_lookup_is_paramikos(name: str) -> None:
    config = paramiko.SSHConfig.from_text(MIXED_CONFIG)
    assert config_index._IndexedConfig(config).lookup(name) == config.lookup(name)


def test_indexed_config_looks_at_a_hosts_own_blocks_only() -> None:
    text = "".join(f"Host b{i:03d}\n    HostName 127.0.7.{i % 8 + 1}\n" for i in range(1, 501))
    indexed = config_index._IndexedConfig(paramiko.SSHConfig.from_text(text + "Host *\n    User u\n"))
    assert indexed.lookup("b250") == {"hostname": "127.0.7.3", "user": "u"}
    assert len(indexed._by_name) == 500 and len(indexed._always) == 2  # global section, Host *


TOKEN_CONFIG = MIXED_CONFIG + """\
Host tok*
    IdentityFile ~/.ssh/id_%r_%h
    IdentityFile /keys/plain
    ControlPath /tmp/cm-%C-%l
    ProxyCommand ssh -W %h:%p bastion-%u
    HostName %h.cluster.example
    User %d
"""


@pytest.mark.parametrize("name", ["tok1", "gpu001", "login", "other"])
def test_lean_config_expands_every_token_paramiko_does(name: str) -> None:
    expected = paramiko.SSHConfig.from_text(TOKEN_CONFIG).lookup(name)
    assert config_index._LeanSSHConfig.from_text(TOKEN_CONFIG).lookup(name) == expected
    assert config_index._IndexedConfig(config_index._LeanSSHConfig.from_text(TOKEN_CONFIG)).lookup(name) == expected


def test_lean_config_asks_for_the_local_fqdn_only_where_a_value_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko resolves the local FQDN (%l, reverse DNS) for every host's IdentityFile."""
    asked: list[str] = []
    monkeypatch.setattr(socket, "getfqdn", lambda *a: asked.append("fqdn") or "laptop.example")
    plain = "Host b*\n    IdentityFile /keys/id_ed25519\n    User u\n"
    paramiko.SSHConfig.from_text(plain).lookup("b001")
    assert asked, "paramiko itself no longer asks: the lean config can go"
    asked.clear()
    assert config_index._LeanSSHConfig.from_text(plain).lookup("b001")["identityfile"] == ["/keys/id_ed25519"]
    assert asked == []
    lean = config_index._LeanSSHConfig.from_text("Host b*\n    IdentityFile /keys/%l\n")
    assert lean.lookup("b001")["identityfile"] == ["/keys/laptop.example"] and asked == ["fqdn"]


def test_canonicalizing_configs_are_looked_up_whole() -> None:
    text = "CanonicalizeHostname yes\nCanonicalDomains example.invalid\nHost a\n    User x\n"
    config = paramiko.SSHConfig.from_text(text)
    indexed = config_index._IndexedConfig(config)
    assert not indexed._indexed and indexed.lookup("a") == config.lookup("a")


# --- messages of the SSH edge ------------------------------------------------------------


def test_unrecognised_failures_become_one_categorised_line() -> None:
    assert hosts.describe_error(TimeoutError()).startswith("no answer")
    assert hosts.describe_error(EOFError()).startswith("connection lost")
    assert hosts.describe_error(paramiko.SSHException("bad\npacket")) == "ssh error: bad packet"
    assert hosts.describe_error(KeyError("x")).startswith("unexpected error: KeyError")


def test_auth_failure_lists_what_was_tried_and_why_keys_were_skipped() -> None:
    text = auth._auth_failure("alice", ["~/.ssh/id_ed25519", "agent ED25519 key SHA256:x"],
                                ["~/.ssh/id_rsa needs a passphrase: load it into ssh-agent"], False)
    assert text.startswith("authentication failed for user alice (tried: ~/.ssh/id_ed25519, agent")
    assert "needs a passphrase" in text and "MaxAuthTries" in text


def test_host_result_reached_and_ok() -> None:
    answered = results.HostResult("n1", False, 3, "", "boom", None, 0.1)
    unreachable = results.HostResult("n2", False, None, "", "", "connection refused (n2 port 22)", 0.1)
    assert answered.reached and not unreachable.reached


def test_invoke_is_imported_only_when_match_exec_needs_it() -> None:
    """paramiko.config imports invoke at import time; ssh/deferred.py defers it (start-up
    and exit cost), and paramiko still reaches the real module when it runs."""
    code = ("import sys, cluster_kit.ssh.fanout, paramiko.config as c\n"
            "assert 'invoke.context' not in sys.modules, 'invoke was imported'\n"
            "run = c.invoke.run\n"
            "assert 'invoke.context' in sys.modules and run.__module__.startswith('invoke')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr


def test_a_deferred_module_that_is_missing_stays_an_import_error() -> None:
    deferred._defer_import("clusterkit_no_such_module")
    assert "clusterkit_no_such_module" not in sys.modules
    with pytest.raises(ImportError):
        __import__("clusterkit_no_such_module")


def test_split_fanout_gives_every_connection_to_one_process() -> None:
    assert fanout.split_fanout(64, 2) == [32, 32]
    assert fanout.split_fanout(33, 2) == [17, 16]
    assert fanout.split_fanout(50, 3) == [17, 17, 16]
    assert sum(fanout.split_fanout(1000, 7)) == 1000


def test_process_count_is_one_unless_asked_and_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "_ssh_threads_running", lambda: False)
    assert fanout.process_count(SshSettings(fanout=64), 1000) == 1
    monkeypatch.setattr(fanout, "fanout_processes", 3)
    assert fanout.process_count(SshSettings(fanout=64), 1000) == 3
    assert fanout.process_count(SshSettings(fanout=2), 1000) == 2  # never more than the fan-out
    assert fanout.process_count(SshSettings(fanout=64), 2) == 2  # nor than the hosts
    assert fanout.process_count(SshSettings(fanout=64, host_key_policy="accept-new"), 1000) == 1
    monkeypatch.setattr(fanout, "_ssh_threads_running", lambda: True)
    assert fanout.process_count(SshSettings(fanout=64), 1000) == 1


def test_frames_come_out_whole_however_the_pipe_cuts_them() -> None:
    result = results.HostResult("n1", True, 0, "out\n", "", None, 0.25)
    messages = [("result", 3, result), ("timeline", "n1", 1.5, [("tcp", 1.6)]), ("result", 0, result)]
    stream = b"".join(fanout.FrameReader.frame(m) for m in messages)
    for cut in (1, 3, 4, 5, 17, len(stream)):
        reader = fanout.FrameReader()
        got: list[object] = []
        for start in range(0, len(stream), cut):
            got += reader.feed(stream[start:start + cut])
        assert got == messages, cut
        assert reader.pending == 0
    reader = fanout.FrameReader()
    assert reader.feed(stream[:-1]) == messages[:2]
    assert reader.pending > 0  # the last one waits for its final byte


def test_settings_keys_are_the_profile_schema_keys() -> None:
    from cluster_kit.config import specs
    from cluster_kit.ssh import settings as sshconfig

    assert set(sshconfig.SETTING_KEYS) | {"host"} == set(specs.SSH.fields) | set(specs.LOGIN.fields)


def run_bounded(target: Any, *args: Any) -> Any:
    """Call target(*args) in a thread; fail (not hang) when it does not return in 5 s."""
    import threading
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(target(*args)), daemon=True)
    thread.start()
    thread.join(5)
    assert box, f"{target.__name__} blocked on {args}"
    return box[0]


def test_a_fifo_as_known_hosts_or_identity_file_never_blocks(tmp_path: Path) -> None:
    import os
    fifo = tmp_path / "known_hosts"
    os.mkfifo(fifo)  # nobody ever writes to it: a plain open() would wait forever
    assert run_bounded(kh._read_entries, str(fifo)).entries == []
    key, why = run_bounded(auth._read_key, str(fifo))
    assert key is None and why.endswith("is not a regular file: point identity_file at the key file")
    # recording a key into it fails at once (ENXIO: no reader) instead of hanging
    assert isinstance(run_bounded(_raises, kh._append_line, str(fifo), "h ssh-ed25519 AAAA"), OSError)


def _raises(call: Any, *args: Any) -> Any:
    try:
        call(*args)
    except OSError as exc:
        return exc
    return None


def test_aes_gcm_is_asked_for_first_and_nothing_is_added() -> None:
    from cluster_kit.ssh.connect import cipher_preference

    ours = cipher_preference(paramiko.Transport._preferred_ciphers)
    assert ours[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert sorted(ours) == sorted(paramiko.Transport._preferred_ciphers)
    assert cipher_preference(["aes256-ctr", "aes128-ctr"]) == ("aes256-ctr", "aes128-ctr")
