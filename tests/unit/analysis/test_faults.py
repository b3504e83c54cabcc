"""Whose fault a failure is, and a program error's signature, on real tracebacks.

Recorded ones come from tests/data/flight_recorder (gloo on this CPU, CUDA and NCCL on
a GPU machine); ZeroDivisionError and torch's CPU allocator failure are raised here by
a real rank; NCCL's and CUDA's other messages are written as torch prints them
(NCCLUtils' error details, NCCL's NET/IB warning, cudaGetErrorString).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster_kit.analysis import faults
from cluster_kit.analysis.faults import (
    NODE,
    PEER,
    PROGRAM,
    Signature,
    Verdict,
    classify,
    error_signature,
    mask,
)
from cluster_kit.analysis.rank_files import ExceptionReport, read_exceptions

REPO = Path(__file__).resolve().parents[3]
RECORDED = REPO / "tests" / "data" / "flight_recorder"
PYTHON_EXCEPTION = "a Python exception raised by the script (a program error: the same on any node)"
OOM = "the script ran out of memory (a program error: the same on any node)"
TIMEOUT = "timed out waiting for another rank in a collective"
LOST_PEER = "lost a peer: another rank went away first"


def recorded(scenario: str, rank: int = 0, fault: bool = False) -> ExceptionReport:
    return next(r for r in read_exceptions(str(RECORDED / scenario)) if (r.rank, r.fault) == (rank, fault))


def traceback_of(message: str) -> ExceptionReport:
    """A traceback ending in `message`, raised in the user's train.py."""
    return ExceptionReport(0, "n1", 1.0, 'Traceback (most recent call last):\n'
                           '  File "/job/train.py", line 120, in step\n    loss.backward()\n'
                           '  File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 623, in backward\n'
                           '    torch.autograd.backward(\n' + message + "\n")


def test_a_script_that_raises_is_the_programs_fault_with_its_signature() -> None:
    report = recorded("crash", rank=2)
    assert classify(report) == Verdict(PROGRAM, PYTHON_EXCEPTION)
    assert error_signature(report) == Signature("ValueError: batch 5 has no labels", "supervised_job.py:57",
                                          "ValueError: batch # has no labels at supervised_job.py:57")


@pytest.mark.parametrize("scenario, rank, why", [
    ("crash", 0, LOST_PEER),  # gloo: "Connection closed by peer [127.0.0.1]:34731"
    ("timeout", 0, TIMEOUT),  # gloo: "Timed out waiting 10000ms for send operation to complete"
    ("timeout", 1, TIMEOUT),  # ... "for recv operation"
])
def test_gloo_timeouts_and_closed_connections_are_a_peers(scenario: str, rank: int, why: str) -> None:
    assert classify(recorded(scenario, rank)) == Verdict(PEER, why)


def test_cuda_out_of_memory_is_the_programs() -> None:
    report = recorded("gpu/cuda-oom")
    assert classify(report) == Verdict(PROGRAM, OOM)
    sig = error_signature(report)
    assert sig.where == "record_gpu_failures.py:33"
    assert sig.error.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 158.36 GiB. GPU 0 has")
    # the headline is cut at 300 characters, and every figure masked: another GPU's free memory is the same error
    assert sig.key == (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate # GiB. GPU # has a total capacity of # GiB "
        "of which # GiB is free. Including non-PyTorch memory, this process has # GiB memory in use. Of the "
        "allocated memory # MiB is allocated by PyTorch, and # MiB is reserved by  at record_gpu_failures.py:33")


def test_a_device_side_assert_is_the_programs_and_the_abort_that_follows_a_fatal_signal() -> None:
    report = recorded("gpu/device-assert")
    assert classify(report) == Verdict(PROGRAM, PYTHON_EXCEPTION)
    # the exception line is the first one after the last frame, not the last line of its message
    assert error_signature(report) == Signature(
        "torch.AcceleratorError: CUDA error: device-side assert triggered", "record_gpu_failures.py:38",
        "torch.AcceleratorError: CUDA error: device-side assert triggered at record_gpu_failures.py:38")
    abort = recorded("gpu/device-assert", fault=True)
    assert classify(abort) == Verdict(NODE, "died of a fatal signal (Fatal Python error: Aborted)")


def test_an_nccl_watchdog_abort_alone_reads_as_a_fatal_signal() -> None:
    """Its Flight Recorder makes it a peer's (test_first_failure); its text alone cannot."""
    report = recorded("gpu/nccl-timeout", fault=True)
    assert classify(report) == Verdict(NODE, "died of a fatal signal (Fatal Python error: Aborted)")
    assert report.frames()[0].short() == "distributed_c10d.py:2319 in destroy_process_group"  # the training thread


# torch's DistBackendError text: "NCCL error in: FILE:LINE, <ncclGetErrorString>, NCCL version X\n<detail>\nLast error:\n..."
SYSTEM_ERROR = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL "
                "version 2.21.5\nncclSystemError: System call (e.g. socket, malloc) or external library call failed "
                "or device error. \nLast error:\nsocketStartConnect: Connect to 10.0.0.2<56789> failed : Software "
                "caused connection abort")
IB_COMPLETION = ("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network "
                 "error, NCCL version 2.20.5\nncclRemoteError: A call failed possibly due to a network error or a "
                 "remote process exiting prematurely.\nLast error:\nNET/IB : Got completion from peer "
                 "10.5.0.34<33956> with error 12, opcode 0, len 1, vendor err 129 (Recv)")
REMOTE_EXIT = ("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network "
               "error, NCCL version 2.20.5\nncclRemoteError: A call failed possibly due to a network error or a "
               "remote process exiting prematurely.\nLast error:\nsocketProgress: Connection closed by remote peer "
               "gpu-node1<45074>")
ECC_IN_NCCL = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
               "NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
               "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
               "Cuda failure 'uncorrectable ECC error encountered'")
CUDA_ERROR_ONLY = ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
                   "NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version "
                   "2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
                   "Cuda failure 'an illegal memory access was encountered'")

# the watchdog's words in tests/data/flight_recorder/gpu/nccl-timeout/output.txt, as an exception raised with them
WATCHDOG = ("torch.distributed.DistBackendError: [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread "
            "terminated with exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, "
            "OpType=ALLREDUCE, NumelIn=1048576, NumelOut=1048576, Timeout(ms)=5000) ran for 5058 milliseconds before "
            "timing out.")


@pytest.mark.parametrize("message, verdict", [
    (SYSTEM_ERROR, Verdict(NODE, "NCCL reports a system error (network, driver or a failed system call) on the node")),
    (IB_COMPLETION, Verdict(NODE, "an InfiniBand (verbs) error on the node")),
    (REMOTE_EXIT, Verdict(PEER, LOST_PEER)),
    (ECC_IN_NCCL, Verdict(NODE, "an ECC error of the node's GPU")),
    ("torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered", Verdict(NODE, "an ECC error of the node's GPU")),
    ("RuntimeError: ibv_modify_qp failed with 110 Connection timed out", Verdict(NODE, "an InfiniBand (verbs) error on the node")),
    ("RuntimeError: NVRM: Xid (PCI:0000:2a:00): 79, pid=48213, name=python, GPU has fallen off the bus.",
     Verdict(NODE, "an Xid error of the node's GPU")),
    ("torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
     Verdict(NODE, "the node's GPU is not usable")),
    # a CUDA error of the script's own kernels follows it to any node
    (CUDA_ERROR_ONLY, Verdict(PROGRAM, PYTHON_EXCEPTION)),
    (WATCHDOG, Verdict(PEER, TIMEOUT)),
    ("AssertionError: loss is nan at step 812", Verdict(PROGRAM, PYTHON_EXCEPTION)),
    ("MemoryError", Verdict(PROGRAM, OOM)),
])
def test_nccl_cuda_and_python_messages(message: str, verdict: Verdict) -> None:
    assert classify(traceback_of(message)) == verdict


def test_only_the_errors_own_lines_are_read_not_the_source_lines_of_its_frames() -> None:
    text = ('Traceback (most recent call last):\n  File "/job/train.py", line 9, in step\n'
            '    raise RuntimeError("retry: ECC error seen before")  # NET/IB\nKeyError: 3\n')
    assert classify(ExceptionReport(0, "", None, text)) == Verdict(PROGRAM, PYTHON_EXCEPTION)


def run_rank(tmp_path: Path, code: str) -> ExceptionReport:
    """Run `code` as train.py of a supervised rank; the exception file it left."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code))
    env = dict(os.environ, CLUSTERKIT_CONTROL_DIR=str(tmp_path / "control"), RANK="0", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1, done.stderr
    return read_exceptions(str(tmp_path / "control"))[0]


def test_a_real_zero_division(tmp_path: Path) -> None:
    report = run_rank(tmp_path, """\
        from cluster_kit.trainer import supervision
        supervision.enable_supervision()
        def scale(total, count):
            return total / count
        scale(10, 0)
    """)
    assert classify(report) == Verdict(PROGRAM, PYTHON_EXCEPTION)
    assert error_signature(report) == Signature("ZeroDivisionError: division by zero", "train.py:4",
                                          "ZeroDivisionError: division by zero at train.py:4")


def test_a_real_cpu_allocation_failure(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    report = run_rank(tmp_path, """\
        import torch
        from cluster_kit.trainer import supervision
        supervision.enable_supervision()
        torch.empty(1 << 50, dtype=torch.uint8)
    """)
    assert classify(report) == Verdict(PROGRAM, OOM)
    assert error_signature(report).key == (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:#] err == #. DefaultCPUAllocator: can't allocate memory: you "
        "tried to allocate # bytes. Error code # (Cannot allocate memory) at train.py:4")


def test_masks_keep_the_words_and_drop_what_differs_between_runs() -> None:
    assert mask("batch 5 of /data/shard-0007 at 0x7f3a9c, run 3fa85f64 took 20.00 GiB") == \
        "batch # of /data/shard-# at #, run # took # GiB"
    assert mask("no labels") == "no labels"


def test_headlines_of_faults_and_of_text_without_frames() -> None:
    assert faults.headline(ExceptionReport(0, "", None, "", fault=True)) == "no output"
    assert faults.headline(ExceptionReport(0, "", None, "KeyError: 'a'\n\nnote\n    detail\n")) == "note"
    # a frame with nothing unindented after it: the last line
    assert faults.headline(ExceptionReport(0, "", None, 'Traceback (most recent call last):\n'
                                                        '  File "x.py", line 1, in f\n')) == '  File "x.py", line 1, in f'
    # without a recognisable exception line the signature is the masked line itself
    assert error_signature(ExceptionReport(0, "", None, "segfault in rank 3\n")).key == "segfault in rank #"
