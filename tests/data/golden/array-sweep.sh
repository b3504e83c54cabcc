#!/bin/bash
#SBATCH --job-name=tune
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --partition=debug
#SBATCH --output=logs/%x-%A_%a.out
#SBATCH --chdir=/scratch/tune
#SBATCH --array=0-5%2
# clusterkit sweep: 6 array task(s), index -> values:
#   0: env.LR=1e-3 args.1=1
#   1: env.LR=1e-3 args.1=2
#   2: env.LR=1e-3 args.1=3
#   3: env.LR=3e-4 args.1=1
#   4: env.LR=3e-4 args.1=2
#   5: env.LR=3e-4 args.1=3
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail
CLUSTERKIT_SWEEP_INDEX="${SLURM_ARRAY_TASK_ID:?clusterkit: this script runs as an array job}"
export CLUSTERKIT_SWEEP_INDEX
case "$CLUSTERKIT_SWEEP_INDEX" in
0)
export CLUSTERKIT_SWEEP_VALUES='env.LR=1e-3 args.1=1'
echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"
# Rendered by clusterkit from template "ddp" for profile "sweep-test".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# environment.env
export LR=1e-3
export BS=32

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=lo
export GLOO_SOCKET_IFNAME=lo

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Array task 0 of a sweep: derived from the array job's id plus the
# task's index, so the tasks of one array (which may share a node) differ.
MASTER_PORT="$(( 20000 + (SLURM_ARRAY_JOB_ID + 0) % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=1 --ntasks="$(( SLURM_JOB_NUM_NODES * 1 ))" --kill-on-bad-exit=1 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --lr 1
;;
1)
export CLUSTERKIT_SWEEP_VALUES='env.LR=1e-3 args.1=2'
echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"
# Rendered by clusterkit from template "ddp" for profile "sweep-test".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# environment.env
export LR=1e-3
export BS=32

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=lo
export GLOO_SOCKET_IFNAME=lo

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Array task 1 of a sweep: derived from the array job's id plus the
# task's index, so the tasks of one array (which may share a node) differ.
MASTER_PORT="$(( 20000 + (SLURM_ARRAY_JOB_ID + 1) % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=1 --ntasks="$(( SLURM_JOB_NUM_NODES * 1 ))" --kill-on-bad-exit=1 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --lr 2
;;
2)
export CLUSTERKIT_SWEEP_VALUES='env.LR=1e-3 args.1=3'
echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"
# Rendered by clusterkit from template "ddp" for profile "sweep-test".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# environment.env
export LR=1e-3
export BS=32

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=lo
export GLOO_SOCKET_IFNAME=lo

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Array task 2 of a sweep: derived from the array job's id plus the
# task's index, so the tasks of one array (which may share a node) differ.
MASTER_PORT="$(( 20000 + (SLURM_ARRAY_JOB_ID + 2) % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=1 --ntasks="$(( SLURM_JOB_NUM_NODES * 1 ))" --kill-on-bad-exit=1 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --lr 3
;;
3)
export CLUSTERKIT_SWEEP_VALUES='env.LR=3e-4 args.1=1'
echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"
# Rendered by clusterkit from template "ddp" for profile "sweep-test".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# environment.env
export LR=3e-4
export BS=32

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=lo
export GLOO_SOCKET_IFNAME=lo

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Array task 3 of a sweep: derived from the array job's id plus the
# task's index, so the tasks of one array (which may share a node) differ.
MASTER_PORT="$(( 20000 + (SLURM_ARRAY_JOB_ID + 3) % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=1 --ntasks="$(( SLURM_JOB_NUM_NODES * 1 ))" --kill-on-bad-exit=1 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --lr 1
;;
4)
export CLUSTERKIT_SWEEP_VALUES='env.LR=3e-4 args.1=2'
echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"
# Rendered by clusterkit from template "ddp" for profile "sweep-test".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# environment.env
export LR=3e-4
export BS=32

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=lo
export GLOO_SOCKET_IFNAME=lo

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Array task 4 of a sweep: derived from the array job's id plus the
# task's index, so the tasks of one array (which may share a node) differ.
MASTER_PORT="$(( 20000 + (SLURM_ARRAY_JOB_ID + 4) % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=1 --ntasks="$(( SLURM_JOB_NUM_NODES * 1 ))" --kill-on-bad-exit=1 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --lr 2
;;
5)
export CLUSTERKIT_SWEEP_VALUES='env.LR=3e-4 args.1=3'
echo "clusterkit: array task $CLUSTERKIT_SWEEP_INDEX: $CLUSTERKIT_SWEEP_VALUES"
# Rendered by clusterkit from template "ddp" for profile "sweep-test".
# shellcheck disable=SC2016 # single quotes keep values and per-task code literal
set -euo pipefail

# environment.env
export LR=3e-4
export BS=32

# Network (ethernet): NCCL and Gloo settings from the profile.
export NCCL_IB_DISABLE=1
export NCCL_SOCKET_IFNAME=lo
export GLOO_SOCKET_IFNAME=lo

# Rendezvous on the first node of the allocation. (No `| head -n 1`: on a long
# node list SIGPIPE would kill scontrol, which pipefail turns into a failure.)
clusterkit_nodes="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${clusterkit_nodes%%$'\n'*}"
# Array task 5 of a sweep: derived from the array job's id plus the
# task's index, so the tasks of one array (which may share a node) differ.
MASTER_PORT="$(( 20000 + (SLURM_ARRAY_JOB_ID + 5) % 10000 ))"
export MASTER_ADDR MASTER_PORT

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=1 --ntasks="$(( SLURM_JOB_NUM_NODES * 1 ))" --kill-on-bad-exit=1 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --lr 3
;;
*)
echo "clusterkit: no sweep values for array task $CLUSTERKIT_SWEEP_INDEX" >&2
exit 2
;;
esac
