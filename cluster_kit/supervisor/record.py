"""The attempts record of a supervised job (stdlib only, Python 3.8+).

One JSON file, `attempts.json`, in the job's record folder
`<folder of the first attempt's output>/clusterkit-<first job id>/` (0700), written
0600 by the supervisor (write a temporary file, rename it) and read by
`clusterkit status`, `diagnose` and `submit --wait`:

    {"format": "clusterkit.attempts/1", "job_id": "123", "resilience": {...},
     "attempts": [{"attempt": 0, "slurm_job_id": "123", "nodes": "n[1-2]",
                   "started_at": 1.7e9, "ended_at": 1.7e9, "ended": "hang",
                   "exit_code": 1, "detected_after_s": 41.2,
                   "culprit": {"ranks": [3], "hosts": ["n2"], "evidence": "..."},
                   "excluded": ["n2"], "stacks": {"3": "..."}, "next_job_id": "124",
                   "why": "..."}],
     "exclude": ["n2"], "final": null}

`final` is `{"ended": ..., "exit_code": N, "why": "..."}` once the chain is over.
"""
import json
import os

FORMAT = "clusterkit.attempts/1"
RECORD_NAME = "attempts.json"
ENDINGS = ("completed", "hang", "crash", "node_failure", "time_limit", "preempted", "cancelled", "running")
FAILURES = ("hang", "crash", "node_failure")  # count against max_restarts
REQUEUES = ("time_limit", "preempted")  # count against max_time_requeues


def folder_for(output_path, chain_id):
    """The record folder beside a job's output file: `<its folder>/clusterkit-<chain id>`."""
    return os.path.join(os.path.dirname(output_path) or ".", f"clusterkit-{chain_id}")


def new_record(chain_id, resilience):
    return {"format": FORMAT, "job_id": str(chain_id), "resilience": dict(resilience),
            "attempts": [], "final": None}


def load(folder):
    """The record in `folder`, or None when there is none (or it is not one)."""
    try:
        with open(os.path.join(folder, RECORD_NAME), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("attempts"), list):
        return None
    return data


def make_private_dir(path):
    """Create `path` (and parents) 0700; an existing one keeps its mode."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def save(folder, record):
    """Write the record 0600 in a 0700 folder, whole (temporary file, then rename)."""
    make_private_dir(folder)
    path = os.path.join(folder, RECORD_NAME)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(record, out, indent=1, sort_keys=True)
        out.write("\n")
    os.replace(tmp, path)
    return path


def count(record, endings):
    return sum(1 for a in record["attempts"] if a.get("ended") in endings)


def excluded_nodes(record):
    """The nodes the chain's next attempt goes without (`exclude`), in the order they
    were blamed. Each attempt's `excluded` lists the ones it added."""
    return list(record.get("exclude") or [])
