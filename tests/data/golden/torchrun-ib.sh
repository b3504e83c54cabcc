#!/bin/bash
#SBATCH --job-name=llama-ft
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=96
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
# Rendered by clusterkit from template "ddp" for profile "ib-ndr".
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

# Network (infiniband): NCCL and Gloo settings from the profile.
export NCCL_IB_HCA='=mlx5_0:1,mlx5_3:1'
export NCCL_IB_TIMEOUT=22
export NCCL_SOCKET_IFNAME=ib0
export GLOO_SOCKET_IFNAME=ib0

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Derived from the job id: jobs sharing a node get different ports, all below
# the Linux ephemeral range (32768 and up).
MASTER_PORT="$(( 20000 + SLURM_JOB_ID % 10000 ))"
export MASTER_ADDR MASTER_PORT

# cluster_kit.ddp.build_step captures the DDP step in a CUDA graph when this is 1.
export CLUSTERKIT_CUDA_GRAPHS=1

# torchrun, one agent per node, 8 worker(s) each: the c10d
# rendezvous sets RANK, LOCAL_RANK and WORLD_SIZE for the workers. Node 0 hosts
# the store (is_host=1): a node's Slurm name need not resolve to an address
# c10d recognises as its own.
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" --kill-on-bad-exit=1 --cpus-per-task=96 \
  bash -c 'if [ "$SLURM_NODEID" = 0 ]; then is_host=1; else is_host=0; fi
python="$1"; shift
exec "$python" -m torch.distributed.run --nnodes="$SLURM_NNODES" --nproc-per-node=8 \
  --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
  --rdzv-conf=is_host="$is_host" "$@"' \
  clusterkit-torchrun python3 train.py --epochs 3
