"""The delaying TCP relay of the jump-host benchmark (benchmarks/relay.py): the
delay line's order and timing exactly, then the relay itself on real loopback
sockets, timed."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from relay import DelayLine


def test_chunks_come_out_in_order_each_after_its_own_delay() -> None:
    line = DelayLine(0.010)
    line.push(b"ab", 1.000)
    line.push(b"cd", 1.004)
    assert line.next_due() == pytest.approx(1.010)
    assert line.pop_due(1.009) == b""
    assert line.pop_due(1.010) == b"ab"  # the second is not held back to the first's time
    assert line.next_due() == pytest.approx(1.014)
    assert line.pop_due(1.020) == b"cd"
    assert line.next_due() is None


def test_late_pops_join_what_is_due() -> None:
    line = DelayLine(0.010)
    for i, chunk in enumerate((b"1", b"2", b"3")):
        line.push(chunk, 0.001 * i)
    assert line.pop_due(0.0115) == b"12"
    assert line.pop_due(0.1) == b"3"


def test_eof_is_delivered_after_the_data_before_it() -> None:
    line = DelayLine(0.010)
    line.push(b"x", 0.0)
    line.close(0.002)
    assert not line.finished(0.011)  # x not popped yet
    assert line.pop_due(0.011) == b"x"
    assert line.next_due() == pytest.approx(0.012)
    assert not line.finished(0.0115)
    assert line.finished(0.012)
    with pytest.raises(ValueError):
        line.push(b"late", 0.02)


def _echo_server(sock: socket.socket) -> None:
    conn, _ = sock.accept()
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def test_the_relay_adds_twice_its_delay_to_a_round_trip_and_keeps_every_byte() -> None:
    echo = socket.socket()
    echo.bind(("127.0.0.1", 0))
    echo.listen(1)
    threading.Thread(target=_echo_server, args=(echo,), daemon=True).start()
    port = _free_port("127.0.0.1")
    relay = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "relay.py"),
                              "--listen", f"127.0.0.1:{port}",
                              "--to", f"127.0.0.1:{echo.getsockname()[1]}", "--delay-ms", "10"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout is not None and relay.stdout.readline().strip() == "listening"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            trips = []
            for i in range(5):
                started = time.perf_counter()
                conn.sendall(b"ping %d" % i)
                assert conn.recv(100) == b"ping %d" % i
                trips.append(time.perf_counter() - started)
            assert min(trips) >= 0.020  # 10 ms each way, never less
            payload = bytes(range(256)) * 1024  # 256 KiB through both directions
            conn.sendall(payload)
            got = bytearray()
            while len(got) < len(payload):
                got += conn.recv(65536)
            assert bytes(got) == payload
    finally:
        relay.terminate()
        relay.wait(timeout=10)
        echo.close()
