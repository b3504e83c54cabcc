"""The one deadline thread behind every host attempt (ssh/deadlines.py)."""
from __future__ import annotations

import os
import threading
import time

import pytest

from cluster_kit.ssh.deadlines import Watchdog


def callbacks_started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    """The watchdog's callback threads started after `before` was taken."""
    return [t for t in threading.enumerate() if t.name == "clusterkit-deadline" and t not in before]


def test_alarms_fire_in_deadline_order_and_cancelled_ones_never() -> None:
    watchdog = Watchdog()
    fired: list[str] = []
    done = threading.Event()
    before = set(threading.enumerate())
    now = time.monotonic()
    watchdog.call_at(now + 0.3, lambda: (fired.append("late"), done.set()))
    cancelled = watchdog.call_at(now + 0.1, lambda: fired.append("cancelled"))
    watchdog.call_at(now + 0.2, lambda: fired.append("second"))
    watchdog.call_at(now + 0.05, lambda: fired.append("first"))  # earlier than the one it waits for
    cancelled.cancel()
    assert done.wait(5)
    for thread in callbacks_started_since(before):  # every callback that did start has returned
        thread.join(5)
    assert fired == ["first", "second", "late"]


def test_a_blocking_callback_delays_no_other_deadline() -> None:
    watchdog = Watchdog()
    blocking, release, second = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []
    now = time.monotonic()
    watchdog.call_at(now, lambda: (blocking.set(), release.wait(10)))  # a close that hangs
    watchdog.call_at(now + 0.05, lambda: (seen.append(blocking.is_set() and not release.is_set()), second.set()))
    try:
        assert second.wait(5)
        assert seen == [True]  # it fired while the first was still blocked
    finally:
        release.set()


def test_many_cancelled_alarms_do_not_pile_up() -> None:
    watchdog = Watchdog()
    far = time.monotonic() + 3600
    for _ in range(5000):
        watchdog.call_at(far, lambda: None).cancel()
    assert len(watchdog._heap) <= 1024


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_worker_gets_a_watchdog_of_its_own() -> None:
    watchdog = Watchdog()
    watchdog.call_at(time.monotonic() + 3600, lambda: None)  # the parent's thread now runs
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its alarm must fire though it never had the parent's thread
        fired = threading.Event()
        watchdog.call_at(time.monotonic() + 0.05, fired.set)
        os.write(write_fd, b"y" if fired.wait(5) and len(watchdog._heap) == 0 else b"n")
        os._exit(0)
    os.close(write_fd)
    answer = os.read(read_fd, 1)
    os.waitpid(pid, 0)
    os.close(read_fd)
    assert answer == b"y"


def test_a_cancelled_alarm_lets_go_of_its_callback_at_once() -> None:
    """A host's attempt (its closed transport, its output) must not live until a
    deadline minutes away: 2,000 of them held 17 MB more at 2,000 nodes."""
    import gc
    import weakref

    class Attempt:
        def abort(self) -> None:
            pass

    watchdog = Watchdog()
    watchdog.call_at(time.monotonic() + 1800, lambda: None)  # live, and ahead of it in the heap
    attempt = Attempt()
    gone = weakref.ref(attempt)
    watchdog.call_at(time.monotonic() + 3600, attempt.abort).cancel()
    del attempt
    gc.collect()
    assert gone() is None
