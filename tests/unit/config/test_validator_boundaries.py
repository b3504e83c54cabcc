"""Each scalar rule as config/specs.py builds it: what it takes and refuses at its
edges, the whole message a refusal gives, and the JSON Schema editors get.

The rules are looked up when a test runs (not at import), so a run that builds
config/specs.py again per test checks the rules of that build.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cluster_kit.config import specs
from cluster_kit.config.load import validate_files
from cluster_kit.config.search import SearchPath
from cluster_kit.config.validators import asks_no_gpus, gpu_count, time_limit_seconds

RULES: dict[str, Callable[[], Any]] = {
    "network.ib_timeout": lambda: specs.PROFILE.fields["network"].fields["ib_timeout"].check,
    "network.gid_index": lambda: specs.PROFILE.fields["network"].fields["gid_index"].check,
    "network.ib_hca": lambda: specs.PROFILE.fields["network"].fields["ib_hca"].item.check,
    "network.socket_ifname": lambda: specs.PROFILE.fields["network"].fields["socket_ifname"].check,
    "network.nccl_env key": lambda: specs.PROFILE.fields["network"].fields["nccl_env"].key_check,
    "network.nccl_env value": lambda: specs.PROFILE.fields["network"].fields["nccl_env"].value.check,
    "ssh.fanout": lambda: specs.SSH.fields["fanout"].check,
    "ssh.user": lambda: specs.SSH.fields["user"].check,
    "ssh.host_key_policy": lambda: specs.SSH.fields["host_key_policy"].check,
    "nodes": lambda: specs.PROFILE.fields["nodes"].check,
    "slurm.partition": lambda: specs.SLURM.fields["partition"].check,
    "slurm.constraint": lambda: specs.SLURM.fields["constraint"].check,
    "expect.gpu_model": lambda: specs.EXPECT.fields["gpu_model"].check,
    "slurm.gpus_per_node": lambda: specs.SLURM.fields["gpus_per_node"].check,
    "slurm.mem": lambda: specs.SLURM.fields["mem"].check,
    "slurm.time": lambda: specs.SLURM.fields["time"].check,
    "slurm.exclusive": lambda: specs.SLURM.fields["exclusive"].check,
    "slurm.sbatch value": lambda: specs.SLURM.extra.value.check,
    "expect.min_driver": lambda: specs.EXPECT.fields["min_driver"].check,
    "expect.ib_rate_gbps": lambda: specs.EXPECT.fields["ib_rate_gbps"].check,
    "expect.peermem": lambda: specs.EXPECT.fields["peermem"].check,
    "expect.memlock": lambda: specs.EXPECT.fields["memlock"].check,
    "expect.xid_window": lambda: specs.EXPECT.fields["xid_window"].check,
    "expect.nccl": lambda: specs.EXPECT.fields["nccl"].check,
    "environment.python": lambda: specs.ENVIRONMENT.fields["python"].check,
    "environment.env key": lambda: specs.ENVIRONMENT.fields["env"].key_check,
    "environment.env value": lambda: specs.ENVIRONMENT.fields["env"].value.check,
    "container.image": lambda: specs.CONTAINER.fields["image"].check,
    "container.workdir": lambda: specs.CONTAINER.fields["workdir"].check,
    "container.mounts": lambda: specs.CONTAINER.fields["mounts"].item.check,
    "container.env": lambda: specs.CONTAINER.fields["env"].item.check,
    "job.args": lambda: specs.JOB.fields["args"].item.check,
    "job.nccl.debug": lambda: specs.JOB_NCCL.fields["debug"].check,
    "resilience.checkpoint_dir": lambda: specs.RESILIENCE.fields["checkpoint_dir"].check,
}


def rule(key: str) -> Any:
    return RULES[key]()


GPUS_FIX = "use a number such as 8 (0 for a job without GPUs), or type:count such as h100:8"
MEM_FIX = "use megabytes (e.g. 0 or 16000) or 500M, 64G, 1T"
TIME_FIX = ("use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED "
            "(quoted, e.g. \"04:00:00\")")
MEMLOCK_FIX = "use unlimited or a size such as 1024K, 8M, 64G"
WINDOW_FIX = "use seconds or a duration such as 30m, 24h, 7d"
TOO_LONG = "is longer than 7d, as far back as the probe reads the kernel log"
HCA_FIX = "use a device name with an optional port, e.g. mlx5_0:1"
IMAGE_FIX = "an image is one word: a .sqsh/.sif path or [USER@][REGISTRY#]IMAGE[:TAG]"
BOTH_SIDES = "write SRC:DST with both paths absolute (e.g. /scratch:/scratch:ro)"
MOUNT_FIX = "is not SRC:DST or SRC:DST:ro (e.g. /scratch:/scratch:ro); flags: ro, rw"
NOT_ABSOLUTE = "is not an absolute path; write it from / (e.g. /workspace)"
NO_COMMA = "contains a comma or a space, which srun's container flags cannot carry"
ENV_NAME_FIX = "is not a valid environment variable name; use letters, digits and _, not starting with a digit"
SBATCH_CHARS = "letters, digits and _ . / % @ + , : = * & | ! ( ) [ ] ^ ~ -"

# (rule, value, the whole problem text or None when the value is taken)
CASES: list[tuple[str, Any, str | None]] = [
    # integer(0, 31): both ends are inside
    ("network.ib_timeout", 0, None),
    ("network.ib_timeout", 31, None),
    ("network.ib_timeout", -1, "-1 is out of range; use 0-31"),
    ("network.ib_timeout", 32, "32 is out of range; use 0-31"),
    ("network.ib_timeout", True, "expected an integer, got a boolean (True)"),
    ("network.ib_timeout", "3", "expected an integer, got a string ('3')"),
    ("network.ib_timeout", 3.0, "expected an integer, got a number (3.0)"),
    # integer(lo=0), integer(lo=1): no upper bound
    ("network.gid_index", 0, None),
    ("network.gid_index", 10**9, None),
    ("network.gid_index", -1, "-1 is too small; use 0 or more"),
    ("ssh.fanout", 1, None),
    ("ssh.fanout", 0, "0 is too small; use 1 or more"),
    # gpus: a count from 0, or type:count from 1
    ("slurm.gpus_per_node", 0, None),
    ("slurm.gpus_per_node", 8, None),
    ("slurm.gpus_per_node", "h100:8", None),
    ("slurm.gpus_per_node", "a.b_c-D:10", None),
    ("slurm.gpus_per_node", -1, "-1 is below 0; use 0 for a job without GPUs, or a number such as 8"),
    ("slurm.gpus_per_node", "h100:0", f"'h100:0' is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", "h100:08", f"'h100:08' is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", ":8", f"':8' is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", "h100:", f"'h100:' is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", "h 100:8", f"'h 100:8' is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", "8", f"'8' is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", True, f"a boolean (True) is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", False, f"a boolean (False) is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", 8.0, f"a number (8.0) is not a GPU count; {GPUS_FIX}"),
    ("slurm.gpus_per_node", None, f"empty is not a GPU count; {GPUS_FIX}"),
    # slurm_memory
    ("slurm.mem", 0, None),
    ("slurm.mem", 16000, None),
    ("slurm.mem", "500M", None),
    ("slurm.mem", "64g", None),
    ("slurm.mem", "1T", None),
    ("slurm.mem", "1024", None),
    ("slurm.mem", -1, f"an integer (-1) is not a memory size; {MEM_FIX}"),
    ("slurm.mem", "1P", f"'1P' is not a memory size; {MEM_FIX}"),
    ("slurm.mem", "M", f"'M' is not a memory size; {MEM_FIX}"),
    ("slurm.mem", "500MB", f"'500MB' is not a memory size; {MEM_FIX}"),
    ("slurm.mem", True, f"a boolean (True) is not a memory size; {MEM_FIX}"),
    ("slurm.mem", 1.5, f"a number (1.5) is not a memory size; {MEM_FIX}"),
    # slurm_time: every form, and a field one past its limit
    ("slurm.time", 0, None),
    ("slurm.time", 90, None),
    ("slurm.time", "30", None),
    ("slurm.time", "5:59", None),
    ("slurm.time", "1:00:00", None),
    ("slurm.time", "1-23", None),
    ("slurm.time", "1-2:3", None),
    ("slurm.time", "1-2:3:4", None),
    ("slurm.time", "unlimited", None),
    ("slurm.time", "INFINITE", None),
    ("slurm.time", "Unlimited", None),
    ("slurm.time", -1, f"an integer (-1) is not a Slurm time limit; {TIME_FIX}"),
    ("slurm.time", "5:60", f"'5:60' is not a Slurm time limit; {TIME_FIX}"),
    ("slurm.time", "1:60:00", f"'1:60:00' is not a Slurm time limit; {TIME_FIX}"),
    ("slurm.time", "1-24", f"'1-24' is not a Slurm time limit; {TIME_FIX}"),
    ("slurm.time", "forever", f"'forever' is not a Slurm time limit; {TIME_FIX}"),
    ("slurm.time", True, f"a boolean (True) is not a Slurm time limit; {TIME_FIX}"),
    ("slurm.time", 1.5, f"a number (1.5) is not a Slurm time limit; {TIME_FIX}"),
    # exclusive
    ("slurm.exclusive", True, None),
    ("slurm.exclusive", False, None),
    ("slurm.exclusive", "user", None),
    ("slurm.exclusive", "mcs", None),
    ("slurm.exclusive", "topo", None),
    ("slurm.exclusive", "USER", "'USER' is not valid; use true, false, user, mcs or topo"),
    ("slurm.exclusive", 1, "an integer (1) is not valid; use true, false, user, mcs or topo"),
    ("slurm.exclusive", 0, "an integer (0) is not valid; use true, false, user, mcs or topo"),
    ("slurm.exclusive", None, "empty is not valid; use true, false, user, mcs or topo"),
    # memlock
    ("expect.memlock", 0, None),
    ("expect.memlock", "unlimited", None),
    ("expect.memlock", "UNLIMITED", None),
    ("expect.memlock", "8M", None),
    ("expect.memlock", "1024", None),
    ("expect.memlock", "64g", None),
    ("expect.memlock", -1, f"an integer (-1) is not a memlock limit; {MEMLOCK_FIX}"),
    ("expect.memlock", "8X", f"'8X' is not a memlock limit; {MEMLOCK_FIX}"),
    ("expect.memlock", "unlimitedX", f"'unlimitedX' is not a memlock limit; {MEMLOCK_FIX}"),
    ("expect.memlock", True, f"a boolean (True) is not a memlock limit; {MEMLOCK_FIX}"),
    ("expect.memlock", 1.5, f"a number (1.5) is not a memlock limit; {MEMLOCK_FIX}"),
    # duration_window: 1 s to 7 days, in each unit
    ("expect.xid_window", 1, None),
    ("expect.xid_window", 604800, None),
    ("expect.xid_window", "1", None),
    ("expect.xid_window", "604800", None),
    ("expect.xid_window", "604800s", None),
    ("expect.xid_window", "10080m", None),
    ("expect.xid_window", "168h", None),
    ("expect.xid_window", "7d", None),
    ("expect.xid_window", 0, f"an integer (0) is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", -1, f"an integer (-1) is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", "0", f"'0' is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", "0m", f"'0m' is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", "10w", f"'10w' is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", "", f"'' is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", True, f"a boolean (True) is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", 1.5, f"a number (1.5) is not a time window; {WINDOW_FIX}"),
    ("expect.xid_window", 604801, f"an integer (604801) {TOO_LONG}"),
    ("expect.xid_window", "604801", f"'604801' {TOO_LONG}"),
    ("expect.xid_window", "604801s", f"'604801s' {TOO_LONG}"),
    ("expect.xid_window", "10081m", f"'10081m' {TOO_LONG}"),
    ("expect.xid_window", "169h", f"'169h' {TOO_LONG}"),
    ("expect.xid_window", "8d", f"'8d' {TOO_LONG}"),
    # dotted_version
    ("expect.min_driver", 535, None),
    ("expect.min_driver", "535", None),
    ("expect.min_driver", "535.104.05", None),
    ("expect.min_driver", 535.4, ("535.4 was read as a number, which loses trailing zeros (535.40 becomes "
                                  "535.4); quote the version, e.g. \"535.104.05\"")),
    ("expect.min_driver", "535.", "'535.' is not a dotted version; use e.g. \"535.104.05\""),
    ("expect.min_driver", ".535", "'.535' is not a dotted version; use e.g. \"535.104.05\""),
    ("expect.min_driver", "v535", "'v535' is not a dotted version; use e.g. \"535.104.05\""),
    ("expect.min_driver", True, "a boolean (True) is not a dotted version; use e.g. \"535.104.05\""),
    ("expect.min_driver", None, "empty is not a dotted version; use e.g. \"535.104.05\""),
    # positive_number, boolean, one_of
    ("expect.ib_rate_gbps", 0.1, None),
    ("expect.ib_rate_gbps", 1, None),
    ("expect.ib_rate_gbps", 0, "0 must be greater than 0"),
    ("expect.ib_rate_gbps", -0.5, "-0.5 must be greater than 0"),
    ("expect.ib_rate_gbps", True, "expected a number, got a boolean (True)"),
    ("expect.ib_rate_gbps", "1", "expected a number, got a string ('1')"),
    ("expect.peermem", True, None),
    ("expect.peermem", False, None),
    ("expect.peermem", 1, "expected true or false, got an integer (1)"),
    ("expect.peermem", "yes", "expected true or false, got a string ('yes')"),
    ("ssh.host_key_policy", "accept-new", None),
    ("ssh.host_key_policy", "STRICT", "'STRICT' is not one of strict | accept-new"),
    ("ssh.host_key_policy", 1, "an integer (1) is not one of strict | accept-new"),
    ("job.nccl.debug", "INFO", None),
    ("job.nccl.debug", "info", None),
    ("job.nccl.debug", "Trace", None),
    ("job.nccl.debug", "x", "'x' is not one of VERSION | WARN | INFO | TRACE"),
    ("job.nccl.debug", 1, "an integer (1) is not one of VERSION | WARN | INFO | TRACE"),
    # sbatch_text, safe_string, Charset
    ("slurm.partition", "gpu", None),
    ("slurm.partition", 7, None),
    ("slurm.partition", 7.5, None),
    ("slurm.partition", "", "expected a non-empty string"),
    ("slurm.partition", " ", "expected a non-empty string"),
    ("slurm.partition", True, "expected a string, got a boolean (True)"),
    ("slurm.partition", "a b", ("'a b' contains ' ', which an #SBATCH line must not carry; "
                                "use letters, digits and _ . , + -")),
    ("ssh.user", 7, "expected a string, got an integer (7)"),
    ("slurm.constraint", "a100&ib", None),
    ("slurm.constraint", 2, None),
    # a float is written as Python writes it, and 1e+20 carries a +
    ("slurm.constraint", 1e20, ("'1e+20' contains '+', which an #SBATCH line must not carry; use feature names "
                                "joined with & | , * [ ] ( ) !")),
    ("expect.gpu_model", "H100", None),
    ("expect.gpu_model", "", "expected a non-empty string"),
    ("expect.gpu_model", " ", "expected a non-empty string"),
    ("expect.gpu_model", 7, "expected a string, got an integer (7)"),
    ("ssh.user", "a$b;c", ("'a$b;c' contains '$', ';', which a user name must not carry; "
                           "use letters, digits and _ . , + -")),
    ("ssh.user", "a;b;c", "'a;b;c' contains ';', which a user name must not carry; use letters, digits and _ . , + -"),
    ("ssh.user", "!\"#$%&'()*", ("'!\"#$%&\\'()*' contains '!', '\"', '#', '$', '%', '&', \"'\", '(', ')', '*', "
                                  "which a user name must not carry; use letters, digits and _ . , + -")),
    ("ssh.user", "!\"#$%&'()*<", ("'!\"#$%&\\'()*<' contains '!', '\"', '#', '$', '%', '&', \"'\", '(', ')', '*', "
                                   "..., which a user name must not carry; use letters, digits and _ . , + -")),
    ("network.socket_ifname", "=eth0,eth1", None),
    ("network.socket_ifname", "eth 0", ("'eth 0' contains ' ', which NCCL_SOCKET_IFNAME must not carry; "
                                        "use interface names or prefixes, e.g. eth0 or =eth0,eth1")),
    # sbatch_value: a bare flag, a number, or safe text
    ("slurm.sbatch value", True, None),
    ("slurm.sbatch value", False, None),
    ("slurm.sbatch value", 1, None),
    ("slurm.sbatch value", 1.5, None),
    ("slurm.sbatch value", "BEGIN,END", None),
    ("slurm.sbatch value", "", "expected a non-empty string"),
    ("slurm.sbatch value", None, "expected a string, got empty"),
    ("slurm.sbatch value", "a b", f"'a b' contains ' ', which an #SBATCH line must not carry; use {SBATCH_CHARS}"),
    ("slurm.sbatch value", "x$y", f"'x$y' contains '$', which an #SBATCH line must not carry; use {SBATCH_CHARS}"),
    # cluster_path, interpreter, text
    ("resilience.checkpoint_dir", "/x", None),
    ("resilience.checkpoint_dir", "x~", None),
    ("resilience.checkpoint_dir", "~x", ("'~x' starts with ~, which the job does not expand (the value is quoted); "
                                         "write the full path, e.g. /scratch/alice/run1/ckpt")),
    ("resilience.checkpoint_dir", " ", "expected a non-empty string"),
    ("resilience.checkpoint_dir", 7, "expected a string, got an integer (7)"),
    ("environment.python", "python3", None),
    ("environment.python", "~/v/bin/python", ("'~/v/bin/python' starts with ~, which the job does not expand (the "
                                              "value is quoted); write the full path, e.g. "
                                              "/home/alice/venv/bin/python")),
    ("environment.python", "", "expected a non-empty string"),
    # ib_hca
    ("network.ib_hca", "mlx5_0", None),
    ("network.ib_hca", "mlx5_0:1", None),
    ("network.ib_hca", "a", None),
    ("network.ib_hca", "a.b-c_D:10", None),
    ("network.ib_hca", "mlx5_0:0", f"'mlx5_0:0' is not an HCA; {HCA_FIX}"),
    ("network.ib_hca", "mlx5_0:01", f"'mlx5_0:01' is not an HCA; {HCA_FIX}"),
    ("network.ib_hca", "mlx5_0:", f"'mlx5_0:' is not an HCA; {HCA_FIX}"),
    ("network.ib_hca", "0mlx", f"'0mlx' is not an HCA; {HCA_FIX}"),
    ("network.ib_hca", "mlx5 0", f"'mlx5 0' is not an HCA; {HCA_FIX}"),
    ("network.ib_hca", "", f"'' is not an HCA; {HCA_FIX}"),
    ("network.ib_hca", 7, f"an integer (7) is not an HCA; {HCA_FIX}"),
    # hostlist: characters first, then the expansion
    ("nodes", "gpu[001-064],login01", None),
    ("nodes", "gpu[3-1]", ("'gpu[3-1]' is not a Slurm hostlist (invalid hostlist 'gpu[3-1]': the range '3-1' is "
                           "reversed); use e.g. gpu[001-064]")),
    ("nodes", "gpu[1-2", ("'gpu[1-2' is not a Slurm hostlist (invalid hostlist 'gpu[1-2': '[' without a matching "
                          "']'); use e.g. gpu[001-064]")),
    ("nodes", "GPU[1-2],Login01", None),
    # a hostlist's fix names what a hostlist holds (not user@host or host:port)
    ("nodes", "gpu 1", ("'gpu 1' contains ' ', which a hostlist must not carry; use host names and ranges, "
                        "e.g. gpu[001-064],login01")),
    ("nodes", "alice@gpu1:22", ("'alice@gpu1:22' contains ':', '@', which a hostlist must not carry; use host "
                                "names and ranges, e.g. gpu[001-064],login01")),
    ("nodes", "", "expected a non-empty string"),
    ("nodes", 7, "expected a string, got an integer (7)"),
    # environment names and values
    ("environment.env key", "A_1", None),
    ("environment.env key", "_a", None),
    ("environment.env key", "1A", f"'1A' {ENV_NAME_FIX}"),
    ("environment.env key", "A-B", f"'A-B' {ENV_NAME_FIX}"),
    ("environment.env key", 7, f"7 {ENV_NAME_FIX}"),
    ("container.env", "A_1", None),
    ("container.env", "1A", f"'1A' {ENV_NAME_FIX}"),
    ("container.env", 7, f"7 {ENV_NAME_FIX}"),
    ("environment.env value", "x", None),
    ("environment.env value", "", None),
    ("environment.env value", 1, None),
    ("environment.env value", 1.5, None),
    ("environment.env value", True, "true is a YAML boolean; quote it (\"true\") or write 1 / 0"),
    ("environment.env value", False, "false is a YAML boolean; quote it (\"false\") or write 1 / 0"),
    ("environment.env value", None, "expected a string or a number, got empty"),
    ("environment.env value", [1], "expected a string or a number, got a list"),
    ("environment.env value", {}, "expected a string or a number, got a mapping"),
    ("network.nccl_env value", True, "true is a YAML boolean; quote it (\"true\") or write 1 / 0"),
    ("network.nccl_env value", 4, None),
    ("job.args", "--lr", None),
    ("job.args", 3, None),
    ("job.args", False, "false is a YAML boolean; quote it (\"false\") or write 1 / 0"),
    # nccl_name
    ("network.nccl_env key", "NCCL_ALGO", None),
    ("network.nccl_env key", "NCCL_DEBUG_SUBSYS", None),
    ("network.nccl_env key", "NCCL_IB_HCA", "NCCL_IB_HCA is set from network.ib_hca; set it there instead"),
    ("network.nccl_env key", "NCCL_SOCKET_IFNAME",
     "NCCL_SOCKET_IFNAME is set from network.socket_ifname; set it there instead"),
    ("network.nccl_env key", "NCCL_DEBUG", "NCCL_DEBUG is set from the job's nccl.debug; set it there instead"),
    ("network.nccl_env key", "OMP_NUM_THREADS", ("'OMP_NUM_THREADS' is not an NCCL variable (those start with "
                                                 "NCCL_); put other variables in environment.env")),
    ("network.nccl_env key", "nccl_algo", ("'nccl_algo' is not an NCCL variable (those start with NCCL_); put "
                                           "other variables in environment.env")),
    ("network.nccl_env key", "NCCL_ALGOO", "'NCCL_ALGOO' is not a known NCCL variable; did you mean 'NCCL_ALGO'?"),
    ("network.nccl_env key", "NCCL_ZZZZZZZZZ", ("'NCCL_ZZZZZZZZZ' is not a known NCCL variable; see the Environment "
                                                "Variables page of the NCCL documentation")),
    ("network.nccl_env key", "NCCL_ALGORITHM", ("'NCCL_ALGORITHM' is not a known NCCL variable; see the Environment "
                                                "Variables page of the NCCL documentation")),
    ("network.nccl_env key", 7, "7 is not an NCCL variable name"),
    # pep440_specifier
    ("expect.nccl", ">=2.18", None),
    ("expect.nccl", ">=2.18,<3", None),
    ("expect.nccl", "2.18", "'2.18' is not a version specifier; use e.g. \">=2.18\" or \">=2.18,<3\""),
    ("expect.nccl", 2.18, "expected a quoted version specifier such as \">=2.18\", got a number (2.18)"),
    # containers
    ("container.image", "nvcr.io#nvidia/pytorch:24.01-py3", None),
    ("container.image", "/a/b.sqsh", None),
    ("container.image", "a b", f"'a b' contains ' '; {IMAGE_FIX}"),
    ("container.image", "a,b", f"'a,b' contains ','; {IMAGE_FIX}"),
    ("container.image", "a\tb,c d", f"'a\\tb,c d' contains '\\t', ' ', ','; {IMAGE_FIX}"),
    ("container.image", " ", "expected a non-empty string"),
    ("container.image", 7, "expected a string, got an integer (7)"),
    ("container.workdir", "/workspace", None),
    ("container.workdir", "/", None),
    ("container.workdir", "workspace", f"'workspace' {NOT_ABSOLUTE}"),
    ("container.workdir", "/a,b", f"'/a,b' {NO_COMMA}"),
    ("container.workdir", "/a b", f"'/a b' {NO_COMMA}"),
    ("container.workdir", "/a\tb", f"'/a\\tb' {NO_COMMA}"),
    ("container.workdir", "", "expected a non-empty string"),
    ("container.workdir", 7, "expected a string, got an integer (7)"),
    ("container.mounts", "/a:/b", None),
    ("container.mounts", "/a:/b:ro", None),
    ("container.mounts", "/a:/b:rw", None),
    ("container.mounts", "/a:/b:RO", f"'/a:/b:RO' {MOUNT_FIX}"),
    ("container.mounts", "/a", f"'/a' {MOUNT_FIX}"),
    ("container.mounts", "/a:/b:ro:x", f"'/a:/b:ro:x' {MOUNT_FIX}"),
    ("container.mounts", "a:/b", f"'a' {NOT_ABSOLUTE}"),
    ("container.mounts", "/a:b", f"'b' {NOT_ABSOLUTE}"),
    ("container.mounts", "/a:b:ro", f"'b' {NOT_ABSOLUTE}"),
    ("container.mounts", "/a,:/b", f"'/a,' {NO_COMMA}"),
    ("container.mounts", "/a:/b,c", f"'/b,c' {NO_COMMA}"),
    ("container.mounts", ":/data", f"':/data' has no source path; {BOTH_SIDES}"),
    ("container.mounts", "/scratch: :ro", f"'/scratch: :ro' has no destination path; {BOTH_SIDES}"),
    ("container.mounts", "", "expected a non-empty string"),
    ("container.mounts", 7, "expected a string, got an integer (7)"),
]


@pytest.mark.parametrize(("key", "value", "problem"), CASES)
def test_each_rule_at_its_edges(key: str, value: Any, problem: str | None) -> None:
    assert rule(key)(value) == problem


@pytest.mark.parametrize(("key", "value", "problem"), CASES)
def test_the_schema_editors_get_agrees_with_the_rule(key: str, value: Any, problem: str | None) -> None:
    """`clusterkit schema` is built from each rule's JSON fragment: an editor must take
    and refuse what clusterkit takes and refuses."""
    schema = jsonschema.Draft202012Validator(rule(key).json)
    assert schema.is_valid(value) == (problem is None or (key, repr(value)) in SCHEMA_LOOSER)


# Where a JSON Schema cannot say it all, it is looser, never stricter: JSON has no
# float 3.0 apart from 3; a pattern cannot weigh a window's length, a hostlist's
# ranges or a zero count; a mapping key is a string before its pattern is read; a
# number's text (1e+20) is not a string to match.
SCHEMA_LOOSER = {
    ("network.ib_timeout", "3.0"), ("slurm.gpus_per_node", "8.0"),
    ("expect.xid_window", "'0'"), ("expect.xid_window", "'0m'"), ("expect.xid_window", "'604801'"),
    ("expect.xid_window", "'604801s'"), ("expect.xid_window", "'10081m'"), ("expect.xid_window", "'169h'"),
    ("expect.xid_window", "'8d'"), ("nodes", "'gpu[3-1]'"), ("nodes", "'gpu[1-2'"), ("environment.env key", "7"),
    ("slurm.constraint", "1e+20"),
}


def test_the_schema_refuses_a_newline_the_walker_refuses() -> None:
    """The walker refuses a newline in any string; a value's fragment says so itself."""
    assert rule("environment.env value")("a\nb") is None
    for key in ("environment.env value", "job.args", "network.nccl_env value"):
        assert not jsonschema.Draft202012Validator(rule(key).json).is_valid("a\nb")


@pytest.mark.parametrize(("value", "count"), [(None, 0), (0, 0), (8, 8), ("h100:8", 8), ("a.b_c-d:16", 16)])
def test_gpu_count_of_a_request(value: Any, count: int) -> None:
    assert gpu_count(value) == count


@pytest.mark.parametrize(("value", "none"), [(0, True), (1, False), (-1, False), (8, False), (None, False), (False, False),
                                            ("h100:8", False)])
def test_only_a_zero_count_asks_for_no_gpus(value: Any, none: bool) -> None:
    assert asks_no_gpus(value) is none


@pytest.mark.parametrize(("value", "seconds"), [(1, 60), (0, None), ("1", 60), ("0", None), ("1-0", 86400)])
def test_the_shortest_time_limits_in_seconds(value: Any, seconds: int | None) -> None:
    assert time_limit_seconds(value) == seconds


PROFILE = """\
name: lab
nodes: gpu[3-1]
slurm:
  partition: gpu
  gpus_per_node: h100:0
  mem: 64GB
  time: "1-24"
  exclusive: USER
network:
  ib_hca: [mlx5_0:0]
  nccl_env:
    NCCL_IB_HCA: mlx5_0
expect:
  xid_window: 8d
  memlock: 8X
  min_driver: 535.40
"""


def search_in(folder: Path) -> SearchPath:
    return SearchPath.from_environment([], environ={}, cwd=folder, home=folder)


def test_a_profile_refused_value_by_value_at_each_line(tmp_path: Path) -> None:
    """What `clusterkit validate` prints for a profile: FILE:LINE, the key, the value
    and what to write instead."""
    profile = tmp_path / "lab.yaml"
    profile.write_text(PROFILE)
    assert validate_files([profile], search_in(tmp_path)) == [
        (f"{profile}:2: nodes: 'gpu[3-1]' is not a Slurm hostlist (invalid hostlist 'gpu[3-1]': the range '3-1' "
        "is reversed); use e.g. gpu[001-064]"),
        f"{profile}:5: slurm.gpus_per_node: 'h100:0' is not a GPU count; {GPUS_FIX}",
        f"{profile}:6: slurm.mem: '64GB' is not a memory size; {MEM_FIX}",
        f"{profile}:7: slurm.time: '1-24' is not a Slurm time limit; {TIME_FIX}",
        f"{profile}:8: slurm.exclusive: 'USER' is not valid; use true, false, user, mcs or topo",
        f"{profile}:10: network.ib_hca[0]: 'mlx5_0:0' is not an HCA; {HCA_FIX}",
        f"{profile}:12: network.nccl_env.NCCL_IB_HCA: NCCL_IB_HCA is set from network.ib_hca; set it there instead",
        f"{profile}:14: expect.xid_window: '8d' {TOO_LONG}",
        f"{profile}:15: expect.memlock: '8X' is not a memlock limit; {MEMLOCK_FIX}",
        (f"{profile}:16: expect.min_driver: 535.4 was read as a number, which loses trailing zeros (535.40 becomes "
        "535.4); quote the version, e.g. \"535.104.05\""),
    ]


def test_a_job_container_refused_at_each_line(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("slurm: {partition: gpu, time: '04:00:00'}\n")
    job = tmp_path / "job.yaml"
    job.write_text("profile: ./p.yaml\nscript: /bin/true\ncontainer:\n  image: nvcr.io#nvidia/pytorch 24.01\n"
                   "  mounts:\n    - /data:/data:ro\n    - /scratch:scratch\n  workdir: workspace\n"
                   "  env: [HOME, 2FA]\n")
    assert validate_files([job], search_in(tmp_path)) == [
        f"{job}:4: container.image: 'nvcr.io#nvidia/pytorch 24.01' contains ' '; {IMAGE_FIX}",
        f"{job}:7: container.mounts[1]: 'scratch' {NOT_ABSOLUTE}",
        f"{job}:8: container.workdir: 'workspace' {NOT_ABSOLUTE}",
        f"{job}:9: container.env[1]: '2FA' {ENV_NAME_FIX}",
    ]
