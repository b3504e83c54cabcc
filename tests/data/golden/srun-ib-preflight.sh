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

# Preflight: probe every allocated node (one task per node) and check the facts
# against the profile before any rank can hang in NCCL.
clusterkit_preflight="$(mktemp -d "${TMPDIR:-/tmp}/clusterkit-preflight.XXXXXX")"
trap 'rm -rf "$clusterkit_preflight"' EXIT
cat > "$clusterkit_preflight/probe.py" <<'CLUSTERKIT_PROBE'
import json, os
print(json.dumps({"slurm_node": os.environ["SLURMD_NODENAME"], "pad": "x" * 3000}))
CLUSTERKIT_PROBE
base64 -d > "$clusterkit_preflight/checks.pyz" <<'CLUSTERKIT_CHECKS'
bm90IHJlYWxseSBhIHppcA==
CLUSTERKIT_CHECKS
# srun hands its stdin (the probe) to every task. It forwards task output in
# pieces of at most 1 KiB, so one node's long JSON line could be cut by
# another's: each node sends its facts base64-encoded in short lines tagged
# with its node id, and they are put back together here, node by node.
clusterkit_probe_rc=0
srun --ntasks-per-node=1 --ntasks="$SLURM_JOB_NUM_NODES" --input=all \
  bash -c 'set -o pipefail; python3 - --deep "$1" | base64 | sed "s/^/$SLURM_NODEID /"' \
  clusterkit-probe python3 \
  < "$clusterkit_preflight/probe.py" > "$clusterkit_preflight/facts.b64" || clusterkit_probe_rc=$?
sort -s -n -k1,1 "$clusterkit_preflight/facts.b64" |
  awk '$1 != node { if (node != "") close("base64 -d"); node = $1 } { print $2 | "base64 -d" }' \
  > "$clusterkit_preflight/facts.jsonl"
mapfile -t clusterkit_node_list < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
clusterkit_checks_rc=0
python3 "$clusterkit_preflight/checks.pyz" "$clusterkit_preflight/facts.jsonl" "${clusterkit_node_list[@]}" \
  2> "$clusterkit_preflight/verdicts" || clusterkit_checks_rc=$?
cat "$clusterkit_preflight/verdicts" >&2
if [ "$clusterkit_checks_rc" -ne 0 ]; then
  echo "clusterkit: preflight failed (see the per-node lines above); training was not started" >&2
  exit 1
fi
if [ "$clusterkit_probe_rc" -ne 0 ]; then
  echo "clusterkit: the probe failed on at least one node (srun exit $clusterkit_probe_rc); training was not started" >&2
  exit 1
fi

# srun, one task per GPU: each task takes its rank from Slurm.
srun --ntasks-per-node=8 --ntasks="$(( SLURM_JOB_NUM_NODES * 8 ))" --kill-on-bad-exit=1 --cpus-per-task=12 \
  bash -c 'export RANK="$SLURM_PROCID" LOCAL_RANK="$SLURM_LOCALID" WORLD_SIZE="$SLURM_NTASKS"; exec "$@"' \
  clusterkit-task python3 train.py --epochs 3
