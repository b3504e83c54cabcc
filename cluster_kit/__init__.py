"""clusterkit: render, check and submit multi-node PyTorch jobs on Slurm."""

__version__ = "0.1.0"
