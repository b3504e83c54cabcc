"""The checkpoint folder on disk (store.py, fence.py, status.py): whole, verified, fenced, private.

Real files in a temporary folder; the stdlib-only modules, without torch.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_kit.trainer.checkpoint import fence, status, store
from cluster_kit.trainer.checkpoint.fence import Fenced, Token

REPO = Path(__file__).resolve().parents[3]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def save_by_hand(root: Path, step: int, payload: bytes = b"weights", attempt: int = 0,
                 token: Token | None = None) -> str:
    """What a save does, with plain files: write into the partial folder, then commit."""
    partial = store.make_partial(str(root), store.partial_name(step, "", attempt))
    files = {"model.pt": store.write_bytes(partial, "model.pt", payload)}
    manifest = store.build_manifest(step, attempt=attempt, chain="", world_size=1, host="n1", files=files,
                                    contents={"model": "module"}, measured={"save_s": 1.0})
    return store.commit(str(root), partial, manifest,
                        lambda: fence.check_fence(str(root), token or Token("", attempt)))


# --- whole -------------------------------------------------------------------------------
def test_a_commit_renames_the_partial_folder_and_points_latest_at_it(tmp_path: Path) -> None:
    store.make_folder(str(tmp_path / "ckpt"))
    root = tmp_path / "ckpt"
    assert save_by_hand(root, 5) == "step-5"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-5"]  # no partial, no temporary file
    assert (root / "latest").read_text() == "step-5\n"
    assert store.read_latest(str(root)) == "step-5"
    manifest = json.loads((root / "step-5" / "manifest.json").read_text())
    assert manifest["files"]["model.pt"]["bytes"] == len(b"weights")
    assert (manifest["format"], manifest["step"], manifest["world_size"]) == ("clusterkit.checkpoint/1", 5, 1)
    assert mode(root) == 0o700 and mode(root / "step-5") == 0o700
    assert {mode(p) for p in (root / "step-5").iterdir()} == {0o600}
    assert mode(root / "latest") == 0o600


def test_committed_lists_real_checkpoint_folders_newest_first(tmp_path: Path) -> None:
    for step in (5, 20, 10):
        save_by_hand(tmp_path, step)
    (tmp_path / "step-99").symlink_to(tmp_path / "step-5")  # someone else's link: not a checkpoint
    (tmp_path / "step-7.corrupt").mkdir()
    (tmp_path / "step-8").write_text("a file")
    assert store.committed(str(tmp_path)) == [(20, "step-20"), (10, "step-10"), (5, "step-5")]


def test_prune_keeps_the_newest_n(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        save_by_hand(tmp_path, step)
    assert store.prune(str(tmp_path), keep=2) == ["step-10", "step-5"]
    assert [name for _, name in store.committed(str(tmp_path))] == ["step-20", "step-15"]


def test_partial_folders_of_other_attempts_are_removed(tmp_path: Path) -> None:
    mine = store.make_partial(str(tmp_path), store.partial_name(30, "4711", 2))
    store.make_partial(str(tmp_path), store.partial_name(30, "4711", 1))
    store.make_partial(str(tmp_path), store.partial_name(25, "", 0))
    removed = store.remove_partials(str(tmp_path), keep_suffix=store.partial_suffix("4711", 2))
    assert sorted(removed) == [".partial-step-25.-.0", ".partial-step-30.4711.1"]
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(mine)]


# --- verified ------------------------------------------------------------------------------
def test_a_whole_checkpoint_verifies(tmp_path: Path) -> None:
    save_by_hand(tmp_path, 5)
    assert store.verify(str(tmp_path), "step-5") is None


@pytest.mark.parametrize("damage, why", [
    (lambda f: (f / "model.pt").write_bytes(b"weightz"), "model.pt: sha256 "),
    (lambda f: (f / "model.pt").unlink(), "model.pt: [Errno 2]"),
    (lambda f: (f / "manifest.json").write_text("{\"format\": \"clusterkit.checkpoint/1\""), "manifest.json: "),
    (lambda f: (f / "manifest.json").unlink(), "manifest.json: [Errno 2]"),
    (lambda f: (f / "manifest.json").write_text(json.dumps({"format": "other"})), "manifest.json is not a clusterkit"),
])
def test_a_damaged_checkpoint_says_what_is_wrong(tmp_path: Path, damage: object, why: str) -> None:
    save_by_hand(tmp_path, 5)
    damage(tmp_path / "step-5")  # type: ignore[operator]
    found = store.verify(str(tmp_path), "step-5")
    assert found is not None and found.startswith(why), found


def test_a_manifest_cannot_point_outside_its_folder(tmp_path: Path) -> None:
    save_by_hand(tmp_path, 5)
    path = tmp_path / "step-5" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["../../etc/passwd"] = {"sha256": "0" * 64}
    path.write_text(json.dumps(manifest))
    assert "names '../../etc/passwd', not a file of the checkpoint" in (store.verify(str(tmp_path), "step-5") or "")


def test_a_file_replaced_by_a_link_fails_verification(tmp_path: Path) -> None:
    save_by_hand(tmp_path, 5)
    (tmp_path / "other").write_bytes(b"weights")  # the same bytes: only the link is wrong
    (tmp_path / "step-5" / "model.pt").unlink()
    (tmp_path / "step-5" / "model.pt").symlink_to(tmp_path / "other")
    assert (store.verify(str(tmp_path), "step-5") or "").startswith("model.pt: [Errno 40]")


def test_a_checkpoint_set_aside_keeps_its_files_and_says_why(tmp_path: Path) -> None:
    save_by_hand(tmp_path, 5)
    save_by_hand(tmp_path, 5 + 5)
    assert store.set_aside(str(tmp_path), "step-10", "model.pt: sha256 mismatch") == "step-10.corrupt"
    note = json.loads((tmp_path / "step-10.corrupt" / "set-aside.json").read_text())
    assert (note["name"], note["why"]) == ("step-10", "model.pt: sha256 mismatch")
    assert (tmp_path / "step-10.corrupt" / "model.pt").read_bytes() == b"weights"
    save_by_hand(tmp_path, 10)
    assert store.set_aside(str(tmp_path), "step-10", "again") == "step-10.corrupt-2"
    assert store.committed(str(tmp_path)) == [(5, "step-5")]


# --- private and no links followed ----------------------------------------------------------
def test_a_folder_writable_by_others_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(store.UnsafePath, match=r"can be written by others \(mode 777\); chmod go-w"):
        store.make_folder(str(folder))


def test_a_link_in_place_of_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "ckpt").symlink_to(tmp_path / "real")
    with pytest.raises(store.UnsafePath, match="is a symbolic link; name the folder it points to"):
        store.make_folder(str(tmp_path / "ckpt"))


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(store.UnsafePath, match="belongs to uid 65534, not to you"):
        store.make_folder(str(folder))


def test_a_link_planted_where_latest_goes_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    root = tmp_path / "ckpt"
    store.make_folder(str(root))
    (root / "latest").symlink_to(victim)
    save_by_hand(root, 5)
    assert victim.read_text() == "keep me"
    assert not (root / "latest").is_symlink() and (root / "latest").read_text() == "step-5\n"


# --- fenced --------------------------------------------------------------------------------
def test_the_newest_attempt_holds_the_fence(tmp_path: Path) -> None:
    fence.raise_fence(str(tmp_path), Token("4711", 0))
    fence.check_fence(str(tmp_path), Token("4711", 0))
    fence.raise_fence(str(tmp_path), Token("4711", 2))
    assert fence.read_fence(str(tmp_path)) == Token("4711", 2)
    assert mode(tmp_path / "fence") == 0o600
    with pytest.raises(Fenced, match="this rank belongs to attempt 0 of job 4711, but attempt 2 of job 4711"):
        fence.check_fence(str(tmp_path), Token("4711", 0))
    with pytest.raises(Fenced):
        fence.raise_fence(str(tmp_path), Token("4711", 1))  # an older attempt starting late
    assert fence.read_fence(str(tmp_path)) == Token("4711", 2)


def test_a_new_chain_in_the_same_folder_takes_the_fence_over(tmp_path: Path) -> None:
    fence.raise_fence(str(tmp_path), Token("4711", 3))
    fence.raise_fence(str(tmp_path), Token("4800", 0))
    with pytest.raises(Fenced):
        fence.check_fence(str(tmp_path), Token("4711", 3))
    fence.check_fence(str(tmp_path), Token("4800", 0))


def test_no_fence_yet_lets_a_save_through(tmp_path: Path) -> None:
    assert fence.read_fence(str(tmp_path)) is None
    fence.check_fence(str(tmp_path), Token("", 0))


def test_the_fence_is_checked_again_right_before_the_commit_rename(tmp_path: Path) -> None:
    """A save that started before the next attempt raised the fence is refused at its commit."""
    fence.raise_fence(str(tmp_path), Token("4711", 0))
    save_by_hand(tmp_path, 5, token=Token("4711", 0))
    partial = store.make_partial(str(tmp_path), store.partial_name(10, "4711", 0))
    files = {"model.pt": store.write_bytes(partial, "model.pt", b"late")}
    manifest = store.build_manifest(10, attempt=0, chain="4711", world_size=1, host="lost", files=files,
                                    contents={"model": "module"}, measured={})
    fence.raise_fence(str(tmp_path), Token("4711", 1))  # the next attempt starts meanwhile
    with pytest.raises(Fenced, match="attempt 1 of job 4711 has started since"):
        store.commit(str(tmp_path), partial, manifest, lambda: fence.check_fence(str(tmp_path), Token("4711", 0)))
    assert store.committed(str(tmp_path)) == [(5, "step-5")]
    assert store.read_latest(str(tmp_path)) == "step-5"


def test_a_late_commit_over_the_same_step_sets_the_old_one_aside(tmp_path: Path) -> None:
    save_by_hand(tmp_path, 5, payload=b"old", attempt=0)
    save_by_hand(tmp_path, 5, payload=b"new", attempt=1)
    assert (tmp_path / "step-5" / "model.pt").read_bytes() == b"new"
    note = json.loads((tmp_path / "step-5.superseded" / "set-aside.json").read_text())
    assert note["why"] == "superseded by attempt 1's save of the same step"


# --- the status file -----------------------------------------------------------------------
def test_the_status_file_is_replaced_whole_and_read_back(tmp_path: Path) -> None:
    doc = status.StatusFile(str(tmp_path), attempt=1, chain="4711", directory="/ckpt", every="auto", mode="async")
    doc.update(interval={"steps": 412, "seconds": 576.8,
                         "why": "every 412 steps (9.6 min): save 3.1 s, restart 8 s, MTBF 7.9 h at 16 nodes"},
               last={"step": 800, "name": "step-800", "time": 1.0}, save_s=0.12, write_s=3.1)
    doc.add("set_aside", {"name": "step-1200", "as": "step-1200.corrupt", "why": "model.pt: sha256 1 where 2"})
    read = status.read_status(str(tmp_path))
    assert read is not None and read["attempt"] == 1 and read["set_aside"][0]["name"] == "step-1200"
    assert mode(tmp_path / "checkpoint.json") == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
    assert status.describe(read) == [
        "checkpoints every 412 steps (9.6 min): save 3.1 s, restart 8 s, MTBF 7.9 h at 16 nodes",
        "last checkpoint: step 800 (step-800, stall 0.12 s, background write 3.10 s)",
        "set aside step-1200 as step-1200.corrupt: model.pt: sha256 1 where 2",
    ]


def test_status_lists_keep_their_newest_entries(tmp_path: Path) -> None:
    doc = status.StatusFile(str(tmp_path), attempt=0, chain="", directory="/c", every="5", mode="sync")
    for step in range(status.MAX_ENTRIES + 5):
        doc.add("refused", {"step": step, "why": "fenced"})
    steps = [e["step"] for e in (status.read_status(str(tmp_path)) or {})["refused"]]
    assert steps == list(range(5, status.MAX_ENTRIES + 5))


def test_without_a_control_folder_there_is_no_status_file(tmp_path: Path) -> None:
    doc = status.StatusFile(None, attempt=0, chain="", directory=str(tmp_path), every="auto", mode="sync")
    doc.update(save_s=1.0)
    assert doc.doc["save_s"] == 1.0 and list(tmp_path.iterdir()) == []
    assert status.read_status(str(tmp_path)) is None


def test_the_stdlib_modules_load_without_torch() -> None:
    """The supervisor and the CLI read folders, fences, status files and intervals without torch."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from cluster_kit.trainer.checkpoint import fence, interval, settings, status, store\n"
            "import cluster_kit.checkpoint as c\n"
            "print(c.parse_every('30m').value, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(REPO)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1800.0", "False"]
