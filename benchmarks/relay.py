"""A TCP relay that delays every chunk by a fixed time in each direction.

    python3 benchmarks/relay.py --listen 127.0.8.1:22 --to 127.0.8.2:22 --delay-ms 10

This kernel has no `netem` qdisc, so the fan-out benchmark puts this in front of
its jump host to make a laptop-to-login-node link of 2 x delay round trip. Each
chunk read from one side is written to the other `delay` seconds after it
arrived, in order; chunks in flight do not wait for each other (the link has
latency, not a bandwidth limit), as netem's delay does. Connections are
independent; closing either side closes the pair once what was in flight is
delivered. Prints "listening" once it accepts.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import signal
import socket
import sys
import time

CHUNK = 65536


class DelayLine:
    """Chunks in arrival order, each due `delay` seconds after it came (pure)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.closed_at: float | None = None  # when EOF arrived, delivered after the data

    def push(self, data: bytes, now: float) -> None:
        if self.closed_at is not None:
            raise ValueError("data after EOF")
        self._queue.append((now + self.delay, data))

    def close(self, now: float) -> None:
        if self.closed_at is None:
            self.closed_at = now

    def next_due(self) -> float | None:
        """When the next chunk (or the EOF) is due; None when nothing is pending."""
        if self._queue:
            return self._queue[0][0]
        return None if self.closed_at is None else self.closed_at + self.delay

    def pop_due(self, now: float) -> bytes:
        """Everything due by `now`, joined in order (b"" if nothing is)."""
        out = []
        while self._queue and self._queue[0][0] <= now:
            out.append(self._queue.popleft()[1])
        return b"".join(out)

    def finished(self, now: float) -> bool:
        """True once the EOF is due and every chunk before it was popped."""
        return not self._queue and self.closed_at is not None and self.closed_at + self.delay <= now


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    line = DelayLine(delay)
    wake = asyncio.Event()

    async def read_side() -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(CHUNK):
                line.push(data, loop.time())
                wake.set()
        except OSError:
            pass
        line.close(loop.time())
        wake.set()

    async def write_side() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = line.next_due()
            if due is None:
                wake.clear()
                await wake.wait()
                continue
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            data = line.pop_due(loop.time())
            if data:
                writer.write(data)
                await writer.drain()
            if line.finished(loop.time()):
                break
        if writer.can_write_eof():
            writer.write_eof()

    reading = asyncio.ensure_future(read_side())
    try:
        await write_side()
    except OSError:
        pass
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


async def _serve_one(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     target: tuple[str, int], delay: float) -> None:
    try:
        server_r, server_w = await asyncio.wait_for(asyncio.open_connection(*target), 10)
    except (TimeoutError, OSError):
        client_w.close()
        return
    for w in (client_w, server_w):
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        await asyncio.gather(_pump(client_r, server_w, delay), _pump(server_r, client_w, delay))
    except asyncio.CancelledError:
        pass  # the relay is stopping: a quiet end, not asyncio's "exception in callback"
    finally:
        for w in (client_w, server_w):
            w.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    server = await asyncio.start_server(lambda r, w: _serve_one(r, w, target, delay),
                                        *listen, backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("listening", flush=True)
    async with server:
        await stop.wait()
    # end the connections still open ourselves, so none is destroyed while pending
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, type=_address, metavar="HOST:PORT")
    parser.add_argument("--to", required=True, type=_address, metavar="HOST:PORT")
    parser.add_argument("--delay-ms", type=float, default=10.0)
    args = parser.parse_args()
    started = time.monotonic()
    asyncio.run(_main(args.listen, args.to, args.delay_ms / 1000))
    print(f"relay stopped after {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
