"""The supervisor process in the batch script: this job's attempts, then the chain's next step.

`python supervisor.pyz --settings JSON [--preflight-failed NODES] --script PATH
--bundle PATH -- LAUNCH...` (the batch script `exec`s it, so that
`--signal=B:USR1@grace` reaches it). The settings are one JSON document the renderer
derived from the job file's `resilience:` (settings.py). Stdlib only, Python 3.8+;
every Slurm command has a timeout (slurmctl.py); nothing is built from what a rank
wrote.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cluster_kit.supervisor import lock, private, record, slurmctl
from cluster_kit.supervisor.allocation import Allocation
from cluster_kit.supervisor.attempt import say
from cluster_kit.supervisor.attempts import Attempts
from cluster_kit.supervisor.chain import Chain, Refused, SlurmJob
from cluster_kit.supervisor.settings import BadSettings, Settings, parse_settings


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clusterkit-supervisor")
    parser.add_argument("--settings", required=True, help="the job's supervisor settings (one JSON document)")
    parser.add_argument("--preflight-failed", default="", help="nodes (comma-separated) the in-job preflight failed")
    parser.add_argument("--script", required=True, help="the batch script, to submit the next attempt")
    parser.add_argument("--bundle", default="", help="this zip app, removed once loaded")
    parser.add_argument("launch", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.launch[:1] == ["--"]:
        args.launch = args.launch[1:]
    if not args.launch:
        parser.error("no launch command after --")
    return args


def run(args: argparse.Namespace, settings: Settings) -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id:
        say("SLURM_JOB_ID is not set: the supervisor runs inside a Slurm batch job")
        return 2
    job = SlurmJob(job_id, slurmctl.show_job(job_id))
    chain = Chain.open(job, slurmctl.job_comment(job_id), settings)
    lock.take_lock(chain.folder, job_id)
    try:
        chain.reload()
        return run_chain(chain, args, settings)
    finally:
        lock.release_lock(chain.folder, job_id)


def run_chain(chain: Chain, args: argparse.Namespace, settings: Settings) -> int:
    """This job's part of the chain, with the chain's lock held."""
    rec, job_id = chain.rec, chain.job.id
    if rec.final is not None:
        say(f"the chain of job {chain.chain_id} ended ({rec.final.why}): job {job_id} does not train")
        return rec.final.exit_code
    if not rec.attempts:
        chain.keep_script(args.script)
    if not chain.close_lost_attempts():
        chain.drop_standby((rec.standby or {}).get("after", ""))
        chain.save()
        say(rec.final.why if rec.final else "the chain was cancelled")
        return rec.final.exit_code if rec.final else 1
    chain.keep_standby()
    here = Allocation(job_id, os.environ.get("SLURM_JOB_NODELIST", ""), os.environ.get("SLURMD_NODENAME", ""),
                      chain.folder)
    try:
        return Attempts(chain, settings, list(args.launch), here).run(
            [n for n in args.preflight_failed.split(",") if n])
    except Exception:
        chain.drop_standby(job_id)  # a supervisor that fails must not be taken over, again and again
        chain.save()
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.bundle:
        try:
            os.unlink(args.bundle)  # every module is loaded by now
        except OSError:
            pass
    try:
        return run(args, parse_settings(args.settings))
    except (Refused, BadSettings, private.Untrusted, record.CorruptRecord, lock.Held) as exc:
        say(f"{exc}")
        return 1
    except RuntimeError as exc:
        say(str(exc))
        return 1
