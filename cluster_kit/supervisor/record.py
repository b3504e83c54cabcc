"""The attempts record of a supervised job (stdlib only, Python 3.8+).

One JSON file, `attempts.json`, in the job's record folder
`<folder of the first attempt's output>/clusterkit-<first job id>/` (0700), written
0600 by the supervisor (write a temporary file, rename it) and read by
`clusterkit status`, `diagnose` and `submit --wait`:

    {"format": "clusterkit.attempts/1", "job_id": "123", "resilience": {...},
     "script_digest": "sha256:...", "start_exclude": [],
     "attempts": [{"attempt": 0, "slurm_job_id": "123", "step": "123.0", "nodes": "n[1-2]",
                   "allocation": "n[1-3]", "batch_host": "n1",
                   "started_at": 1.7e9, "ended_at": 1.7e9, "ended": "hang",
                   "exit_code": 137, "detected_after_s": 41.2,
                   "culprit": {"ranks": [3], "hosts": ["n2"], "evidence": "...", "kind": "node"},
                   "excluded": ["n2"], "released": ["n2"], "stacks": {"3": "..."},
                   "checkpoints": ["checkpoints every 412 steps (9.6 min): ..."],
                   "why": "...; restarted in job 123 on n[1,3] (n3 in place of n2)"},
                  {"attempt": 1, "slurm_job_id": "123", "step": "123.1", ..., "next_job_id": "124"}],
     "exclude": ["n2"], "standby": {"job_id": "125", "after": "123"}, "final": null}

An attempt restarted in its allocation has the same `slurm_job_id` as the next one;
one restarted as a new job names it as `next_job_id`. `standby` is the job waiting
with `--dependency=afternotok` on the current one (null once the supervisor saw the
end). A program error's culprit has `"kind": "program"` and its `signature`, `error`
and `where`. `final` is `{"ended": ..., "exit_code": N, "why": "..."}` once the chain
is over.
"""
import json
import os
import threading
import time

from . import private

FORMAT = "clusterkit.attempts/1"
RECORD_NAME = "attempts.json"
ENDINGS = ("completed", "hang", "crash", "node_failure", "time_limit", "preempted", "cancelled", "running")
FAILURES = ("hang", "crash", "node_failure")  # count against max_restarts
REQUEUES = ("time_limit", "preempted")  # count against max_time_requeues
EARLIER_LIMIT = 50  # earlier chains read for the failure rate
LOCK_NAME = "supervisor.lock"  # `<job id>`: whose supervisor runs the chain; refreshed while it lives
LOCK_REFRESH_S = 10.0
LOCK_STALE_S = 60.0  # a lock not refreshed for this long belongs to a supervisor that is gone


def folder_for(output_path, chain_id):
    """The record folder beside a job's output file: `<its folder>/clusterkit-<chain id>`."""
    return os.path.join(os.path.dirname(output_path) or ".", f"clusterkit-{chain_id}")


def new_record(chain_id, resilience):
    return {"format": FORMAT, "job_id": str(chain_id), "resilience": dict(resilience),
            "attempts": [], "final": None}


class CorruptRecord(RuntimeError):
    """An attempts record that is there but cannot be read as one (kept aside)."""


def load(folder):
    """The record in `folder`; None when there is none. A record that is not one is
    renamed aside (`attempts.json.corrupt-<unix time>`) and CorruptRecord raised: a
    chain never starts its history anew over one. private.Untrusted for a record
    another user could have written."""
    path = os.path.join(folder, RECORD_NAME)
    raw = private.read(path)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
        problem = None if _is_record(data) else f"it is not a {FORMAT} record"
    except (UnicodeDecodeError, ValueError) as exc:
        problem = f"it is not JSON ({exc})"
    if problem is None:
        return data
    kept = f"{path}.corrupt-{int(time.time())}"
    os.replace(path, kept)
    raise CorruptRecord(f"the attempts record {path} cannot be read: {problem}; it was kept as {kept}, and "
                        "the chain does not go on without its history: look at it, then submit the job again")


def earlier(folder, limit=EARLIER_LIMIT):
    """The ended records of the user's other chains beside `folder` (the newest
    `limit`): what `checkpoint_every: auto` learns the failure rate from. Only folders
    and records private.check trusts; one that is not is skipped, never touched."""
    parent, own = os.path.split(os.path.abspath(folder))
    found = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith("clusterkit-") and e.name != own]
    except OSError:
        return []
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            private.check(entry.path, st, "folder")
            found.append((st.st_mtime, entry.path))
        except (OSError, private.Untrusted):
            continue
    records = []
    for _, path in sorted(found, reverse=True)[:limit]:
        try:
            data = json.loads((private.read(os.path.join(path, RECORD_NAME)) or b"").decode("utf-8"))
        except (OSError, ValueError, private.Untrusted):
            continue
        if _is_record(data) and data.get("final"):
            records.append(data)
    return records


def _is_record(data):
    return isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("attempts"), list)


def make_private_dir(path):
    """Make `path` 0700, or trust the one there (private.folder)."""
    return private.folder(path)


def save(folder, record):
    """Write the record 0600 in its 0700 folder, whole (temporary file, then rename)."""
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    return private.write(os.path.join(folder, RECORD_NAME), text.encode("utf-8"))


def count(record, endings):
    return sum(1 for a in record["attempts"] if a.get("ended") in endings)


def excluded_nodes(record):
    """The nodes the chain's next attempt goes without (`exclude`), in the order they
    were blamed. Each attempt's `excluded` lists the ones it added."""
    return list(record.get("exclude") or [])


class Held(RuntimeError):
    """Another job's supervisor of the same chain is alive: this one must not run."""


def take_lock(folder, job_id, wait_s=LOCK_STALE_S, now=time.time, sleep=time.sleep):
    """Hold the chain's lock as `job_id`, and refresh it from a daemon thread while this
    process lives: one supervisor per chain, whichever job (a requeue, the standby, a
    restart) starts it. A lock of another job refreshed within LOCK_STALE_S is waited
    for, at most `wait_s`; Held when it stays fresh."""
    path = os.path.join(folder, LOCK_NAME)
    deadline = now() + wait_s
    while True:
        holder, age = _lock_state(path, now())
        if holder in (None, job_id) or age > LOCK_STALE_S:
            break
        if now() >= deadline:
            raise Held(f"the supervisor of job {holder} runs this chain ({path} was refreshed {age:.0f} s ago): "
                       f"job {job_id} does not train beside it")
        sleep(min(5.0, LOCK_STALE_S))
    private.write(path, f"{job_id}\n".encode())
    thread = threading.Thread(target=_refresh, args=(path, job_id), name="clusterkit-lock", daemon=True)
    thread.start()
    return thread


def release_lock(folder, job_id):
    """Give the lock up (when `job_id` holds it): the supervisor is done."""
    path = os.path.join(folder, LOCK_NAME)
    try:
        if _lock_state(path, time.time())[0] == job_id:
            os.unlink(path)
    except (OSError, private.Untrusted):
        pass


def _lock_state(path, now):
    """(holder job id or None, seconds since it was refreshed) of the lock at `path`."""
    data = private.read(path)
    if data is None:
        return None, 0.0
    return data.decode("utf-8", "replace").strip() or None, max(0.0, now - os.stat(path).st_mtime)


def _refresh(path, job_id):
    while True:
        time.sleep(LOCK_REFRESH_S)
        try:
            if _lock_state(path, time.time())[0] != job_id:
                return  # released, or taken over by a supervisor that found it stale
            private.write(path, f"{job_id}\n".encode())
        except (OSError, private.Untrusted):
            pass
