"""The fleet: preflight over SSH, flat facts, audit (drift, baselines, drain plans)."""
