#!/usr/bin/env python3
"""Accept TCP connections and never send a byte: the dev cluster's `silent` node.

An SSH client connects, then waits for a banner that never comes, which is how a
hung sshd or a black-holing firewall looks. Usage: silent_listener.py ADDR PORT PIDFILE
"""

import os
import socket
import sys

# Held connections are dropped oldest first beyond this, so the process cannot run
# out of descriptors; clients of the dropped ones see a reset, long after their timeout.
MAX_HELD = 512


def main(argv):
    address, port, pidfile = argv[0], int(argv[1]), argv[2]
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(256)
    # The pid file appears only once the port is bound: the caller waits on it.
    with open(pidfile + ".tmp", "w") as handle:
        handle.write(f"{os.getpid()}\n")
    os.rename(pidfile + ".tmp", pidfile)
    held = []
    while True:
        connection, _ = server.accept()
        held.append(connection)
        if len(held) > MAX_HELD:
            held.pop(0).close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
