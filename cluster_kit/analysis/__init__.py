"""Where a DDP step's time goes, from PyTorch profiler traces (pure: stdlib only).

traces.py reads the Chrome-trace JSON files, steps.py cuts them into ProfilerStep
windows, intervals.py does the union/overlap arithmetic, collectives.py finds the
collectives with their sizes and bus bandwidth, breakdown.py adds up each rank's
step, advice.py says what to change (with the figures behind it), and report.py
and html.py write it out. Nothing here imports torch, paramiko or subprocess.
"""
