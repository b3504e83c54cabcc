"""What the supervisor trusts: its own folders and files that nobody else can write.

The other user is real: these tests run as root and hand folders and files to
`ckuser` (the dev cluster's test user, made by scripts/dev-cluster) or to `nobody`.
"""
from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from cluster_kit.supervisor import private, record, slurmctl
from cluster_kit.supervisor.chain import SCRIPT_NAME, Chain, Refused, SlurmJob
from cluster_kit.supervisor.record import AttemptRecord, ChainRecord
from cluster_kit.supervisor.settings import Resilience, Settings


def other_uid() -> int:
    for name in ("ckuser", "nobody"):
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
    pytest.skip("no second local user to own a file")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


SETTINGS = Settings(2, 2, Resilience(max_restarts=3, hang_timeout=300.0, startup_timeout=None, exclude="blamed",
                                     exclude_on="node_faults", grace=120, max_time_requeues=5, checkpoint_dir=None,
                                     spare_nodes=0, min_nodes=None, checkpoint_every=None, keep_checkpoints=3,
                                     mtbf_hours=None))


def open_chain(job_id: str, fields: dict[str, str], comment: str) -> tuple[str, str, ChainRecord]:
    """(chain id, record folder, record) of a job, as the supervisor opens its chain."""
    chain = Chain.open(SlurmJob(job_id, fields), comment, SETTINGS)
    return chain.chain_id, chain.folder, chain.rec


# ------------------------------------------------------------------------------ folders

def test_a_new_folder_is_made_0700_and_an_own_private_one_is_used(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o1777)  # a shared log folder
    folder = tmp_path / "clusterkit-7"
    assert private.folder(str(folder)) is True and mode(folder) == 0o700
    assert private.folder(str(folder)) is False


def test_a_folder_planted_by_another_user_is_refused_with_the_fix(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o1777)
    folder = tmp_path / "clusterkit-7"
    folder.mkdir(mode=0o700)
    os.chown(folder, other_uid(), -1)
    with pytest.raises(private.Untrusted) as caught:
        private.folder(str(folder))
    assert str(caught.value) == (
        f"{folder} belongs to {pwd.getpwuid(other_uid()).pw_name} (uid {other_uid()}), not to the job's user "
        f"({pwd.getpwuid(os.getuid()).pw_name} (uid {os.getuid()})): the supervisor uses "
        f"only folders of the job's own user that nobody else can write; {private.FIX}")


@pytest.mark.parametrize(("bits", "who"), [(0o770, "group"), (0o707, "others"), (0o777, "group and others")])
def test_an_own_folder_others_can_write_is_refused(tmp_path: Path, bits: int, who: str) -> None:
    folder = tmp_path / "clusterkit-7"
    folder.mkdir()
    os.chmod(folder, bits)
    with pytest.raises(private.Untrusted, match=f"is writable by {who} \\(mode {bits:04o}\\)"):
        private.folder(str(folder))


def test_a_symbolic_link_in_place_of_the_folder_is_refused_and_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "clusterkit-7").symlink_to(target)
    with pytest.raises(private.Untrusted, match="clusterkit-7 is a symbolic link"):
        private.folder(str(tmp_path / "clusterkit-7"))


def test_a_file_in_place_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "clusterkit-7").write_text("")
    with pytest.raises(private.Untrusted, match="is not a folder"):
        private.folder(str(tmp_path / "clusterkit-7"))


# ------------------------------------------------------------------------------ files

def test_files_are_written_0600_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    private.write(str(path), b"#!/bin/bash\n")
    assert private.read(str(path)) == b"#!/bin/bash\n" and mode(path) == 0o600
    assert private.read(str(tmp_path / "missing")) is None


def test_a_link_planted_at_the_temporary_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    (tmp_path / f"attempts.json.tmp{os.getpid()}").symlink_to(victim)
    private.write(str(tmp_path / "attempts.json"), b"{}")
    assert victim.read_text() == "theirs" and (tmp_path / "attempts.json").read_bytes() == b"{}"


@pytest.mark.parametrize("plant", ["link", "other", "writable", "fifo"])
def test_a_file_someone_else_could_have_written_is_not_read(tmp_path: Path, plant: str) -> None:
    path = tmp_path / "job.sbatch"
    if plant == "link":
        (tmp_path / "real").write_text("#!/bin/bash\n")
        path.symlink_to(tmp_path / "real")
    elif plant == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.write_text("#!/bin/bash\n")
        os.chmod(path, 0o600 if plant == "other" else 0o666)
        if plant == "other":
            os.chown(path, other_uid(), -1)
    expected = {"link": "is a symbolic link", "other": "belongs to ", "writable": "is writable by group and others",
                "fifo": "is not a file"}[plant]
    with pytest.raises(private.Untrusted, match=expected):
        private.read(str(path))


# ------------------------------------------------------------------------------ the record

def test_the_record_is_private_and_read_back(tmp_path: Path) -> None:
    folder = tmp_path / "clusterkit-7"
    record.make_private_dir(str(folder))
    rec = record.new_record("7", {"max_restarts": 1})
    path = record.save(str(folder), rec)
    assert record.load(str(folder)) == rec
    assert (mode(Path(path)), mode(folder)) == (0o600, 0o700)
    assert record.folder_for("/x/out/job-7.out", "7") == "/x/out/clusterkit-7"
    assert record.load(str(tmp_path)) is None


@pytest.mark.parametrize(("text", "problem"), [
    ("{not json", "it is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ('{"format": "other"}', "it is not a clusterkit.attempts/1 record"),
    ("[]", "it is not a clusterkit.attempts/1 record"),
])
def test_a_corrupt_record_is_kept_aside_and_never_started_anew(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / record.RECORD_NAME
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(record.CorruptRecord) as caught:
        record.load(str(tmp_path))
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("attempts.json.corrupt-")]
    assert len(kept) == 1 and kept[0].read_text() == text and not path.exists()
    assert str(caught.value) == (f"the attempts record {path} cannot be read: {problem}; it was kept as {kept[0]}, "
                                 "and the chain does not go on without its history: look at it, then submit the "
                                 "job again")


# ------------------------------------------------------------------------------ the chain

def make_chain(folder: Path, attempts: list[dict[str, object]], job_id: str = "7") -> None:
    record.make_private_dir(str(folder))
    rec = record.new_record(job_id, {})
    rec.attempts = [AttemptRecord.from_dict(a) for a in attempts]
    record.save(str(folder), rec)


def test_a_first_job_starts_its_own_record_beside_its_output(tmp_path: Path) -> None:
    chain_id, folder, rec = open_chain("7", {"StdOut": f"{tmp_path}/run-7.out"}, "")
    assert (chain_id, folder, rec.job_id, rec.attempts) == ("7", f"{tmp_path}/clusterkit-7", "7", [])
    assert mode(tmp_path / "clusterkit-7") == 0o700


def test_a_restart_finds_its_chain_through_its_slurm_comment(tmp_path: Path) -> None:
    make_chain(tmp_path / "clusterkit-7", [{"attempt": 0, "slurm_job_id": "7", "next_job_id": "9"}])
    chain_id, folder, rec = open_chain("9", {"StdOut": f"{tmp_path}/run-9.out"}, "clusterkit-chain=7;mine")
    assert (chain_id, folder, len(rec.attempts)) == ("7", f"{tmp_path}/clusterkit-7", 1)


def test_a_job_the_chain_did_not_submit_is_refused(tmp_path: Path) -> None:
    make_chain(tmp_path / "clusterkit-7", [{"attempt": 0, "slurm_job_id": "7", "next_job_id": "9"}])
    with pytest.raises(Refused) as caught:
        open_chain("12", {"StdOut": f"{tmp_path}/run-12.out"}, "clusterkit-chain=7")
    assert str(caught.value) == (
        f"job 12 was submitted as an attempt of the chain of job 7, but that chain's record "
        f"({tmp_path}/clusterkit-7/attempts.json) does not name it as its next attempt; nothing was run")


def test_environment_variables_do_not_make_a_job_join_a_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_chain(tmp_path / "clusterkit-7", [{"attempt": 0, "slurm_job_id": "7", "ended": "running"}])
    monkeypatch.setenv("CLUSTERKIT_CHAIN_ID", "7")
    monkeypatch.setenv("CLUSTERKIT_RECORD_DIR", str(tmp_path / "clusterkit-7"))
    chain_id, folder, rec = open_chain("12", {"StdOut": f"{tmp_path}/run-12.out"}, "")
    assert (chain_id, folder, rec.attempts) == ("12", f"{tmp_path}/clusterkit-12", [])


def test_a_planted_chain_folder_stops_the_job_before_anything_runs(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o1777)
    planted = tmp_path / "clusterkit-7"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    (planted / SCRIPT_NAME).write_text("#!/bin/bash\nid > /tmp/owned\n")
    with pytest.raises(private.Untrusted, match="clusterkit-7 is writable by group and others"):
        open_chain("7", {"StdOut": f"{tmp_path}/run-7.out"}, "")


def test_only_the_script_attempt_0_kept_is_submitted_again(tmp_path: Path) -> None:
    folder = tmp_path / "clusterkit-7"
    record.make_private_dir(str(folder))
    source = tmp_path / "slurm_script"
    source.write_text("#!/bin/bash\ntrain\n")
    chain = Chain(SlurmJob("7", {}), "7", str(folder), record.new_record("7", {}))
    chain.keep_script(str(source))
    assert chain.kept_script() == b"#!/bin/bash\ntrain\n"
    assert chain.rec.script_digest == private.digest(b"#!/bin/bash\ntrain\n")
    (folder / SCRIPT_NAME).write_text("#!/bin/bash\nsomething else\n")
    with pytest.raises(Refused, match="is not the script attempt 0 kept"):
        chain.kept_script()


@pytest.mark.parametrize(("comment", "chain", "user"), [
    ("", None, ""), ("clusterkit-chain=7", "7", ""), ("clusterkit-chain=7;nightly run", "7", "nightly run"),
    ("nightly run", None, "nightly run"), ("clusterkit-chain=x7", None, "clusterkit-chain=x7"),
])
def test_the_chain_word_of_a_comment(comment: str, chain: str | None, user: str) -> None:
    assert slurmctl.chain_of(comment) == chain
    assert slurmctl.user_comment(comment) == user


def test_a_submit_from_inside_a_job_carries_none_of_its_variables() -> None:
    env = {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7", "SBATCH_X": "1",
           "CLUSTERKIT_CONTROL_DIR": "/o/clusterkit-7/attempt-0", "CLUSTERKIT_CHAIN_ID": "7", "HOME": "/root"}
    assert slurmctl.submit_environment(env) == {"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "HOME": "/root"}


def test_json_of_the_record_is_sorted_and_whole(tmp_path: Path) -> None:
    record.make_private_dir(str(tmp_path / "c"))
    record.save(str(tmp_path / "c"), ChainRecord.from_dict({"format": record.FORMAT, "attempts": [], "b": 1, "a": 2}))
    text = (tmp_path / "c" / record.RECORD_NAME).read_text()
    assert text.endswith("}\n") and list(json.loads(text)) == ["a", "attempts", "b", "final", "format", "job_id",
                                                                "resilience", "start_exclude"]
