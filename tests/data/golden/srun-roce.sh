#!/bin/bash
#SBATCH --job-name=llama-ft
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=0
#SBATCH --time=04:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj123
#SBATCH --qos=normal
#SBATCH --constraint=h100
#SBATCH --exclusive
#SBATCH --output=logs/%x-%j.out
#SBATCH --chdir=/scratch/alice/run1
#SBATCH --mail-type=END
# Rendered by clusterkit from template "ddp" for profile "roce-h100".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

if ! command -v module >/dev/null 2>&1; then
  echo "clusterkit: environment.modules is set but 'module' is not available on $(hostname)" >&2
  exit 1
fi
module load cuda/12.4

# environment.setup, verbatim; nounset is off because activate scripts often
# read unset variables.
set +u
# shellcheck disable=SC1090,SC1091
{
source /opt/venvs/train/bin/activate
}
set -u

# environment.env
export OMP_NUM_THREADS=8

# Network (roce): NCCL and Gloo settings from the profile.
export NCCL_IB_HCA='=mlx5_0:1,mlx5_1:1'
export NCCL_IB_GID_INDEX=3
export NCCL_SOCKET_IFNAME=eth0
export GLOO_SOCKET_IFNAME=eth0
export NCCL_DEBUG=INFO
export NCCL_IB_TC=106
export NCCL_IB_QPS_PER_CONNECTION=4

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
MASTER_PORT=29500
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=8 --ntasks="$(( SLURM_JOB_NUM_NODES * 8 ))" --kill-on-bad-exit=1 --cpus-per-task=12 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --epochs 3
