"""ssh/ against real OpenSSH servers on 127.0.5.x (started and stopped here).

Lab (module fixture): sshd A on 127.0.5.1:22 (also the jump host, debug log),
B on 127.0.5.2:2222, C on 127.0.5.3:22 whose known_hosts line carries A's key
(a "changed" host), T on 127.0.5.6:22 (the jump target), nothing on 127.0.5.4
(refused) and a TCP listener on 127.0.5.5:22 that never says a word.
"""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cluster_kit.errors import SshConnectError
from cluster_kit.ssh import HostResult, SshSettings, fanout
from cluster_kit.ssh import session as ssh_session

pytestmark = pytest.mark.integration

SSHD = "/usr/sbin/sshd"
USER = "ckremote"
A, B, C, REFUSED, SILENT, TARGET = (
    "127.0.5.1", "127.0.5.2", "127.0.5.3", "127.0.5.4", "127.0.5.5", "127.0.5.6")
B_PORT = 2222


@dataclass
class Lab:
    dir: Path
    key: str
    wrong_key: str
    locked_key: str
    known_hosts: Path
    config: Path
    host_keys: dict[str, str]  # name -> public key line
    jump_log: Path

    def settings(self, **changes: object) -> SshSettings:
        base = SshSettings(user=USER, identity_file=self.key, known_hosts=str(self.known_hosts),
                           config_file=str(self.config), connect_timeout=3, command_timeout=10,
                           fanout=32)
        return replace(base, **changes)  # type: ignore[arg-type]

    def fingerprint(self, name: str) -> str:
        out = subprocess.run(["ssh-keygen", "-lf", str(self.dir / f"hk_{name}.pub")],
                             capture_output=True, text=True, check=True).stdout
        return out.split()[1]


def _keygen(path: Path, passphrase: str = "") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "", "-f", str(path)],
                   check=True)


def _ensure_user() -> None:
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", USER], check=True)
    subprocess.run(["usermod", "-p", "*", USER], check=True)  # unlocked, no password


def _sshd_config(lab_dir: Path, name: str, address: str, port: int, log_level: str) -> Path:
    path = lab_dir / f"sshd_{name}.conf"
    rsa = lab_dir / f"hk_{name}_rsa"
    extra_host_keys = f"HostKey {rsa}" if rsa.exists() else ""
    path.write_text(f"""\
ListenAddress {address}:{port}
HostKey {lab_dir}/hk_{name}
{extra_host_keys}
PidFile none
AuthorizedKeysFile {lab_dir}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin no
MaxStartups 200:30:400
MaxSessions 100
AllowTcpForwarding yes
LogLevel {log_level}
""")
    return path


def _start_sshd(lab_dir: Path, name: str, address: str, port: int,
                log_level: str = "INFO") -> subprocess.Popen[bytes]:
    config = _sshd_config(lab_dir, name, address, port, log_level)
    log = lab_dir / f"sshd_{name}.log"
    proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(log)])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=0.5).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd {name} exited: {log.read_text()}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"sshd {name} did not listen on {address}:{port}")


class SilentListener:
    """Accepts TCP connections on 127.0.5.5:22 and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((SILENT, 22))
        self.sock.listen(128)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def _write_config(lab_dir: Path) -> Path:
    config = lab_dir / "ssh_config"
    config.write_text(f"""\
Host ck-b
    HostName {B}
    Port {B_PORT}
    User {USER}
    IdentityFile {lab_dir}/id_good

Host ck-aliased
    HostName {B}
    Port {B_PORT}
    HostKeyAlias ck-alias

Host ck-jumped
    HostName {TARGET}
    ProxyJump {USER}@{A}

Host good-a-*
    HostName {A}
Host good-b-*
    HostName {B}
    Port {B_PORT}
Host bad-refused-*
    HostName {REFUSED}
Host bad-silent-*
    HostName {SILENT}
Host bad-dns-*
    HostName no-such-node.invalid
Host bad-changed-*
    HostName {C}

Host *
    GlobalKnownHostsFile /dev/null
""")
    return config


def _known_hosts_text(keys: dict[str, str]) -> str:
    def body(name: str) -> str:
        return " ".join(keys[name].split()[:2])
    return "\n".join([
        f"{A} {body('a')}",
        f"[{B}]:{B_PORT} {body('b')}",
        f"{C} {body('a')}",  # C's real key is hk_c: it "changed"
        f"{TARGET} {body('t')}",
        f"ck-alias {body('b')}",
    ]) + "\n"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        pytest.skip("needs root and OpenSSH's sshd")
    _ensure_user()
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    lab_dir = Path(tempfile.mkdtemp(prefix="ck-remote-"))
    lab_dir.chmod(0o755)
    for name in ("a", "b", "c", "t"):
        _keygen(lab_dir / f"hk_{name}")
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-C", "",
                    "-f", str(lab_dir / "hk_t_rsa")], check=True)
    _keygen(lab_dir / "id_good")
    _keygen(lab_dir / "id_wrong")
    _keygen(lab_dir / "id_locked", passphrase="secret phrase")
    authorized = lab_dir / "authorized_keys"
    authorized.write_text((lab_dir / "id_good.pub").read_text() + (lab_dir / "id_locked.pub").read_text())
    authorized.chmod(0o644)
    keys = {n: (lab_dir / f"hk_{n}.pub").read_text().strip() for n in ("a", "b", "c", "t")}
    known_hosts = lab_dir / "known_hosts"
    known_hosts.write_text(_known_hosts_text(keys))
    procs: list[subprocess.Popen[bytes]] = []
    silent = SilentListener()
    try:
        procs.append(_start_sshd(lab_dir, "a", A, 22, log_level="DEBUG1"))
        procs.append(_start_sshd(lab_dir, "b", B, B_PORT))
        procs.append(_start_sshd(lab_dir, "c", C, 22))
        procs.append(_start_sshd(lab_dir, "t", TARGET, 22))
        yield Lab(dir=lab_dir, key=str(lab_dir / "id_good"), wrong_key=str(lab_dir / "id_wrong"),
                  locked_key=str(lab_dir / "id_locked"), known_hosts=known_hosts,
                  config=_write_config(lab_dir), host_keys=keys, jump_log=lab_dir / "sshd_a.log")
    finally:
        silent.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(lab_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the keys a test names: the developer's agent must not help or hinder."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def fresh_known_hosts(lab: Lab, name: str, text: str = "") -> Path:
    path = lab.dir / f"kh_{name}_{time.monotonic_ns()}"
    path.write_text(text)
    return path


# --- a command runs -------------------------------------------------------------


def test_stdin_round_trip_and_exit_status(lab: Lab) -> None:
    result = fanout.run(A, "tr a-z A-Z; echo done >&2", lab.settings(), stdin=b"hello probe\n")
    assert result.error is None, result.error
    assert (result.ok, result.exit_status) == (True, 0)
    assert result.stdout == "HELLO PROBE\n"
    assert result.stderr == "done\n"
    assert result.host == A and result.elapsed_s > 0


def test_large_stdin_reaches_the_command_whole(lab: Lab) -> None:
    data = os.urandom(3 * 1024 * 1024)  # more than one SSH window
    result = fanout.run(A, "wc -c", lab.settings(), stdin=data)
    assert result.ok, result.error
    assert result.stdout.strip() == str(len(data))


def test_stdin_the_command_does_not_read_is_no_error(lab: Lab) -> None:
    result = fanout.run(A, "echo ignored", lab.settings(), stdin=os.urandom(4 * 1024 * 1024))
    assert result.ok, result.error
    assert result.stdout == "ignored\n"


def test_python_reads_the_script_from_stdin(lab: Lab) -> None:
    script = b"import getpass, json; print(json.dumps({'user': getpass.getuser()}))\n"
    result = fanout.run(A, "python3 -", lab.settings(), stdin=script)
    assert result.ok, (result.error, result.stderr)
    assert result.stdout.strip() == '{"user": "ckremote"}'


def test_nonzero_exit_status_is_an_answer_not_an_error(lab: Lab) -> None:
    result = fanout.run(A, "echo out; echo err >&2; exit 7", lab.settings())
    assert (result.ok, result.exit_status, result.error) == (False, 7, None)
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.reached


# --- host keys --------------------------------------------------------------------


def test_unknown_host_is_refused_under_strict(lab: Lab) -> None:
    known = fresh_known_hosts(lab, "empty")
    result = fanout.run(A, "true", lab.settings(known_hosts=str(known)))
    assert not result.ok and result.exit_status is None
    error = result.error or ""
    assert error.startswith("host key verification failed:")
    assert A in error and lab.fingerprint("a") in error
    fix = result.fix or ""
    assert f"ssh-keyscan -H {A} >> {known}" in fix and "accept-new" in fix
    assert known.read_text() == ""


def test_accept_new_records_the_key_then_it_is_known(lab: Lab) -> None:
    known = fresh_known_hosts(lab, "accept")
    first = fanout.run(B, "true", lab.settings(known_hosts=str(known), port=B_PORT,
                                               host_key_policy="accept-new"))
    assert first.ok, first.error
    recorded = known.read_text().splitlines()
    assert recorded == [f"[{B}]:{B_PORT} " + " ".join(lab.host_keys["b"].split()[:2])]
    second = fanout.run(B, "true", lab.settings(known_hosts=str(known), port=B_PORT))
    assert second.ok, second.error


def test_accept_new_records_a_key_once_when_many_connect_at_once(lab: Lab) -> None:
    known = fresh_known_hosts(lab, "race")
    settings = lab.settings(known_hosts=str(known), host_key_policy="accept-new", fanout=16)
    results = fanout.fan_out([A] * 16, "true", settings)
    assert all(r.ok for r in results), [r.error for r in results]
    assert len(known.read_text().splitlines()) == 1


def test_changed_key_is_refused_even_under_accept_new(lab: Lab) -> None:
    before = lab.known_hosts.read_text()
    result = fanout.run(C, "true", lab.settings(host_key_policy="accept-new"))
    error = result.error or ""
    assert not result.ok
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in error
    assert lab.fingerprint("c") in error and lab.fingerprint("a") in error
    assert f"ssh-keygen -R '{C}' -f {lab.known_hosts}" in (result.fix or ""), result.fix
    assert lab.known_hosts.read_text() == before


def test_a_host_known_by_its_rsa_key_is_asked_for_that_key(lab: Lab) -> None:
    rsa = " ".join((lab.dir / "hk_t_rsa.pub").read_text().split()[:2])
    known = fresh_known_hosts(lab, "rsa", f"{TARGET} {rsa}\n")
    result = fanout.run(TARGET, "true", lab.settings(known_hosts=str(known)))
    assert result.ok, result.error


def test_hash_known_hosts_from_ssh_config_hashes_recorded_names(lab: Lab) -> None:
    config = lab.dir / "ssh_config_hashed"
    config.write_text("Host *\n    HashKnownHosts yes\n    GlobalKnownHostsFile /dev/null\n")
    known = fresh_known_hosts(lab, "hashed")
    settings = lab.settings(known_hosts=str(known), config_file=str(config),
                            host_key_policy="accept-new")
    assert fanout.run(TARGET, "true", settings).ok
    line = known.read_text()
    assert line.startswith("|1|") and TARGET not in line
    found = subprocess.run(["ssh-keygen", "-F", TARGET, "-f", str(known)], capture_output=True,
                           text=True, check=False)
    assert found.returncode == 0
    assert fanout.run(TARGET, "true", replace(settings, host_key_policy="strict")).ok


def test_host_key_alias_names_the_known_hosts_entry(lab: Lab) -> None:
    result = fanout.run("ck-aliased", "true", lab.settings())
    assert result.ok, result.error


# --- failures come back fast and categorised ----------------------------------------


# Time bounds below only tell the right behaviour from the wrong one, with a wide
# margin for a busy machine: at most half the time the wrong behaviour would take
# (waiting out a 30 s timeout, a 30 s command, or hosts one after the other).


def test_connection_refused(lab: Lab) -> None:
    result = fanout.run(REFUSED, "true", lab.settings(connect_timeout=30))
    assert (result.error or "").startswith("connection refused")
    assert result.elapsed_s < 15  # answered at once, not after connect_timeout


def test_silent_listener_times_out_within_connect_timeout(lab: Lab) -> None:
    started = time.monotonic()
    result = fanout.run(SILENT, "true", lab.settings(connect_timeout=2, command_timeout=30))
    assert (result.error or "").startswith("no answer within 2s"), result.error
    assert time.monotonic() - started < 15  # cut by connect_timeout, not command_timeout


def _still_running(pattern: str, wait_s: float = 2.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-u", USER, "-f", pattern], check=False, capture_output=True)
        if found.returncode != 0:
            return False
        time.sleep(0.1)
    return True


def test_command_longer_than_command_timeout_is_cut_off_and_stopped(lab: Lab) -> None:
    started = time.monotonic()
    result = fanout.run(A, "echo partial; exec sleep 31", lab.settings(command_timeout=2))
    assert (result.error or "").startswith("no answer within 2s"), result.error
    assert result.exit_status is None and not result.ok
    assert result.stdout == "partial\n"
    assert time.monotonic() - started < 15  # not the 31 s of the command
    assert not _still_running("sleep 31"), "the timed-out command was left running"


def test_a_command_that_never_closes_stdout_is_cut_off(lab: Lab) -> None:
    started = time.monotonic()
    result = fanout.run(A, "sleep 30 & echo started", lab.settings(command_timeout=1))
    assert (result.error or "").startswith("no answer within 1s"), result.error
    assert result.stdout == "started\n"
    assert time.monotonic() - started < 15  # not the 30 s until the background sleep closes stdout


def test_unresolvable_host_name(lab: Lab) -> None:
    result = fanout.run("no-such-node.invalid", "true", lab.settings())
    assert (result.error or "").startswith("hostname does not resolve")


def test_wrong_key_fails_authentication_naming_user_and_key(lab: Lab) -> None:
    result = fanout.run(A, "true", lab.settings(identity_file=lab.wrong_key))
    error = result.error or ""
    assert error.startswith(f"authentication failed for user {USER} (tried: ")
    assert "id_wrong" in error


def test_passphrase_key_fails_fast_with_the_fix(lab: Lab) -> None:
    started = time.monotonic()
    result = fanout.run(A, "true", lab.settings(identity_file=lab.locked_key, connect_timeout=30,
                                                command_timeout=30))
    error = result.error or ""
    assert error.startswith(f"authentication failed for user {USER}")
    assert "id_locked needs a passphrase" in error and "ssh-add" in error
    assert time.monotonic() - started < 15  # no prompt waited out


def test_missing_identity_file_is_named(lab: Lab) -> None:
    result = fanout.run(A, "true", lab.settings(identity_file=str(lab.dir / "nope")))
    assert "nope not found" in (result.error or "")


@pytest.fixture
def agent(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real ssh-agent holding the good key, for this test only."""
    sock = str(lab.dir / f"agent-{time.monotonic_ns()}.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.02)
        subprocess.run(["ssh-add", "-q", lab.key], env={**os.environ, "SSH_AUTH_SOCK": sock},
                       check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_agent_keys_are_tried_after_the_identity_file(lab: Lab, agent: str) -> None:
    result = fanout.run(A, "true", lab.settings(identity_file=lab.locked_key))
    assert result.ok, result.error


def test_identities_only_keeps_the_agent_out(lab: Lab, agent: str) -> None:
    config = lab.dir / "ssh_config_identities_only"
    config.write_text("Host *\n    IdentitiesOnly yes\n    GlobalKnownHostsFile /dev/null\n")
    result = fanout.run(A, "true", lab.settings(identity_file=lab.wrong_key, config_file=str(config)))
    assert (result.error or "").startswith("authentication failed"), result.error


# --- ssh_config and ProxyJump ---------------------------------------------------------


def test_ssh_config_gives_hostname_user_port_and_key(lab: Lab) -> None:
    bare = lab.settings(user=None, identity_file=None)
    result = fanout.run("ck-b", "whoami; echo $SSH_CONNECTION", bare)
    assert result.ok, result.error
    user, connection = result.stdout.splitlines()
    assert user == USER
    assert connection.split()[2:] == [B, str(B_PORT)]


def test_profile_settings_win_over_ssh_config(lab: Lab) -> None:
    result = fanout.run("ck-b", "true", lab.settings(port=22))
    assert (result.error or "").startswith(f"connection refused ({B} port 22)")


def _jump_log_count(lab: Lab, text: str) -> int:
    return lab.jump_log.read_text(errors="replace").count(text)


def test_proxy_jump_from_the_profile(lab: Lab) -> None:
    channels_before = _jump_log_count(lab, f"target {TARGET} port 22")
    result = fanout.run(TARGET, "echo $SSH_CONNECTION", lab.settings(proxy_jump=A))
    assert result.ok, result.error
    assert _jump_log_count(lab, f"target {TARGET} port 22") == channels_before + 1


def test_proxy_jump_from_ssh_config(lab: Lab) -> None:
    result = fanout.run("ck-jumped", "hostname", lab.settings())
    assert result.ok, result.error


def test_many_hosts_behind_one_jump_share_one_login(lab: Lab) -> None:
    logins_before = _jump_log_count(lab, "Accepted publickey")
    results = fanout.fan_out([TARGET] * 20, "true", lab.settings(proxy_jump=A, fanout=8))
    assert [r.ok for r in results] == [True] * 20, [r.error for r in results]
    assert _jump_log_count(lab, "Accepted publickey") == logins_before + 1


def test_target_refused_behind_the_jump_host(lab: Lab) -> None:
    result = fanout.run(REFUSED, "true", lab.settings(proxy_jump=A))
    assert (result.error or "").startswith(f"connection refused ({REFUSED} port 22, via the jump host")


def test_unreachable_jump_host_is_named(lab: Lab) -> None:
    results = fanout.fan_out([TARGET, A], "true", lab.settings(proxy_jump=REFUSED))
    for result in results:
        assert (result.error or "").startswith(f"jump host {REFUSED}: connection refused"), result.error


def test_silent_target_behind_the_jump_host_times_out(lab: Lab) -> None:
    started = time.monotonic()
    result = fanout.run(SILENT, "true", lab.settings(proxy_jump=A, connect_timeout=2, command_timeout=30))
    assert (result.error or "").startswith("no answer within 2s"), result.error
    assert time.monotonic() - started < 15  # cut by connect_timeout, not command_timeout


# --- fan_out ------------------------------------------------------------------------------


def _mixed_hosts() -> list[str]:
    hosts = []
    for i in range(50):
        kind = ("good-a", "good-b", "good-a", "bad-refused", "good-b", "bad-silent",
                "good-a", "bad-dns", "good-b", "bad-changed")[i % 10]
        hosts.append(f"{kind}-{i:02d}")
    return hosts


@pytest.mark.parametrize("processes", [1, 2], ids=["threads", "2-processes"])
def test_fan_out_answers_every_host_in_order_within_the_deadline(lab: Lab, processes: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "fanout_processes", processes)
    started_shards: list[object] = []
    start_shard = fanout._start_shard
    monkeypatch.setattr(fanout, "_start_shard", lambda *a: started_shards.append(start_shard(*a))
                        or started_shards[-1])
    hosts = _mixed_hosts()
    seen: list[HostResult] = []
    settings = lab.settings(user=USER, connect_timeout=4, command_timeout=5, fanout=32)
    started = time.monotonic()
    results = fanout.fan_out(hosts, "hostname >/dev/null; echo ok", settings, on_result=seen.append)
    elapsed = time.monotonic() - started
    assert [r.host for r in results] == hosts
    assert sorted(r.host for r in seen) == sorted(hosts)
    expected = {"good": "", "bad-refused": "connection refused", "bad-silent": "no answer within 4s",
                "bad-dns": "hostname does not resolve",
                "bad-changed": "host key verification failed: REMOTE HOST IDENTIFICATION HAS CHANGED"}
    for result in results:
        kind = "good" if result.host.startswith("good") else result.host.rsplit("-", 1)[0]
        if kind == "good":
            assert result.ok and result.stdout == "ok\n", (result.host, result.error)
        else:
            assert (result.error or "").startswith(expected[kind]), (result.host, result.error)
    # the five silent hosts wait out connect_timeout side by side (4 s), not one after another (20 s)
    assert elapsed < 10, elapsed
    assert len(started_shards) == (0 if processes == 1 else processes)


def test_fan_out_over_processes_records_timelines_and_answers_for_a_dead_worker(
        lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 0 gets the refused hosts (answered at once), worker 1 the sleeping ones;
    killing worker 1 when the first answer comes leaves its hosts an error naming that."""
    monkeypatch.setattr(fanout, "fanout_processes", 2)
    shards: list[fanout._Shard] = []
    start_shard = fanout._start_shard
    monkeypatch.setattr(fanout, "_start_shard", lambda *a: shards.append(start_shard(*a)) or shards[-1])
    recorded: list[tuple[str, float, list[tuple[str, float]]]] = []
    fanout.set_timeline_recorder(lambda host, start, marks: recorded.append((host, start, marks)))
    killed: list[int] = []

    def kill_sleepers(result: HostResult) -> None:
        if not killed:
            killed.append(shards[1].pid)
            os.kill(shards[1].pid, signal.SIGKILL)

    try:
        results = fanout.fan_out([REFUSED, A] * 4, "sleep 5", lab.settings(fanout=4),
                                 on_result=kill_sleepers)
    finally:
        fanout.set_timeline_recorder(None)
    assert [r.host for r in results] == [REFUSED, A] * 4
    for result in results[0::2]:
        assert (result.error or "").startswith("connection refused"), result.error
    for result in results[1::2]:
        assert result.error == ("clusterkit worker process was killed by signal 9 before this "
                                "host was done"), result.error
    # the refused hosts' timelines came back from worker 0: a tcp attempt, then closed
    assert sorted(host for host, _, _ in recorded) == [REFUSED] * 4
    assert all([step for step, _ in marks] == ["closed"] for _, _, marks in recorded)


def test_fan_out_keeps_to_the_fanout_limit(lab: Lab) -> None:
    started = time.monotonic()
    results = fanout.fan_out([A] * 6, "sleep 0.6", lab.settings(fanout=2))
    elapsed = time.monotonic() - started
    assert all(r.ok for r in results)
    assert elapsed >= 3 * 0.6, elapsed


def test_fan_out_of_no_hosts(lab: Lab) -> None:
    assert fanout.fan_out([], "true", lab.settings()) == []


def test_fan_out_speed_200_connections_at_fanout_32(lab: Lab) -> None:
    hosts = [f"good-{'ab'[i % 2]}-{i:03d}" for i in range(200)]
    started = time.monotonic()
    results = fanout.fan_out(hosts, "ls /sys/class", lab.settings(fanout=32))
    elapsed = time.monotonic() - started
    assert all(r.ok for r in results), {r.error for r in results if not r.ok}
    print(f"fan_out: 200 connections at fanout 32 in {elapsed:.2f}s")
    assert elapsed < 30


# --- a session for several commands -------------------------------------------------------


def test_open_client_runs_several_commands_on_one_connection(lab: Lab) -> None:
    with ssh_session.open_client("ck-b", lab.settings(user=None)) as session:
        first = session.run("echo $SSH_CONNECTION")
        second = session.run("cat", stdin=b"again")
        slow = session.run("exec sleep 32", timeout=1)
        after = session.run("echo still here")
    assert first.ok and second.stdout == "again"
    assert (slow.error or "").startswith("no answer within 1s")
    assert after.stdout == "still here\n"
    assert not _still_running("sleep 32")


def test_a_real_sshd_is_spoken_to_in_aes_gcm(lab: Lab) -> None:
    """The AEAD cipher asked for first is what OpenSSH's sshd agrees to; output and
    exit status come through it intact."""
    with ssh_session.open_client("ck-b", lab.settings(user=None)) as session:
        result = session.run("head -c 100000 /dev/zero | tr '\\0' x; exit 3")
        ciphers = (session._transport.local_cipher, session._transport.remote_cipher)
    assert ciphers == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")
    assert result.exit_status == 3 and result.stdout == "x" * 100000


def test_open_client_raises_a_cluster_refused_error(lab: Lab) -> None:
    with pytest.raises(SshConnectError) as info, ssh_session.open_client(REFUSED, lab.settings()):
        pass
    assert info.value.exit_code == 3
    assert "connection refused" in info.value.format_message()
