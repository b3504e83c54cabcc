"""Profile and job loading: every problem at once as FILE:LINE, extends, search path,
effective job settings. Bad files live in tests/data/config/ (their line numbers are
part of the assertions); search-path cases are built in tmp_path."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cluster_kit.config.effective import effective
from cluster_kit.config.load import load_job, load_profile, validate_files
from cluster_kit.config.search import SearchPath, builtin_dir, template_lookup
from cluster_kit.errors import InputError, ValidationError

DATA = Path(__file__).resolve().parents[2] / "data" / "config"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def search(tmp_path: Path) -> SearchPath:
    """tests/data/config first, then nothing from the user's real environment."""
    return SearchPath.from_environment([DATA], environ={}, cwd=tmp_path, home=tmp_path)


def at(name: str, line: int, message: str) -> str:
    return f"{DATA / name}:{line}: {message}"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


SLURM_KEYS = ("partition, account, qos, constraint, gpus_per_node, ntasks_per_node, "
              "cpus_per_task, mem, time, exclusive, nodelist, exclude, sbatch, or any sbatch long option "
              "(e.g. mail_type)")
TIME_FIX = ("use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED "
            "(quoted, e.g. \"04:00:00\")")


# --------------------------------------------------------------------------- bad files

BAD_PROFILE = [
    at("bad-profile.yaml", 3, "nodes: 'gpu[01-' is not a Slurm hostlist (invalid hostlist "
       "'gpu[01-': '[' without a matching ']'); use e.g. gpu[001-064]"),
    at("bad-profile.yaml", 5, "ssh.port: 70000 is out of range; use 1-65535"),
    at("bad-profile.yaml", 6, "ssh.host_key_policy: 'trust-all' is not one of strict | accept-new"),
    at("bad-profile.yaml", 7, "ssh.fanout: 0 is too small; use 1 or more"),
    at("bad-profile.yaml", 9, "slurm.partition: 'gpu$(reboot)' contains '$', '(', ')', which an "
       "#SBATCH line must not carry; use letters, digits and _ . , + -"),
    at("bad-profile.yaml", 10, "slurm.account: contains a newline; values must be a single line"),
    at("bad-profile.yaml", 11, "unknown key 'gpu_per_node' in slurm; did you mean "
       f"'gpus_per_node'? valid keys: {SLURM_KEYS}"),
    at("bad-profile.yaml", 12, f"slurm.time: '25:61:00' is not a Slurm time limit; {TIME_FIX}"),
    at("bad-profile.yaml", 13, "unknown key 'mail_typo' in slurm; did you mean 'mail_type'? "
       f"valid keys: {SLURM_KEYS}"),
    at("bad-profile.yaml", 14, "slurm.sbatch.resrvation: 'resrvation' is not an sbatch option; "
       "did you mean 'reservation'?"),
    at("bad-profile.yaml", 16, "network.fabric: 'ib' is not one of infiniband | roce | ethernet"),
    at("bad-profile.yaml", 17, "network.ib_hca[1]: 'mlx5 1' is not an HCA; use a device name "
       "with an optional port, e.g. mlx5_0:1"),
    at("bad-profile.yaml", 18, "network.gid_index: -1 is too small; use 0 or more"),
    at("bad-profile.yaml", 19, "network.ib_timeout: 32 is out of range; use 0-31"),
    at("bad-profile.yaml", 20, "network.nccl_env.NCCL_IB_TIMOUT: 'NCCL_IB_TIMOUT' is not a "
       "known NCCL variable; did you mean 'NCCL_IB_TIMEOUT'?"),
    at("bad-profile.yaml", 24, "environment.env.BAD: contains a newline; values must be a "
       "single line"),
    at("bad-profile.yaml", 26, "expect.min_driver: 535.4 was read as a number, which loses "
       "trailing zeros (535.40 becomes 535.4); quote the version, e.g. \"535.104.05\""),
    at("bad-profile.yaml", 27, "expect.nccl: 'at least 2.18' is not a version specifier; "
       "use e.g. \">=2.18\" or \">=2.18,<3\""),
    at("bad-profile.yaml", 28, "expect.memlock: 'lots' is not a memlock limit; use unlimited "
       "or a size such as 1024K, 8M, 64G"),
    at("bad-profile.yaml", 29, "unknown key 'extra_key'; valid keys: name, extends, login, ssh, "
       "nodes, slurm, network, environment, expect"),
]


def test_bad_profile_reports_every_problem_at_once_in_line_order(search: SearchPath) -> None:
    # `$(whoami)` in environment.env (line 23) is not a problem: the renderer
    # quotes shell-body values; only #SBATCH values must avoid it.
    assert validate_files([DATA / "bad-profile.yaml"], search) == BAD_PROFILE
    with pytest.raises(ValidationError) as caught:
        load_profile("bad-profile", search)
    assert caught.value.problems == BAD_PROFILE
    assert caught.value.exit_code == 2


BAD_JOB = [
    at("bad-job.yaml", 4, "nodes: 0 is too small; use 1 or more"),
    at("bad-job.yaml", 5, "unknown key 'gpu_per_node'; did you mean 'gpus_per_node'? valid "
       "keys: name, profile, nodes, gpus_per_node, time, launcher, script, args, workdir, "
       "output, env, environment, nccl, preflight, cuda_graphs, template, master_port, slurm, container, "
       "resilience"),
    at("bad-job.yaml", 6, "launcher: 'mpirun' is not one of srun | torchrun"),
    at("bad-job.yaml", 7, f"time: '90:00:00:00' is not a Slurm time limit; {TIME_FIX}"),
    at("bad-job.yaml", 8, "output: 'logs/$(id).out' contains '$', '(', ')', which an #SBATCH "
       "line must not carry; use a path of letters, digits and _ . / % @ + , = : -"),
    at("bad-job.yaml", 9, "env.9LIVES: '9LIVES' is not a valid environment variable name; "
       "use letters, digits and _, not starting with a digit"),
    at("bad-job.yaml", 10, "nccl.debug: 'LOUD' is not one of VERSION | WARN | INFO | TRACE"),
    at("bad-job.yaml", 10, "nccl.ib_timeout: 40 is out of range; use 0-31"),
    at("bad-job.yaml", 11, "slurm.job-name: --job-name is set from the job's `name`; remove it here"),
    at("bad-job.yaml", 12, "args[2]: true is a YAML boolean; quote it (\"true\") or write 1 / 0"),
]


def test_bad_job_reports_every_problem_at_once(search: SearchPath) -> None:
    assert validate_files([DATA / "bad-job.yaml"], search) == BAD_JOB
    with pytest.raises(ValidationError) as caught:
        load_job(DATA / "bad-job.yaml", search)
    assert caught.value.problems == BAD_JOB


DUPLICATE = "duplicate key 'partition' (first defined on line 3); remove or rename one of the two keys"


@pytest.mark.parametrize(("name", "line", "message"), [
    ("bad-yaml.yaml", 4, ("expected ',' or ']', but got ':' (while parsing a flow sequence "
                         "started on line 3); a [ or { is not closed: close it on its line, e.g. "
                         "[a, b], or write one `- item` (or `key: value`) per line")),
    ("duplicate.yaml", 5, DUPLICATE),
    ("empty.yaml", 1, "the file is empty; write a mapping of keys, e.g. `name: mycluster`"),
    ("list-top.yaml", 1, "the top level is a list, not a mapping; write `key: value` lines at the top level"),
])
def test_unreadable_yaml_is_one_problem_with_its_line(search: SearchPath, name: str,
                                                       line: int, message: str) -> None:
    assert validate_files([DATA / name], search) == [at(name, line, message)]
    with pytest.raises(InputError) as caught:
        load_profile(str(DATA / name), search)
    assert caught.value.problems == [at(name, line, message)]  # type: ignore[attr-defined]
    assert caught.value.exit_code == 2


def test_missing_profile_names_the_job_line_and_where_it_looked(search: SearchPath,
                                                                tmp_path: Path) -> None:
    looked = ", ".join(str(d) for d in search.profile_dirs())
    expected = [at("missing-profile-job.yaml", 2, "profile: no profile 'good-chlid' on the "
                   f"search path; did you mean 'good-child'? (looked in: {looked})")]
    assert validate_files([DATA / "missing-profile-job.yaml"], search) == expected
    with pytest.raises(ValidationError) as caught:
        load_job(DATA / "missing-profile-job.yaml", search)
    assert caught.value.problems == expected
    assert str(tmp_path / "profiles") in looked and str(DATA) in looked


def test_extends_cycle_names_the_chain(search: SearchPath) -> None:
    a, b = DATA / "cycle-a.yaml", DATA / "cycle-b.yaml"
    assert validate_files([a], search) == [
        at("cycle-b.yaml", 2, f"extends: cycle {a} -> {b} -> {a}; remove one of these `extends`")]


def test_missing_parent_names_the_extends_line(search: SearchPath) -> None:
    looked = ", ".join(str(d) for d in search.profile_dirs())
    assert validate_files([DATA / "missing-parent.yaml"], search) == [
        at("missing-parent.yaml", 3, "extends: no profile 'good-parnet' on the search path; "
           f"did you mean 'good-parent'? (looked in: {looked})")]


def test_problems_of_several_files_come_in_file_order(search: SearchPath) -> None:
    lines = validate_files([DATA / "duplicate.yaml", DATA / "bad-job.yaml"], search)
    assert lines == [at("duplicate.yaml", 5, DUPLICATE),
                     *BAD_JOB]


def test_a_job_reports_its_profiles_problems_after_its_own(search: SearchPath,
                                                            tmp_path: Path) -> None:
    job = write(tmp_path / "job.yaml", "profile: bad-profile\nscript: t.py\nnodes: -1\n")
    lines = validate_files([job], search)
    assert lines == [f"{job}:3: nodes: -1 is too small; use 1 or more", *BAD_PROFILE]


def test_newline_is_refused_in_every_string(search: SearchPath, tmp_path: Path) -> None:
    job = write(tmp_path / "nl.yaml", (
        'profile: good-child\n'
        'name: "a\\nb"\n'
        'script: "train.py\\nrm -rf /"\n'
        'args: ["ok", "x\\ny"]\n'
        'env: {A: "1\\n2"}\n'
        'workdir: "/scratch\\n"\n'
        'slurm: {comment: "a\\nb", sbatch: {reservation: "r\\n"}}\n'
        'template: "ddp\\u0000"\n'
    ))
    newline = "contains a newline; values must be a single line"
    assert validate_files([job], search) == [
        f"{job}:2: name: {newline}",
        f"{job}:3: script: {newline}",
        f"{job}:4: args[1]: {newline}",
        f"{job}:5: env.A: {newline}",
        f"{job}:6: workdir: {newline}",
        f"{job}:7: slurm.comment: {newline}",
        f"{job}:7: slurm.sbatch.reservation: {newline}",
        f"{job}:8: template: contains a NUL character; values must be a single line",
    ]


def test_command_substitution_refused_on_sbatch_lines_allowed_in_shell_body(
        search: SearchPath, tmp_path: Path) -> None:
    job = write(tmp_path / "subst.yaml", (
        "profile: good-child\n"
        "script: train.py\n"
        "args: ['--tag', '$(hostname)']\n"            # quoted by the renderer: fine
        "env: {RUN_ID: '$(date +%s)', B: '`id`'}\n"   # quoted by the renderer: fine
        "slurm:\n"
        "  qos: 'high`id`'\n"
        "  mail_user: '$(id)@x'\n"
    ))
    assert validate_files([job], search) == [
        (f"{job}:6: slurm.qos: 'high`id`' contains '`', which an #SBATCH line must not carry; "
        "use letters, digits and _ . , + -"),
        (f"{job}:7: slurm.mail_user: '$(id)@x' contains '$', which an #SBATCH line must not "
        "carry; use letters, digits and _ . / % @ + , : = * & | ! ( ) [ ] ^ ~ -"),
    ]


def test_missing_required_job_keys(search: SearchPath, tmp_path: Path) -> None:
    job = write(tmp_path / "j.yaml", "nodes: 2\nprofile: good-child\n")
    assert validate_files([job], search) == [
        f"{job}:1: missing required key 'script'; name the training script, e.g. `script: train.py`"]


def test_torchrun_with_several_tasks_per_node_is_refused(search: SearchPath,
                                                         tmp_path: Path) -> None:
    job = write(tmp_path / "t.yaml", "profile: good-child\nscript: t.py\nlauncher: torchrun\n"
                                     "slurm:\n  ntasks_per_node: 4\n")
    assert validate_files([job], search) == [
        (f"{job}:5: slurm.ntasks_per_node: 4 with launcher torchrun starts 4 torchrun agents "
        "per node; torchrun runs one task per node, so remove it or use launcher: srun")]


# --------------------------------------------------------------------------- good files

def test_extends_deep_merges_child_wins_lists_replaced(search: SearchPath) -> None:
    profile = load_profile("good-child", search)
    data = profile.data
    assert profile.name == data["name"] == "good-child"  # the file stem, not the parent's name
    assert "extends" not in data
    assert profile.chain == [DATA / "good-child.yaml", DATA / "good-parent.yaml"]
    assert data["ssh"]["user"] == "alice" and data["ssh"]["fanout"] == 8
    assert data["ssh"]["host_key_policy"] == "strict" and data["ssh"]["port"] is None  # defaults: unset port is ssh_config's
    assert data["login"] is None
    assert data["slurm"]["partition"] == "gpu" and data["slurm"]["account"] == "proj123"
    assert data["network"]["ib_hca"] == ["mlx5_3:1"]
    assert data["network"]["nccl_env"] == {"NCCL_IB_QPS_PER_CONNECTION": 2, "NCCL_IB_TC": 106}
    assert data["environment"]["env"] == {"OMP_NUM_THREADS": "4", "FROM_PARENT": "1"}
    assert data["environment"]["python"] == "python3"
    assert profile.where("ssh", "fanout") == f"{DATA / 'good-child.yaml'}:3"
    assert profile.where("ssh", "user") == f"{DATA / 'good-parent.yaml'}:3"
    assert profile.where("network", "ib_hca", 0) == f"{DATA / 'good-child.yaml'}:7"


def test_effective_settings(search: SearchPath) -> None:
    job = load_job(DATA / "good-job.yaml", search)
    assert effective(job) == {
        "name": "good-job",
        "profile_name": "good-child",
        "nodes": 2,
        "gpus_per_node": 8,
        "ntasks_per_node": 8,
        "launcher": "srun",
        "script": str(DATA / "train.py"),  # no workdir: relative to the job file's folder
        "args": [],
        "workdir": None,
        "output": None,
        "preflight": True,
        "cuda_graphs": False,
        "cuda_graphs_compile": None,
        "template": "ddp",
        "master_port": None,
        "slurm": {"partition": "gpu", "account": "proj123", "qos": None,
                  "constraint": "h100&ib", "cpus_per_task": None, "mem": None, "time": "30",
                  "exclusive": None, "nodelist": None, "exclude": None, "extra": {"mail-type": "END"}},
        "network": {"fabric": "infiniband", "ib_hca": ["mlx5_3:1"], "gid_index": None,
                    "ib_timeout": 23, "socket_ifname": None,
                    "nccl_env": {"NCCL_IB_QPS_PER_CONNECTION": "2", "NCCL_IB_TC": "106"},
                    "debug": "INFO"},
        "environment": {"modules": ["cuda/12.4"], "setup": [], "python": "python3",
                        "env": {"OMP_NUM_THREADS": "4", "FROM_PARENT": "1",
                                "WANDB_MODE": "offline"}},
        "expect": {"gpus_per_node": 8, "gpu_model": None, "min_driver": None, "nccl": ">=2.18",
                   "ib_rate_gbps": None, "peermem": None, "memlock": None,
                   "allreduce_busbw_gbps": None, "xid_window": None, "torch_cuda": None,
                   "ib_error_thresholds": {}, "nvlink_error_thresholds": {}},
        "container": None,
        "resilience": None,
    }


@pytest.mark.parametrize(("job_text", "gpus", "tasks"), [
    ("launcher: torchrun\n", 8, 1),
    ("gpus_per_node: 4\n", 4, 4),
    ("gpus_per_node: h100:2\n", "h100:2", 2),
    ("slurm: {ntasks_per_node: 3}\n", 8, 3),
])
def test_tasks_per_node_follow_launcher_and_gpus(search: SearchPath, tmp_path: Path,
                                                 job_text: str, gpus: object, tasks: int) -> None:
    job = write(tmp_path / "j.yaml", "profile: good-child\nscript: t.py\n" + job_text)
    settings = effective(load_job(job, search))
    assert (settings["gpus_per_node"], settings["ntasks_per_node"]) == (gpus, tasks)


def test_profile_given_as_a_path_is_relative_to_the_job_file(search: SearchPath,
                                                              tmp_path: Path) -> None:
    write(tmp_path / "cluster" / "mine.yaml", "slurm: {partition: p1}\n")
    job = write(tmp_path / "jobs" / "j.yaml", "profile: ../cluster/mine.yaml\nscript: t.py\n")
    loaded = load_job(job, search)
    assert loaded.profile.name == "mine"
    assert effective(loaded)["slurm"]["partition"] == "p1"
    assert loaded.where("script") == f"{job}:2"


# --------------------------------------------------------------------------- search path

def test_search_path_order_first_hit_wins(tmp_path: Path) -> None:
    option_dir, env_dir = tmp_path / "opt", tmp_path / "env"
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    places = [option_dir, env_dir / "profiles", cwd / "profiles",
              home / ".config" / "clusterkit" / "profiles"]
    for place in places:
        write(place / "x.yaml", f"slurm: {{partition: {place.parent.name}}}\n")
    search = SearchPath.from_environment([option_dir], environ={"CLUSTERKIT_PATH": str(env_dir)},
                                         cwd=cwd, home=home)
    assert search.profile_dirs()[-1] == builtin_dir("profiles")
    winners = []
    for place in places:
        winners.append(load_profile("x", search).path)
        (place / "x.yaml").unlink()
    assert winners == [place / "x.yaml" for place in places]
    with pytest.raises(InputError, match="no profile 'x' on the search path"):
        load_profile("x", search)


def test_list_profiles_shows_the_winner_of_each_name(tmp_path: Path) -> None:
    first = write(tmp_path / "a" / "local-dev.yaml", "slurm: {partition: mine}\n")
    search = SearchPath.from_environment([tmp_path / "a"], environ={}, cwd=tmp_path, home=tmp_path)
    listed = dict(search.list_profiles())
    assert listed["local-dev"] == first
    assert listed["ib-ndr"] == builtin_dir("profiles") / "ib-ndr.yaml"


def test_a_users_profile_can_extend_the_builtin_of_the_same_name(tmp_path: Path) -> None:
    user = tmp_path / ".config" / "clusterkit" / "profiles"
    write(user / "local-dev.yaml", "extends: local-dev\nslurm: {partition: mine}\n")
    search = SearchPath.from_environment([], environ={}, cwd=tmp_path, home=tmp_path)
    profile = load_profile("local-dev", search)
    assert profile.chain[:2] == [user / "local-dev.yaml", builtin_dir("profiles") / "local-dev.yaml"]
    assert profile.data["slurm"]["partition"] == "mine"
    assert profile.data["ssh"]["user"] == "ckuser"


def test_find_template_by_name_and_by_path(search: SearchPath, tmp_path: Path) -> None:
    assert search.find_template("ddp") == builtin_dir("templates") / "ddp.j2"
    mine = write(tmp_path / "t" / "mine.j2", "#!/bin/bash\n")
    assert search.find_template("t/mine.j2", base=tmp_path) == mine
    with pytest.raises(InputError, match="no template 'nope' on the search path"):
        search.find_template("nope")


def test_template_lookup_is_what_render_and_find_template_share(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    assert template_lookup("ddp", dirs) == (dirs, "ddp.j2")
    assert template_lookup("t/mine.j2", dirs) == ([Path("t"), *dirs], "mine.j2")
    assert template_lookup("~/x.j2", dirs) == ([Path.home(), *dirs], "x.j2")


def test_builtin_profiles_validate(tmp_path: Path) -> None:
    search = SearchPath.from_environment([], environ={}, cwd=tmp_path, home=tmp_path)
    files = sorted(builtin_dir("profiles").glob("*.yaml"))
    assert {f.stem for f in files} >= {"local-dev", "ib-ndr", "roce-v2", "tcp-only"}
    assert validate_files(files, search) == []
    dev = load_profile("local-dev", search).data
    assert dev["slurm"]["partition"] == "debug" and dev["nodes"] == "n[1-4]"
    assert dev["network"]["ib_hca"] == ["mlx5_0:1", "mlx5_1:1"] and dev["expect"]["memlock"] is None


def test_config_imports_no_heavy_modules() -> None:
    """`clusterkit render` loads config, schema and yamlfile: they (and what they import
    from the package) must not pull in paramiko, subprocess, torch or jinja2."""
    heavy = {"paramiko", "subprocess", "torch", "jinja2"}
    todo, seen = ["config.load"], set()
    while todo:
        name = todo.pop()
        seen.add(name)
        tree = ast.parse(module_path(name).read_text())
        for node in ast.walk(tree):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for module in modules:
                assert module.split(".")[0] not in heavy, f"{name}.py imports {module}"
                if module.startswith("cluster_kit."):
                    todo += [m for m in [module[len("cluster_kit."):]] if m not in seen]
                if isinstance(node, ast.ImportFrom) and module.startswith("cluster_kit"):
                    todo += [f"{module[len('cluster_kit.'):]}.{a.name}".lstrip(".") for a in node.names
                             if module_path(f"{module[len('cluster_kit.'):]}.{a.name}".lstrip(".")).exists()]
    assert {"config.load", "config.specs", "config.yamlfile", "errors"} <= seen


def module_path(dotted: str) -> Path:
    """The file of cluster_kit.<dotted>: a module, or a package's __init__.py."""
    base = REPO / "cluster_kit" / Path(*dotted.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
