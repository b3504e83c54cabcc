#!/usr/bin/env python3
"""Stand-in dmesg for the dev cluster's fake nodes.

Installed as `$DIR/nodes/<node>/bin/dmesg` (first on PATH): plain `dmesg` prints
the kernel ring buffer as the real one does, "[%12.6f] message" (printf style) with seconds
since boot. The messages come from `../dmesg.txt`, one "AGE_SECONDS<TAB>message"
per line, so a planted line keeps its age whenever it is read: its stamp is
this machine's uptime minus the age. No dmesg.txt: an empty ring buffer.
The uptime is read where the probe reads it ($CLUSTERKIT_PROBE_ROOT/proc/uptime
when that is set), so a test can set the clock of both.
Kept to Python 3.6 syntax like the probe.
"""

import os
import sys

NODE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG_PATH = os.path.join(NODE_DIR, "dmesg.txt")


def main():
    with open(os.environ.get("CLUSTERKIT_PROBE_ROOT", "").rstrip("/") + "/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    try:
        with open(LOG_PATH) as handle:
            lines = [line.rstrip("\n").split("\t", 1) for line in handle if "\t" in line]
    except OSError:
        lines = []
    for age, message in sorted(lines, key=lambda entry: -float(entry[0])):
        sys.stdout.write(f"[{max(0.0, uptime - float(age)):12.6f}] {message}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
