"""The rank files of a control folder read back field by field: stacks, faults, exceptions, heartbeats.

Stacks and exception files are the recorded ones of tests/data/flight_recorder (some with a
thread or a line added); fault files are written here as faulthandler writes them.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from cluster_kit.analysis.flight_recorder import parse_dump
from cluster_kit.analysis.rank_files import (
    MAX_FILE_BYTES,
    ExceptionReport,
    Frame,
    parse_exception,
    parse_stack,
    read_dump_folder,
    read_exceptions,
    read_text,
    user_frame,
)
from cluster_kit.trainer.contract import parse_header, parse_heartbeat

DATA = Path(__file__).resolve().parents[2] / "data" / "flight_recorder"
HANG = DATA / "hang" / "dumps" / "hang-1"
RANK3_STACK = (HANG / "rank-3.stack").read_text()
MAIN3 = "0x00007fc312050b80"  # rank 3's main thread in its header
# A thread of the rank's own (a data loader's) between the watcher and the main thread.
LOADER = """Thread 0x00007fc2e9afe6c0 (most recent call first):
  File "/home/alice/clusterkit/tests/integration/loader.py", line 12 in prefetch
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 982 in run

"""
STACK3_WITH_LOADER = RANK3_STACK.replace(f"Thread {MAIN3}", LOADER + f"Thread {MAIN3}")
SEGFAULT = """Fatal Python error: Segmentation fault

Thread 0x00007fc2ea2ff6c0 (most recent call first):
  File "/home/alice/clusterkit/cluster_kit/supervision.py", line 205 in _watch
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", line 982 in run

Current thread 0x00007fc312050b80 (most recent call first):
  File "/home/alice/job/model.py", line 12 in forward
  File "/home/alice/job/train.py", line 40 in step

Extension modules: torch._C (total: 1)
"""
LOAD_BATCH = Frame("/home/alice/clusterkit/tests/integration/supervised_job.py", 43, "load_batch")


def test_the_header_names_the_main_thread_even_after_another_thread_of_the_rank() -> None:
    stack = parse_stack(STACK3_WITH_LOADER)
    assert [t.ident for t in stack.threads] == ["0x00007fc2ea2ff6c0", "0x00007fc2e9afe6c0", MAIN3]
    main = stack.main_thread()
    assert main is not None and main.ident == MAIN3 and main.frames[0] == LOAD_BATCH
    assert stack.where() == LOAD_BATCH
    assert stack.text == STACK3_WITH_LOADER


def test_the_main_thread_is_matched_whatever_the_case_of_its_hex_digits() -> None:
    upper = STACK3_WITH_LOADER.replace(f"main_thread: {MAIN3}", "main_thread: 0x00007FC312050B80")
    main = parse_stack(upper).main_thread()
    assert main is not None and main.ident == MAIN3
    lower_header = STACK3_WITH_LOADER.replace(f"Thread {MAIN3}", "Thread 0x00007FC312050B80")
    main = parse_stack(lower_header).main_thread()
    assert main is not None and main.ident == "0x00007FC312050B80"


def test_without_a_main_thread_header_the_first_thread_that_did_not_write_the_dump() -> None:
    body = STACK3_WITH_LOADER.split("\n\n", 1)[1]  # faulthandler's text alone, no header
    stack = parse_stack(body)
    assert stack.header == {}
    main = stack.main_thread()
    assert main is not None and main.ident == "0x00007fc2e9afe6c0"
    # a header that names no thread of the dump: the same
    other = STACK3_WITH_LOADER.replace(f"main_thread: {MAIN3}", "main_thread: 0x00007fc300000000")
    main = parse_stack(other).main_thread()
    assert main is not None and main.ident == "0x00007fc2e9afe6c0"


def test_a_dump_with_only_the_watchers_thread_has_no_main_thread_and_no_place() -> None:
    watcher_only = RANK3_STACK.split(f"Thread {MAIN3}")[0]
    stack = parse_stack(watcher_only.replace(f"main_thread: {MAIN3}\n", ""))
    assert [t.current for t in stack.threads] == [True]
    assert stack.main_thread() is None and stack.where() is None
    empty = parse_stack("rank: 3\n\n")
    assert empty.threads == () and empty.main_thread() is None and empty.where() is None


def test_a_main_thread_without_frames_has_no_place() -> None:
    stack = parse_stack(f"main_thread: {MAIN3}\n\nThread {MAIN3} (most recent call first):\n  <no Python frame>\n")
    main = stack.main_thread()
    assert main is not None and main.frames == () and stack.where() is None


def test_only_library_frames_give_the_innermost_one() -> None:
    library = (Frame("/usr/lib/python3.11/threading.py", 320, "wait"),
               Frame("/venv/lib/python3.11/site-packages/torch/distributed/c10d.py", 10, "barrier"))
    assert user_frame(library) == library[0]
    assert user_frame((library[0], LOAD_BATCH, library[1])) == LOAD_BATCH


def test_a_fault_files_frames_are_the_current_threads() -> None:
    report = parse_exception(SEGFAULT, 4, 1796357000.5, fault=True)
    assert report == ExceptionReport(4, "", 1796357000.5, SEGFAULT, True)
    assert report.frames() == (Frame("/home/alice/job/model.py", 12, "forward"),
                               Frame("/home/alice/job/train.py", 40, "step"))


def test_a_fault_that_names_no_current_thread_gives_the_thread_in_the_users_code() -> None:
    # a fatal signal on a thread without Python state (NCCL's watchdog aborting): every
    # thread is a "Thread", and the one that trains is the one in the user's code
    report = ExceptionReport(4, "", None, SEGFAULT.replace("Current thread", "Thread"), fault=True)
    assert report.frames() == (Frame("/home/alice/job/model.py", 12, "forward"),
                               Frame("/home/alice/job/train.py", 40, "step"))
    # no thread in the user's code: the first one
    library_only = SEGFAULT.replace("Current thread", "Thread").replace("/home/alice/job/", "/usr/lib/python3.11/")
    assert ExceptionReport(4, "", None, library_only, fault=True).frames() == (
        Frame("/home/alice/clusterkit/cluster_kit/supervision.py", 205, "_watch"),
        Frame("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", 982, "run"))
    assert ExceptionReport(4, "", None, "Fatal Python error: Aborted\n", fault=True).frames() == ()


def test_the_last_lines_are_the_last_five_that_are_not_blank() -> None:
    text = "".join(f"line {n}\n\n" for n in range(1, 9))
    assert ExceptionReport(0, "", None, text).last_lines() == ("line 4", "line 5", "line 6", "line 7", "line 8")
    assert ExceptionReport(0, "", None, text).last_lines(2) == ("line 7", "line 8")


def test_an_exception_file_is_its_header_then_its_traceback() -> None:
    text = (DATA / "crash" / "exceptions" / "rank-2.txt").read_text()
    report = parse_exception(text, 2, mtime=1.0)
    traceback = text.split("\n\n", 1)[1]
    assert traceback.startswith("Traceback (most recent call last):\n")
    assert report == ExceptionReport(2, "vm", 1796357631.748, traceback, False)  # the header's time, not mtime
    assert report.frames()[0] == Frame("/home/alice/clusterkit/tests/integration/supervised_job.py", 57, "bad_batch")


def test_without_a_header_the_time_is_the_files_and_there_is_no_host() -> None:
    report = parse_exception(SEGFAULT, 1, 1796357000.5)
    assert report == ExceptionReport(1, "", 1796357000.5, SEGFAULT, False)
    assert parse_exception("rank: 1\nhost: vm\n\nboom\n", 1) == ExceptionReport(1, "vm", None, "boom\n", False)


def test_a_header_is_key_colon_value_lines_up_to_the_blank_line() -> None:
    assert parse_header("rank: 2\nhost: vm\nnote: a: b \n\nbody\n\nmore") == (
        {"rank": "2", "host": "vm", "note": "a: b"}, "body\n\nmore")
    # faulthandler's first line is not a header: "Fatal Python error" has spaces
    assert parse_header(SEGFAULT) == ({}, SEGFAULT)
    assert parse_header("rank 2\n\nbody") == ({}, "rank 2\n\nbody")


def test_a_heartbeat_is_its_first_line() -> None:
    beat = parse_heartbeat("5 1796357618.757 vm 20827\n6 1796357619.1 vm 20827\n")
    assert (beat.steps, beat.time, beat.host, beat.pid) == (5, 1796357618.757, "vm", 20827)


def test_a_bad_heartbeat_is_quoted_to_80_characters() -> None:
    text = "5 " + "x" * 100
    try:
        parse_heartbeat(text)
    except ValueError as exc:
        assert str(exc) == f"a heartbeat line has 4 or 5 fields (steps time host pid [pause]), not {text[:80]!r}"
    else:
        raise AssertionError("no ValueError")


def test_files_are_read_as_utf8_with_bad_bytes_replaced_and_only_so_far(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.txt"
    path.write_bytes(b"caf\xc3\xa9 \xff\xfe end\n")
    assert read_text(str(path)) == "caf\u00e9 \ufffd\ufffd end\n"
    path.write_bytes(b"a" * MAX_FILE_BYTES + b"tail")
    text = read_text(str(path))
    assert len(text) == MAX_FILE_BYTES == 4 << 20 and text.endswith("a")


def test_a_rank_with_only_a_stack_or_only_a_torch_dump_is_read(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps" / "r1"
    dumps.mkdir(parents=True)
    shutil.copy(HANG / "rank-3.stack", dumps / "rank-3.stack")  # no heartbeat, no dump
    shutil.copy(DATA / "nccl" / "nccl-pending.json", dumps / "rank-5.fr.json")  # torch's JSON: no rank in it
    ranks = read_dump_folder(str(tmp_path), "r1")
    assert sorted(ranks) == [3, 5]
    assert ranks[3].heartbeat is None and ranks[3].dump is None and ranks[3].problems == ()
    assert ranks[3].stack is not None and ranks[3].stack.where() == LOAD_BATCH
    assert ranks[5].dump is not None and ranks[5].dump.rank == 5 and ranks[5].problems == ()
    assert ranks[5].dump == parse_dump((DATA / "nccl" / "nccl-pending.json").read_text(), 5)


def test_a_stack_that_cannot_be_read_is_a_problem(tmp_path: Path) -> None:
    stack = tmp_path / "dumps" / "r1" / "rank-2.stack"
    stack.mkdir(parents=True)  # a folder where the file should be
    files = read_dump_folder(str(tmp_path), "r1")[2]
    assert files.stack is None
    assert files.problems == (f"{stack}: [Errno 21] Is a directory: '{stack}'",)


def test_fault_files_are_read_after_exception_files(tmp_path: Path) -> None:
    (tmp_path / "exceptions").mkdir()
    (tmp_path / "faults").mkdir()
    (tmp_path / "exceptions" / "rank-0.txt").mkdir()  # unreadable: skipped, the rest still read
    shutil.copy(DATA / "crash" / "exceptions" / "rank-2.txt", tmp_path / "exceptions" / "rank-2.txt")
    (tmp_path / "exceptions" / "rank-3.txt").write_text("Traceback (most recent call last):\nKeyError: 'x'\n")
    (tmp_path / "faults" / "rank-1.txt").write_text(SEGFAULT)
    (tmp_path / "faults" / "rank-2.txt").write_text("")  # no fatal signal came
    for name, when in (("exceptions/rank-3.txt", 1796357001.25), ("faults/rank-1.txt", 1796357002.5)):
        os.utime(tmp_path / name, (when, when))
    reports = read_exceptions(str(tmp_path))
    rank2 = (DATA / "crash" / "exceptions" / "rank-2.txt").read_text()
    assert reports == (
        ExceptionReport(2, "vm", 1796357631.748, rank2.split("\n\n", 1)[1], False),
        ExceptionReport(3, "", 1796357001.25, "Traceback (most recent call last):\nKeyError: 'x'\n", False),
        ExceptionReport(1, "", 1796357002.5, SEGFAULT, True),
    )
