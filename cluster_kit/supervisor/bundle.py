"""The supervisor as a zip app (base64 text) for the batch script.

It holds the supervisor package, the stdlib modules of the diagnosis it runs
(analysis.flight_recorder, rank_files, faults, culprit; slurm.outcome, builders and
node_names), the hostlist value type, and the trainer's stdlib side it shares with the
ranks (the contract, what is trusted on disk, checkpoint interval, store and status),
each package with an empty `__init__`: nothing else of clusterkit is needed on the nodes.
"""
import base64
import io
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
MODULES = ("supervisor/__init__.py", "supervisor/private.py", "supervisor/record.py", "supervisor/lock.py",
           "supervisor/settings.py", "supervisor/decide.py", "supervisor/slurmctl.py", "supervisor/launch.py",
           "supervisor/attempt.py", "supervisor/allocation.py", "supervisor/chain.py", "supervisor/ending.py",
           "supervisor/attempts.py", "supervisor/job.py",
           "trainer/contract.py", "trainer/trust.py", "trainer/checkpoint/interval.py",
           "trainer/checkpoint/store.py", "trainer/checkpoint/status.py",
           "analysis/flight_recorder.py", "analysis/rank_files.py", "analysis/faults.py", "analysis/culprit.py",
           "slurm/outcome.py", "slurm/builders.py", "slurm/node_names.py", "hostlist.py")
MAIN = "import sys\nfrom cluster_kit.supervisor.job import main\nsys.exit(main())\n"


def build_bundle() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("__main__.py", MAIN)
        for package in ("cluster_kit", "cluster_kit/analysis", "cluster_kit/slurm", "cluster_kit/trainer",
                        "cluster_kit/trainer/checkpoint"):
            zf.writestr(f"{package}/__init__.py", "")
        for name in MODULES:
            zf.write(PACKAGE / name, f"cluster_kit/{name}")
    return buf.getvalue()


def supervisor_source() -> str:
    """The bundle as base64 text in 76-column lines, for a quoted heredoc."""
    return base64.encodebytes(build_bundle()).decode("ascii")
