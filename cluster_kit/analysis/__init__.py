"""Where a DDP step's time goes, and who holds a job up (pure: stdlib only).

traces.py reads the Chrome-trace JSON files, steps.py cuts them into ProfilerStep
windows, intervals.py does the union/overlap arithmetic, collectives.py finds the
collectives with their sizes and bus bandwidth, breakdown.py adds up each rank's
step, advice.py says what to change (with the figures behind it), and report.py
and html.py write it out.

For supervised jobs, flight_recorder.py reads PyTorch Flight Recorder dumps,
rank_files.py the heartbeats, stacks and exception files ranks leave in the
control folder, faults.py says whether a failure is the node's or the program's
(and a program error's signature), and culprit.py names the rank behind a hang or
the one to blame for a crash; these four also run on Python 3.8 from a zip app
inside the job.
Nothing here imports torch, paramiko or subprocess.

`__all__` is the room's surface: the modules other rooms import; steps, intervals,
collectives, advice, html and flight_recorder serve those.
"""

__all__ = ["breakdown", "culprit", "faults", "find_slow", "pool", "rank_files", "report", "traces"]
