"""The supervisor of a job with `resilience:`: it runs in the batch script.

It starts the attempt's launch (srun or torchrun), watches every rank's heartbeat
in the control folder, and ends the attempt on a hang (after gathering each rank's
stack and Flight Recorder dump and naming the rank(s) behind), a crash, a failed
node, the grace signal or a cancel. It then starts the next attempt in the
allocation, submits the next job without the blamed nodes, or ends the chain. Every
attempt goes into `attempts.json` in the job's record folder (`<folder of the job's
output>/clusterkit-<first job id>/`).

settings.py reads what the job script hands the supervisor (one JSON document of the
job file's `resilience:`), record.py owns the attempts record (typed; read by the CLI
too, through `parse`), chain.py is the one owner of a chain (its record, standby and
next job), attempts.py runs this job's attempts over attempt.py's watched launch and
ending.py's reading of how each ended, decide.py holds the pure decisions (hang, how
an attempt ended, what comes next), slurmctl.py the Slurm commands, job.py the
process, bundle.py the zip app that travels in the batch script. Everything but
bundle.py runs inside the job on the stdlib, Python 3.8+.
`__all__` is the room's surface: the modules other rooms import.
"""

__all__ = ["bundle", "record", "settings"]
