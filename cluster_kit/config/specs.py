"""The declarative key specs of profiles and job files."""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from cluster_kit.config.spec import Field, ListOf, MapOf, Rule, Section, quoted_value
from cluster_kit.config.validators import (
    CONSTRAINT_CHARS,
    CONTAINER_RUNTIMES,
    HOST_CHARS,
    IFNAME_CHARS,
    NAME_CHARS,
    PATH_CHARS,
    SIGNAL_TIME_MAX,
    absolute_path,
    arg,
    boolean,
    checkpoint_every,
    cluster_path,
    compile_mode,
    compile_shorthand,
    container_image,
    container_mount,
    dotted_version,
    duration_window,
    env_name,
    env_value,
    exclusive,
    gpus,
    graphs_shorthand,
    hostlist,
    ib_hca,
    inductor_option_name,
    inductor_option_value,
    integer,
    interpreter,
    memlock,
    nccl_name,
    nccl_value,
    one_of,
    pep440_specifier,
    positive_int,
    positive_number,
    safe_string,
    sbatch_text,
    sbatch_value,
    slurm_memory,
    slurm_time,
    text,
    variable_name,
)
from cluster_kit.config.vocab import SBATCH_MANAGED, SBATCH_OPTIONS, sbatch_option

if TYPE_CHECKING:
    from cluster_kit.config.spec import Check, Spec


# ----------------------------------------------------------------------------
# sbatch options


def sbatch_option_name() -> Check:
    """A real sbatch long option that the user may set."""
    def check(key: Any) -> str | None:
        if not isinstance(key, str):
            return f"{quoted_value(key)} is not an sbatch option name"
        if key.startswith("-"):
            return f"write {quoted_value(key)} without the leading dashes: {key.lstrip('-')}"
        option = sbatch_option(key)
        if option.replace("-", "_") in SLURM_NAMED:
            return f"{quoted_value(key)} has its own key; write it as slurm.{option.replace('-', '_')}"
        if option in SBATCH_MANAGED:
            return f"--{option} is set from {SBATCH_MANAGED[option]}; remove it here"
        if option in SBATCH_OPTIONS:
            return None
        close = difflib.get_close_matches(option, sorted(SBATCH_OPTIONS), n=1, cutoff=0.75)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"{quoted_value(key)} is not an sbatch option{hint}"
    return Rule(check, {"enum": allowed_sbatch_keys()})


def allowed_sbatch_keys() -> list[str]:
    """Every key `sbatch_option_name` accepts: options not set elsewhere, _ and - spellings."""
    keys = []
    for option in sorted(SBATCH_OPTIONS):
        underscored = option.replace("-", "_")
        if underscored in SLURM_NAMED or option in SBATCH_MANAGED:
            continue
        keys += [underscored] + ([option] if option != underscored else [])
    return keys


# ----------------------------------------------------------------------------
# the specs


def _str(default: Any = None) -> Field:
    return Field(text(), default)


SSH_FIELDS: dict[str, Spec] = {
    "user": Field(safe_string(NAME_CHARS, "a user name")),
    # No default: unset means ssh_config's Port, then 22, as with OpenSSH.
    "port": Field(integer(1, 65535)),
    "identity_file": _str(),
    "proxy_jump": Field(safe_string(HOST_CHARS, "a ProxyJump")),
    "config_file": _str(),  # the ssh_config to resolve hosts through; unset: ~/.ssh/config
}


# How one host is trusted and waited for: the login host's section has them too
# (a login host's key need not be in ~/.ssh/known_hosts).
HOST_KEY_AND_TIMEOUT_FIELDS: dict[str, Spec] = {
    "known_hosts": _str(),  # unset: ssh_config's UserKnownHostsFile, then OpenSSH's files
    "host_key_policy": Field(one_of("strict", "accept-new"), "strict"),
    "connect_timeout": Field(positive_number(), 10),
    "command_timeout": Field(positive_number(), 60),
}


LOGIN = Section({"host": Field(safe_string(HOST_CHARS, "a host name")), **SSH_FIELDS,
                 **HOST_KEY_AND_TIMEOUT_FIELDS}, present=False)


SSH = Section({
    **SSH_FIELDS,
    **HOST_KEY_AND_TIMEOUT_FIELDS,
    "fanout": Field(positive_int(), 64),
})


SLURM_NAMED: dict[str, Spec] = {
    "partition": Field(sbatch_text(NAME_CHARS)),
    "account": Field(sbatch_text(NAME_CHARS)),
    "qos": Field(sbatch_text(NAME_CHARS)),
    "constraint": Field(sbatch_text(CONSTRAINT_CHARS)),
    "gpus_per_node": Field(gpus()),
    "ntasks_per_node": Field(positive_int()),
    "cpus_per_task": Field(positive_int()),
    "mem": Field(slurm_memory()),
    "time": Field(slurm_time()),
    "exclusive": Field(exclusive()),
    "nodelist": Field(hostlist()),  # nodes the job must get (sbatch --nodelist)
    "exclude": Field(hostlist()),   # nodes it must not get; submit adds failing ones
}


SBATCH_EXTRA = MapOf(sbatch_option_name(), Field(sbatch_value()))


SLURM = Section(
    {**SLURM_NAMED, "sbatch": SBATCH_EXTRA},
    extra=SBATCH_EXTRA,
    extra_hint="or any sbatch long option (e.g. mail_type)",
    suggest_from=tuple(sorted(o.replace("-", "_") for o in SBATCH_OPTIONS)),
    extra_accepts=lambda key: isinstance(key, str)
    and sbatch_option(key.lstrip("-")) in SBATCH_OPTIONS,
)


NETWORK_FIELDS: dict[str, Spec] = {
    "fabric": Field(one_of("infiniband", "roce", "ethernet")),
    "ib_hca": ListOf(Field(ib_hca())),
    "gid_index": Field(integer(lo=0)),
    "ib_timeout": Field(integer(0, 31)),
    "socket_ifname": Field(safe_string(IFNAME_CHARS, "NCCL_SOCKET_IFNAME")),
    "nccl_env": MapOf(nccl_name(), Field(nccl_value())),
}


ENVIRONMENT_FIELDS: dict[str, Spec] = {
    "modules": ListOf(Field(text())),
    "setup": ListOf(Field(text())),
    "python": Field(interpreter(), "python3"),
    "env": MapOf(env_name(), Field(env_value())),
}


ENVIRONMENT = Section(ENVIRONMENT_FIELDS)


# A job's own environment: only what it names overrides the profile's.
JOB_ENVIRONMENT = Section({**ENVIRONMENT_FIELDS, "python": Field(interpreter())}, fill=False)


EXPECT = Section({
    "gpus_per_node": Field(positive_int()),
    "gpu_model": _str(),
    "min_driver": Field(dotted_version()),
    "nccl": Field(pep440_specifier()),
    "ib_rate_gbps": Field(positive_number()),
    "peermem": Field(boolean()),
    "memlock": Field(memlock()),
    "allreduce_busbw_gbps": Field(positive_number()),
    "xid_window": Field(duration_window()),
    "torch_cuda": Field(boolean()),
    # Counter names as the kernel's /sys/class/infiniband/<hca>/ports/<p>/counters/ files;
    # unset ones keep the defaults of cluster_kit.checks.rdma_errors.
    "ib_error_thresholds": Section({name: Field(integer(lo=0)) for name in (
        "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
        "local_link_integrity_errors", "excessive_buffer_overrun_errors",
        "port_rcv_remote_physical_errors")}, fill=False),
    # `nvidia-smi nvlink -e` counters per link; unset ones keep cluster_kit.checks.nvlink's defaults.
    "nvlink_error_thresholds": Section({name: Field(integer(lo=0)) for name in ("crc", "replay", "recovery")},
                                      fill=False),
})


PROFILE = Section({
    "name": Field(safe_string(NAME_CHARS, "a profile name")),
    "extends": _str(),
    "login": LOGIN,
    "ssh": SSH,
    "nodes": Field(hostlist()),
    "slurm": SLURM,
    "network": Section(NETWORK_FIELDS),
    "environment": ENVIRONMENT,
    "expect": EXPECT,
})


CONTAINER = Section({
    "image": Field(container_image()),
    "runtime": Field(one_of(*CONTAINER_RUNTIMES), "pyxis"),
    "mounts": ListOf(Field(container_mount())),
    "workdir": Field(absolute_path()),
    "writable": Field(boolean(), False),
    "mount_home": Field(boolean(), False),
    "env": ListOf(Field(variable_name())),
}, present=False)


CONTAINER_REQUIRED = ("image",)


JOB_NCCL = Section({**NETWORK_FIELDS, "debug": Field(one_of("VERSION", "WARN", "INFO", "TRACE", ignore_case=True))},
                   fill=False)


# A job that keeps training (`resilience:`): any key, or `resilience: {}`, turns on its
# supervisor; absent or null leaves it off.
RESILIENCE = Section({
    "max_restarts": Field(integer(lo=0), 3),
    "hang_timeout": Field(positive_number(), 300),
    "startup_timeout": Field(positive_number()),
    "exclude": Field(one_of("blamed", "never"), "blamed"),
    "exclude_on": Field(one_of("node_faults", "any_failure"), "node_faults"),
    "grace": Field(integer(0, SIGNAL_TIME_MAX), 120),  # the sig_time of sbatch --signal
    "max_time_requeues": Field(integer(lo=0), 5),
    "checkpoint_dir": Field(cluster_path("/scratch/alice/run1/ckpt")),
    "spare_nodes": Field(integer(lo=0), 0),
    "min_nodes": Field(positive_int()),
    "checkpoint_every": Field(checkpoint_every()),
    "keep_checkpoints": Field(positive_int(), 3),
    "mtbf_hours": Field(positive_number()),
}, present=False, nullable=True)


# `cuda_graphs: true` or a mapping; `compile:` is true/false/a mode, or torch.compile's
# arguments (cluster_kit/trainer/compile_options.py has build_step's rules for them).
COMPILE = Section({
    "mode": Field(compile_mode()),
    "fullgraph": Field(boolean()),
    "dynamic": Field(boolean()),
    "options": MapOf(inductor_option_name(), Field(inductor_option_value())),
}, fill=False, shorthand=Field(compile_shorthand(), False))


CUDA_GRAPHS = Section({"compile": COMPILE}, shorthand=Field(graphs_shorthand(), False))


JOB = Section({
    "name": Field(sbatch_text(NAME_CHARS)),
    "profile": _str(),
    "nodes": Field(positive_int(), 1),
    "gpus_per_node": Field(gpus()),
    "time": Field(slurm_time()),
    "launcher": Field(one_of("srun", "torchrun"), "srun"),
    "script": _str(),
    "args": ListOf(Field(arg())),
    "workdir": Field(sbatch_text(PATH_CHARS)),
    "output": Field(sbatch_text(PATH_CHARS)),
    "env": MapOf(env_name(), Field(env_value())),
    "environment": JOB_ENVIRONMENT,
    "nccl": JOB_NCCL,
    "preflight": Field(boolean(), True),
    "cuda_graphs": CUDA_GRAPHS,
    "template": _str("ddp"),
    "master_port": Field(integer(1024, 65535)),
    "slurm": SLURM,
    "container": CONTAINER,
    "resilience": RESILIENCE,
})


JOB_REQUIRED = ("profile", "script")


# ----------------------------------------------------------------------------
# descriptions


# What each key means, for `clusterkit schema` (editors show these on hover).
# Profile keys by dotted path; job keys as "job.<path>". `login.*` falls back to
# `ssh.*`, the job's `nccl.*` to `network.*` and its `slurm.*` to the profile's.
DESCRIPTIONS: dict[str, str] = {
    "": "A clusterkit cluster profile: how to reach the cluster and what its nodes must look like.",
    "name": "Profile name; defaults to the file name.",
    "extends": "A parent profile (name on the search path or path to a .yaml), deep-merged; the child wins.",
    "login": "Where sbatch/squeue run, over SSH; absent = run them locally.",
    "login.host": "The login host, resolved through ssh_config as OpenSSH does.",
    "ssh": "How preflight and audit reach the compute nodes.",
    "ssh.user": "User name; unset: ssh_config's User, then the local user.",
    "ssh.port": "SSH port; unset: ssh_config's Port, then 22.",
    "ssh.identity_file": "Private key file, tried before ssh_config's IdentityFile and ssh-agent.",
    "ssh.proxy_jump": "Jump host(s) as OpenSSH ProxyJump: [user@]host[:port], comma-separated.",
    "ssh.config_file": "The ssh_config host names resolve through; unset: ~/.ssh/config.",
    "ssh.known_hosts": "known_hosts file; unset: ssh_config's UserKnownHostsFile, then OpenSSH's files.",
    "ssh.host_key_policy": "strict: unknown host keys are refused; accept-new: recorded on first use. Never silently trusted.",
    "ssh.connect_timeout": "Seconds to connect and authenticate (a lower ssh_config ConnectTimeout wins).",
    "ssh.command_timeout": "Seconds the probe may run per node.",
    "ssh.fanout": "Concurrent SSH connections.",
    "nodes": "Slurm hostlist of the compute nodes, e.g. gpu[001-064]; absent: `sinfo -p <partition>`.",
    "slurm": "sbatch options of every job; any other sbatch long option may be given too (without --).",
    "slurm.partition": "--partition.",
    "slurm.nodelist": "--nodelist: nodes the job must get (Slurm hostlist).",
    "slurm.exclude": "--exclude: nodes the job must not get; submit adds failing ones.",
    "slurm.account": "--account.",
    "slurm.qos": "--qos.",
    "slurm.constraint": "--constraint (node features joined with & | , ...).",
    "slurm.gpus_per_node": "--gpus-per-node: a count, or type:count such as h100:8; 0: no GPU request (a CPU job).",
    "slurm.ntasks_per_node": "--ntasks-per-node; default: gpus_per_node with srun (1 when it is 0 or unset), 1 with torchrun.",
    "slurm.cpus_per_task": "--cpus-per-task.",
    "slurm.mem": "--mem: megabytes, or a size such as 500M, 64G (0 = all of the node's memory).",
    "slurm.time": "--time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED (quote it).",
    "slurm.exclusive": "--exclusive: true, false, user, mcs or topo.",
    "slurm.sbatch": "Any other sbatch long option, without the leading --; true = a bare flag.",
    "network": "The NCCL network settings the job script exports.",
    "network.fabric": "infiniband | roce | ethernet (ethernet sets NCCL_IB_DISABLE=1 and skips RDMA checks).",
    "network.ib_hca": "HCA ports NCCL uses, e.g. [mlx5_0:1, mlx5_3:1] -> NCCL_IB_HCA==mlx5_0:1,mlx5_3:1 (exact match).",
    "network.gid_index": "NCCL_IB_GID_INDEX; on RoCE the RoCE v2 GID holding the IPv4-mapped address.",
    "network.ib_timeout": "NCCL_IB_TIMEOUT (0-31).",
    "network.socket_ifname": "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: prefixes, ^ to exclude, = for exact names.",
    "network.nccl_env": "More NCCL_* variables; names are checked against NCCL's documented list.",
    "environment": "What the job script sets up before training.",
    "environment.modules": "`module load` lines.",
    "environment.setup": ("Shell lines run before training, verbatim, in the job's working directory (workdir, "
                          "else where sbatch ran): give paths in full, e.g. `. /opt/venvs/train/bin/activate`."),
    "environment.python": ("Interpreter with torch on the nodes: a name looked up on their PATH after the setup "
                           "lines, or a path; a relative path starts at the folder of the file that sets it."),
    "environment.env": "Environment variables exported to the training processes.",
    "expect": "Preflight thresholds: what every node must have.",
    "expect.gpus_per_node": "GPUs nvidia-smi must list (gpu.count).",
    "expect.gpu_model": "Substring of every GPU's name, case-insensitive (gpu.model).",
    "expect.min_driver": "Lowest NVIDIA driver version, quoted (gpu.driver).",
    "expect.nccl": "PEP 440 specifier the loadable libnccl must meet, e.g. \">=2.18\" (nccl.library).",
    "expect.ib_rate_gbps": "Lowest link rate of the listed ports in Gb/s (rdma.link_rate).",
    "expect.peermem": "nvidia_peermem or nv_peer_mem must be loaded (rdma.peermem).",
    "expect.memlock": "Lowest RLIMIT_MEMLOCK: unlimited or a size such as 8M, 64G; a bare number is KiB (sys.memlock).",
    "expect.torch_cuda": ("nccl.torch: false accepts a torch that imports without CUDA or NCCL (a CPU "
                          "cluster, fake GPUs); unset or true: a CUDA build that sees the GPUs."),
    "expect.allreduce_busbw_gbps": "`bench allreduce` fails below this bus bandwidth (GB/s, large messages).",
    "job.container": "Run every srun step of the job inside this image (pyxis/enroot or Apptainer).",
    "job.container.image": "A .sqsh/.sif path on the nodes, or [USER@][REGISTRY#]IMAGE[:TAG] for pyxis.",
    "job.container.runtime": "pyxis (srun --container-image, the default) or apptainer (apptainer exec in each task).",
    "job.container.mounts": "SRC:DST or SRC:DST:ro bind mounts, absolute paths.",
    "job.container.workdir": "The working directory inside the container (absolute).",
    "job.container.writable": "A writable container filesystem (pyxis --container-writable, Apptainer --writable-tmpfs).",
    "job.container.mount_home": "Mount the user's home directory into the container (default false).",
    "job.container.env": "More variables whose host value must win over the image's (every clusterkit export already does).",
    "expect.xid_window": "gpu.xid looks at Xid events this recent: seconds or 30m, 24h, 7d (default 24h, at most 7d).",
    "expect.ib_error_thresholds": "rdma.port_errors: per-port counter limits; a port above one fails (defaults in docs/reference.md).",
    **{f"expect.ib_error_thresholds.{name}": f"A port whose {name} counter is above this fails (rdma.port_errors)."
       for name in ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                    "local_link_integrity_errors", "excessive_buffer_overrun_errors",
                    "port_rcv_remote_physical_errors")},
    "expect.nvlink_error_thresholds": "gpu.nvlink: per-link error counter limits; a link above one fails (defaults in docs/reference.md).",
    **{f"expect.nvlink_error_thresholds.{name}": f"An NVLink whose {label} errors (`nvidia-smi nvlink -e`) are above this fails (gpu.nvlink)."
       for name, label in (("crc", "CRC"), ("replay", "Replay"), ("recovery", "Recovery"))},
    "job": "A clusterkit job file: what to run, on which profile.",
    "job.name": "Job name (--job-name); defaults to the file name.",
    "job.profile": "Cluster profile: a name on the search path, or a path to a .yaml.",
    "job.nodes": "Number of nodes.",
    "job.gpus_per_node": "GPUs per node; overrides the profile's slurm.gpus_per_node. 0: a CPU job (no GPU request, one srun task per node unless slurm.ntasks_per_node says otherwise, no GPU expectations).",
    "job.time": "Time limit; overrides the profile's slurm.time.",
    "job.launcher": "srun (one task per GPU) | torchrun (one task per node).",
    "job.script": "The training script, relative to workdir (else to this file's folder).",
    "job.args": "The script's arguments.",
    "job.workdir": "Working directory of the job (--chdir).",
    "job.output": "Output file (--output), e.g. logs/%x-%j.out.",
    "job.env": "Environment variables, merged over the profile's environment.env (and this job's).",
    "job.environment": ("Overrides of the profile's environment, deep-merged (the job wins): python, setup "
                        "and modules replace the profile's, env is merged key by key."),
    "job.environment.python": ("Interpreter with torch on the nodes; a relative path starts at workdir when "
                               "the job sets one, else at this file's folder."),
    "job.nccl": "Overrides of the profile's network keys, plus debug (NCCL_DEBUG).",
    "job.nccl.debug": "NCCL_DEBUG: VERSION, WARN, INFO or TRACE.",
    "job.preflight": "Check every allocated node inside the job before training starts.",
    "job.cuda_graphs": ("Capture the DDP training step in one CUDA graph (cluster_kit.ddp.build_step; the "
                        "job exports CLUSTERKIT_CUDA_GRAPHS=1): true, or a mapping such as {compile: true}."),
    "job.cuda_graphs.compile": ("Compile the model and loss with Inductor inside the captured step "
                                "(build_step(compile=...), exported as CLUSTERKIT_CUDA_GRAPHS_COMPILE): true "
                                "(torch.compile's defaults), a mode, or torch.compile's arguments."),
    "job.cuda_graphs.compile.mode": ("default or max-autotune-no-cudagraphs; modes that record CUDA graphs "
                                     "themselves (reduce-overhead, max-autotune) cannot nest in the step's graph."),
    "job.cuda_graphs.compile.fullgraph": ("torch.compile's fullgraph: the model compiled as one graph, its "
                                          "repeated blocks too; a graph break is an error (and the step falls "
                                          "back to the model's own kernels)."),
    "job.cuda_graphs.compile.dynamic": "torch.compile's dynamic: false compiles for the captured shapes only.",
    "job.cuda_graphs.compile.options": ("Inductor settings by name (torch.compile's options), e.g. "
                                        "{coordinate_descent_tuning: true}; not together with mode."),
    "job.template": "Built-in template name or path to a .j2 file.",
    "job.master_port": "MASTER_PORT; unset: derived from the job id in a fixed high range.",
    "job.slurm": "Per-job sbatch overrides, same rules as the profile's slurm.",
    "job.resilience": ("Keep training through hangs, crashes, lost nodes and the time limit: any key, or `{}`, "
                       "turns on the job's supervisor; absent or null: off. Adds #SBATCH --signal and --no-kill "
                       "unless the job's own slurm sets them."),
    "job.resilience.max_restarts": "Restarts after a failure (hang, crash, node failure).",
    "job.resilience.hang_timeout": "Seconds in which every rank must finish a step; else it is a hang.",
    "job.resilience.spare_nodes": ("Hot spares: the job asks for nodes + spare_nodes and trains on `nodes` of "
                                   "them; after a failure the next attempt is a new job step in the same "
                                   "allocation, a spare in place of each blamed node."),
    "job.resilience.min_nodes": ("With no spare left, go on in the allocation with this many nodes (the trainer "
                                 "sees the new WORLD_SIZE); default nodes: below it, the next attempt is a new "
                                 "job."),
    "job.resilience.checkpoint_every": ("How often cluster_kit.checkpoint saves: auto (Young/Daly from the save "
                                        "cost, the restart time and the failure rate), a number of steps, or a "
                                        "duration such as 30m; exported as CLUSTERKIT_CHECKPOINT_EVERY."),
    "job.resilience.keep_checkpoints": "How many checkpoints cluster_kit.checkpoint keeps (the newest).",
    "job.resilience.mtbf_hours": ("Mean time between failures of one node, for checkpoint_every: auto before the "
                                  "chain and your earlier chains have seen failures (default 5000)."),
    "job.resilience.startup_timeout": ("Seconds from the start of an attempt to the first finished step of every "
                                       "rank (imports, rendezvous, loading a checkpoint); default max(hang_timeout, 600)."),
    "job.resilience.exclude": ("blamed: restart without the nodes a diagnosis blamed, while enough others remain; "
                               "never: keep them."),
    "job.resilience.exclude_on": ("node_faults: only a node fault (a hang, a failed node, a GPU or network error, a "
                                  "fatal signal) excludes the blamed node; a program error (a Python exception, out "
                                  "of memory) restarts on the same nodes, and the same one in two attempts ends the "
                                  "chain. any_failure: every blamed node is excluded."),
    "job.resilience.grace": ("Seconds before the time limit (and on preemption) the ranks are told to checkpoint: "
                             "#SBATCH --signal=B:USR1@grace, none with 0. More than 60 s below the job's time limit."),
    "job.resilience.max_time_requeues": ("Requeues at the time limit or on preemption; they are not failures "
                                         "and do not use max_restarts."),
    "job.resilience.checkpoint_dir": ("Created and exported to every rank as CLUSTERKIT_CHECKPOINT_DIR; a relative "
                                      "path starts at workdir when the job sets one, else where sbatch ran (as output)."),
}


def describe(kind: str, path: str) -> str | None:
    """The description of a key path of a profile or job ("job"), with the fallbacks above."""
    if kind == "job":
        head, _, rest = path.partition(".")
        candidates = ["job." + path if path else "job"]
        if head == "nccl" and rest:
            candidates.append("network." + rest)
        elif head in ("slurm", "environment") and rest:
            candidates.append(path)
    else:
        candidates = [path]
        if path.startswith("login."):
            candidates.append("ssh." + path[len("login."):])
    return next((DESCRIPTIONS[c] for c in candidates if c in DESCRIPTIONS), None)
