"""Words clusterkit knows: NCCL's variables and sbatch's long options."""
from __future__ import annotations

# ----------------------------------------------------------------------------
# NCCL names


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# The NCCL_* variables of NCCL's "Environment Variables" documentation
# (2.4 through 2.2x), including renamed and deprecated ones that still appear there.
NCCL_VARIABLES = _words("""
NCCL_ALGO NCCL_ALLOC_P2P_NET_LL_BUFFERS NCCL_BUFFSIZE NCCL_CHECK_POINTERS
NCCL_CHECKS_DISABLE NCCL_COLLNET_ENABLE NCCL_COLLNET_NODE_THRESHOLD NCCL_COMM_BLOCKING
NCCL_COMM_ID NCCL_COMM_SPLIT_SHARE_RESOURCES NCCL_CONF_FILE NCCL_CREATE_THREAD_CONTEXT
NCCL_CROSS_NIC NCCL_CTA_POLICY NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_DEBUG
NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_DEBUG_TIMESTAMP_FORMAT NCCL_DEBUG_TIMESTAMP_LEVELS
NCCL_DMABUF_ENABLE NCCL_GDRCOPY_ENABLE NCCL_GDRCOPY_FLUSH_ENABLE NCCL_GRAPH_MIXING_SUPPORT
NCCL_GRAPH_REGISTER NCCL_HOSTID NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_ADDR_FAMILY
NCCL_IB_ADDR_RANGE NCCL_IB_AR_THRESHOLD NCCL_IB_CUDA_SUPPORT NCCL_IB_DATA_DIRECT
NCCL_IB_DISABLE NCCL_IB_ECE_ENABLE NCCL_IB_FIFO_TC NCCL_IB_GDR_LEVEL NCCL_IB_GID_INDEX
NCCL_IB_HCA NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_PKEY
NCCL_IB_QPS_PER_CONNECTION NCCL_IB_RETRY_CNT NCCL_IB_RETURN_ASYNC_EVENTS
NCCL_IB_ROCE_VERSION_NUM NCCL_IB_ROUTABLE_FLID_GID_INDEX NCCL_IB_SL NCCL_IB_SPLIT_DATA_ON_QPS
NCCL_IB_TC NCCL_IB_TIMEOUT NCCL_IB_USE_INLINE NCCL_IGNORE_CPU_AFFINITY
NCCL_IGNORE_DISABLED_P2P NCCL_LAUNCH_MODE NCCL_LAUNCH_ORDER_IMPLICIT
NCCL_LEGACY_CUDA_REGISTER NCCL_LL_THRESHOLD NCCL_LOCAL_REGISTER NCCL_MAX_CTAS
NCCL_MAX_NCHANNELS NCCL_MAX_NRINGS NCCL_MEM_SYNC_DOMAIN NCCL_MIN_CTAS NCCL_MIN_NCHANNELS
NCCL_MIN_NRINGS NCCL_MNNVL_CLIQUE_ID NCCL_MNNVL_ENABLE NCCL_MNNVL_UUID
NCCL_NCHANNELS_PER_NET_PEER NCCL_NET NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH
NCCL_NET_GDR_C2C NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_PLUGIN
NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NSOCKS_PERTHREAD NCCL_NTHREADS
NCCL_NVB_DISABLE NCCL_NVLS_ENABLE NCCL_NVLS_NCHANNELS NCCL_NVLSTREE_MAX_CHUNKSIZE
NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_P2P_DIRECT_DISABLE NCCL_P2P_DISABLE
NCCL_P2P_LEVEL NCCL_P2P_LL_THRESHOLD NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE
NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_PXN_LEVEL NCCL_P2P_USE_CUDA_MEMCPY NCCL_PROFILER_PLUGIN
NCCL_PROGRESS_APPENDOP_FREQ NCCL_PROTO NCCL_PXN_DISABLE NCCL_RAS_ADDR NCCL_RAS_ENABLE
NCCL_RAS_TIMEOUT_FACTOR NCCL_RINGS NCCL_RUNTIME_CONNECT NCCL_SET_STACK_SIZE
NCCL_SET_THREAD_NAME NCCL_SHM_DISABLE NCCL_SHM_LOCALITY NCCL_SHM_MEMCPY_MODE
NCCL_SHM_USE_CUDA_MEMCPY NCCL_SINGLE_RING_THRESHOLD NCCL_SOCKET_FAMILY NCCL_SOCKET_IFNAME
NCCL_SOCKET_NTHREADS NCCL_SOCKET_POLL_TIMEOUT_MSEC NCCL_SOCKET_RETRY_CNT
NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_TOPO_DUMP_FILE NCCL_TOPO_FILE NCCL_TREE_THRESHOLD
NCCL_TUNER_PLUGIN NCCL_UID_STAGGER_RATE NCCL_UID_STAGGER_THRESHOLD NCCL_WORK_FIFO_DEPTH
""")


# Variables the profile sets through a dedicated key; a second spelling would conflict.
NCCL_OWNED = {
    "NCCL_IB_HCA": "network.ib_hca",
    "NCCL_IB_GID_INDEX": "network.gid_index",
    "NCCL_IB_TIMEOUT": "network.ib_timeout",
    "NCCL_SOCKET_IFNAME": "network.socket_ifname",
    "NCCL_DEBUG": "the job's nccl.debug",
}


# ----------------------------------------------------------------------------
# sbatch options


# Long options of sbatch(1), Slurm 20.11 to 24.x.
SBATCH_OPTIONS = _words("""
account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment
constraint container container-id contiguous core-spec cores-per-socket cpu-freq
cpus-per-gpu cpus-per-task deadline delay-boot dependency distribution error exclude
exclusive export export-file extra extra-node-info get-user-env gid gpu-bind gpu-freq gpus
gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input
job-name kill-on-invalid-dep license licenses mail-type mail-user mcs-label mem mem-bind
mem-per-cpu mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes
ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket oom-kill-step
open-mode output overcommit oversubscribe parsable partition power prefer priority profile
propagate qos quiet reboot requeue reservation resv-ports signal sockets-per-node
spread-job switches test-only thread-spec threads-per-core time time-min tmp tres-bind
tres-per-task uid usage use-min-nodes verbose version wait wait-all-nodes wckey wrap
""")


# Options clusterkit writes itself, or that only make sense on sbatch's command line.
SBATCH_MANAGED = {
    "job-name": "the job's `name`",
    "nodes": "the job's `nodes`",
    "ntasks": "`ntasks_per_node` and the launcher",
    "output": "the job's `output`",
    "chdir": "the job's `workdir`",
    "wrap": "the rendered script",
    "parsable": "clusterkit itself",
    "test-only": "`clusterkit submit --test-only`",
    "wait": "`clusterkit submit --wait`",
    "help": "nothing (it is not a job option)",
    "usage": "nothing (it is not a job option)",
    "version": "nothing (it is not a job option)",
}


def sbatch_option(key: str) -> str:
    """The sbatch spelling of a YAML key: mail_type -> mail-type."""
    return key.replace("_", "-")


# Options that ask Slurm for GPUs besides --gpus-per-node: a job with `gpus_per_node: 0`
# drops the profile's (a `gres` keeps its other resources) and may not set them itself.
GPU_SBATCH_OPTIONS = frozenset(("gpus", "gpus-per-socket", "gpus-per-task", "gpu-bind", "gpu-freq",
                                "cpus-per-gpu", "mem-per-gpu", "ntasks-per-gpu"))


def without_gpu_gres(gres: str) -> str:
    """`gpu:4,nvme:1` -> `nvme:1`: a --gres value without its GPU resources ("" if none left)."""
    return ",".join(part for part in gres.split(",") if part.strip().split(":", 1)[0] != "gpu")


# The slurm settings that map one to one onto a valued #SBATCH option (`cpus_per_task`
# -> `--cpus-per-task`), in the order the script writes them; `exclusive` is a flag.
SBATCH_VALUE_KEYS = ("cpus_per_task", "mem", "time", "partition", "account", "qos", "constraint",
                     "nodelist", "exclude")
