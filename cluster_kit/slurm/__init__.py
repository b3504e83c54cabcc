"""Slurm: pure builders/parsers and fixes, the one runner (local or login node), job lifecycle."""
