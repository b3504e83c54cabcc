"""The clusterkit peer of benchmarks/fanout.py: `fan_out` with the peers' command,
printing `host: line` as pdsh does. A file of its own so that its start-up is the
interpreter's and clusterkit's imports only, not the benchmark's.

    python3 fanout_child.py SSH_CONFIG FANOUT NODES COMMAND...

With CK_FANOUT_BATCH=N, it runs fan_out over the hosts N at a time, one batch after
the other (the `ck-by-200` peer: what the same hosts cost a node in fan-outs of 200).
With CK_FANOUT_PROCESSES=N, fan_out uses N worker processes (1: threads only)
instead of its own choice. With CK_FANOUT_TIMELINE=FILE set, it records every host's timeline there as JSON,
with its own start-up marks and its peak RSS (its VmHWM after exec, plus its
worker processes' peaks, if any).
"""
import json
import os
import sys
import time

TIMELINE_ENV = "CK_FANOUT_TIMELINE"
PROCESSES_ENV = "CK_FANOUT_PROCESSES"  # force remote.fanout_processes (the 1-process peer)
BATCH_ENV = "CK_FANOUT_BATCH"


def peak_rss_mb() -> float:
    """This process's peak resident set since exec, from /proc (0 where absent)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def workers_rss_mb(workers: int) -> float:
    """An upper bound on fan_out's worker processes' peak RSS: the largest reaped
    child's peak (ru_maxrss) for each of them, pages shared with this process
    counted again in each."""
    if workers <= 1:
        return 0.0
    import resource

    return workers * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main(argv: list[str]) -> None:
    client = {"entered": time.monotonic()}
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cluster_kit.ssh import SshSettings, fan_out, set_timeline_recorder
    from cluster_kit.ssh import fanout as ssh_fanout

    if os.environ.get(PROCESSES_ENV):
        ssh_fanout.fanout_processes = int(os.environ[PROCESSES_ENV])

    client["imported"] = time.monotonic()
    config, fanout, count, command = argv[0], int(argv[1]), int(argv[2]), argv[3:]
    settings = SshSettings(config_file=config, fanout=fanout, connect_timeout=60, command_timeout=600)
    record = os.environ.get(TIMELINE_ENV)
    timelines: list[tuple[str, float, list[tuple[str, float]]]] = []
    if record:
        set_timeline_recorder(lambda host, start, marks: timelines.append((host, start, marks)))
    names = [f"b{i:03d}" for i in range(1, count + 1)]
    workers = ssh_fanout.process_count(settings, count)  # what fan_out will choose
    batch = int(os.environ.get(BATCH_ENV) or len(names))
    results = [result for start in range(0, len(names), batch)
               for result in fan_out(names[start:start + batch], " ".join(command), settings)]
    client["returned"] = time.monotonic()
    out: list[str] = []
    for result in results:
        if result.error is not None:
            print(f"{result.host}: {result.error}", file=sys.stderr)
        out.extend(f"{result.host}: {line}" for line in result.stdout.splitlines())
    sys.stdout.write("\n".join(out) + "\n")
    sys.stdout.flush()
    client["written"] = time.monotonic()
    if record:
        with open(record, "w") as f:  # dumps, not dump: json.dump's encoder is pure Python, 4 % of the run's CPU
            f.write(json.dumps({"client": client, "timelines": timelines, "workers": workers,
                                "peak_rss_mb": peak_rss_mb() + workers_rss_mb(workers)}))
    sys.stderr.flush()
    # Leave without the interpreter's teardown (freeing every module: 0.15 s of CPU,
    # 0.5-1.2 s of wall on this loaded machine, after the last host is done), as a
    # command-line tool that has written its output can.
    os._exit(0 if all(r.ok for r in results) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
