#!/bin/bash
#SBATCH --job-name="cpu ddp"
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=12
#SBATCH --mem=16G
#SBATCH --time=04:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj123
#SBATCH --qos=normal
#SBATCH --output=logs/%x-%j.out
#SBATCH --chdir=/scratch/alice/run1
# Rendered by clusterkit from template "ddp" for profile "tcp-only".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_DEBUG=WARN

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Derived from the job id: jobs sharing a node get different ports, all below
# the Linux ephemeral range (32768 and up).
MASTER_PORT="$(( 20000 + SLURM_JOB_ID % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=2 --ntasks="$(( SLURM_JOB_NUM_NODES * 2 ))" --kill-on-bad-exit=1 --cpus-per-task=12 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --epochs 3
