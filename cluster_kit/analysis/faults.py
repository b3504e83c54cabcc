"""Whose fault a rank's failure is, and whether the script failed this way before (pure).

A failure is one of three kinds:

* ``node``: the node's hardware or links (an ECC error, an Xid, a GPU off the bus, an
  InfiniBand error, NCCL's "unhandled system error", a rank killed by a fatal
  signal). The next attempt runs without the node.
* ``peer``: the rank failed because another one did not come or went away (a
  collective timeout, a closed connection, an aborted communicator): the failure
  is elsewhere, and the rank it waited for is the one to find.
* ``program``: a Python exception the script raised (ValueError, KeyError,
  ZeroDivisionError, an assertion, running out of memory, a CUDA error of its own
  kernels). It follows the script to any node: no node is excluded, and the same
  error twice ends the chain.

The rules are one table, read in order; the first that matches a failure's message
decides, and a traceback that matches none is the program's. Messages are matched
on the lines a traceback or fault file does not indent (the exception's lines, not
the source lines of its frames), as PyTorch, NCCL and Python print them.

The signature of a program error is what stays the same when the script fails the
same way on another node: the exception's type, its message with numbers, hex and
addresses masked, and the innermost frame of the user's code.

Stdlib only, Python 3.8+: the job's supervisor runs this from a zip app.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .rank_files import FRAME_LINE, ExceptionReport, user_frame

NODE = "node"
PEER = "peer"
PROGRAM = "program"
HEADLINE_CHARS = 300


@dataclass(frozen=True)
class Rule:
    """A message that tells whose fault a failure is, and the words for why."""

    kind: str
    pattern: re.Pattern[str]
    why: str


def _rule(kind: str, pattern: str, why: str) -> Rule:
    return Rule(kind, re.compile(pattern, re.IGNORECASE), why)


RULES = (
    # The node's GPU or links: CUDA and NCCL name them so (cudaErrorECCUncorrectable is
    # "uncorrectable ECC error encountered"; NCCL: "Cuda failure 'uncorrectable ECC
    # error encountered'"; the driver: Xid, "GPU is lost", "fallen off the bus").
    _rule(NODE, r"\bECC error", "an ECC error of the node's GPU"),
    _rule(NODE, r"\bXid\b", "an Xid error of the node's GPU"),
    _rule(NODE, r"GPU is lost|fallen off the bus", "the node's GPU fell off the bus"),
    _rule(NODE, r"CUDA-capable device\(s\) is/are busy or unavailable|no CUDA-capable device is detected",
          "the node's GPU is not usable"),
    _rule(NODE, r"\bibv_\w+|NET/IB\b|\bIBV_WC_\w+", "an InfiniBand (verbs) error on the node"),
    _rule(NODE, r"unhandled system error|ncclSystemError",
          "NCCL reports a system error (network, driver or a failed system call) on the node"),
    # Another rank: gloo's and NCCL's timeouts, and the errors of a peer gone away.
    _rule(PEER, r"Timed out waiting \d+ms|Watchdog caught collective operation timeout"
                r"|ProcessGroupNCCL's watchdog|watchdog thread terminated",
          "timed out waiting for another rank in a collective"),
    _rule(PEER, r"Connection closed by peer|Connection reset by peer|Broken pipe|communicator was aborted"
                r"|NCCL communicator|ncclRemoteError|remote process exited|DistNetworkError"
                r"|remote worker crash|failed to recv|ECONNRESET",
          "lost a peer: another rank went away first"),
    # The script's own: memory it asked for is the script's, whichever node it runs on.
    _rule(PROGRAM, r"out of memory|OutOfMemoryError|\bMemoryError\b|not enough memory|can't allocate memory",
          "the script ran out of memory (a program error: the same on any node)"),
)
FATAL_SIGNAL = "died of a fatal signal"
PYTHON_EXCEPTION = "a Python exception raised by the script (a program error: the same on any node)"

# `ValueError: bad shard 7`, `torch.OutOfMemoryError: CUDA out of memory. ...`, `KeyboardInterrupt`
EXCEPTION_LINE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?\Z")
# What differs between two runs of the same error: addresses and hashes, then any number.
MASKS = ((re.compile(r"0x[0-9a-fA-F]+"), "#"), (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"), "#"),
         (re.compile(r"\d+(?:\.\d+)?"), "#"))


@dataclass(frozen=True)
class Verdict:
    """Whose fault a failure is (``node``, ``peer`` or ``program``) and why."""

    kind: str
    why: str


@dataclass(frozen=True)
class Signature:
    """A program error as it shows the same on any node."""

    error: str  # the exception line as printed: "ValueError: batch 5 has no labels"
    where: str  # the innermost frame of the user's code: "train.py:57" ("" without frames)
    key: str  # type, masked message and place: "ValueError: batch # has no labels at train.py:57"


def message_lines(text: str) -> list[str]:
    """The lines a traceback or fault file does not indent: the error's own words."""
    return [line for line in text.splitlines() if line.strip() and not line[0].isspace()]


def classify(report: ExceptionReport) -> Verdict:
    """Whose fault the failure in `report` is: the first rule that matches its
    message; else a fatal signal is the node's and an exception the program's."""
    words = "\n".join(message_lines(report.text))
    for rule in RULES:
        if rule.pattern.search(words):
            return Verdict(rule.kind, rule.why)
    if report.fault:
        return Verdict(NODE, f"{FATAL_SIGNAL} ({headline(report)})")
    return Verdict(PROGRAM, PYTHON_EXCEPTION)


def headline(report: ExceptionReport) -> str:
    """The exception line of a traceback (the first unindented line after its last
    frame), or a fault's first line; cut at HEADLINE_CHARS."""
    lines = [line for line in report.text.splitlines() if line.strip()]
    if report.fault:
        return (lines[0] if lines else "no output")[:HEADLINE_CHARS]
    last_frame = max((i for i, line in enumerate(lines) if FRAME_LINE.match(line)), default=-1)
    after = [line for line in lines[last_frame + 1:] if not line[0].isspace()]
    if last_frame >= 0 and after:
        return after[0][:HEADLINE_CHARS]
    unindented = [line for line in lines if not line[0].isspace() and not line.startswith("Traceback")]
    return (unindented[-1] if unindented else lines[-1] if lines else "no traceback")[:HEADLINE_CHARS]


def error_signature(report: ExceptionReport) -> Signature:
    """The error's type, message and place in the user's code, and its key with the
    numbers masked: the same when the script fails the same way on another node."""
    error = headline(report)
    frames = report.frames()
    frame = user_frame(frames) if frames else None
    where = f"{os.path.basename(frame.path)}:{frame.line}" if frame else ""
    match = EXCEPTION_LINE.match(error)
    kind, message = (match.group("type"), match.group("message") or "") if match else ("", error)
    key = f"{kind}: {mask(message)}" if kind else mask(message)
    return Signature(error, where, f"{key} at {where}" if where else key)


def mask(message: str) -> str:
    """`batch 5 of /data/shard-0007 at 0x7f3a` -> `batch # of /data/shard-# at #`."""
    for pattern, replacement in MASKS:
        message = pattern.sub(replacement, message)
    return message
