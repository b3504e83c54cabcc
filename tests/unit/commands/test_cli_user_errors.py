"""What a new user runs into, fed exactly that input: each message names FILE:LINE or the
node, says what to do, and `validate` refuses what `render` and `submit` would.

Most cases run the click command in-process (CliRunner, real files in a temporary
folder); a few run the real `clusterkit` process where the exit path matters.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import ClassVar

import clirun
import pytest
from clirun import ck

from cluster_kit.config.load import load_profile
from cluster_kit.config.search import SearchPath, builtin_dir

work = clirun.work  # the fixture: an empty folder as cwd and HOME

BUILTIN_PROFILES = sorted(p.stem for p in builtin_dir("profiles").glob("*.yaml"))


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ---------------------------------------------------------------- profiles show | validate


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_what_profiles_show_prints_is_a_valid_profile_with_the_same_settings(work: Path, name: str) -> None:
    shown = ck("profiles", "show", name)
    assert shown.exit_code == 0, shown.stderr
    assert ": null" not in shown.stdout and ": []" not in shown.stdout and ": {}" not in shown.stdout
    copy = write(work / f"{name}-copy.yaml", shown.stdout)
    checked = ck("validate", str(copy))
    assert checked.exit_code == 0, checked.stderr
    assert checked.stdout == "1 file(s) valid\n"
    search = SearchPath.from_environment()
    assert load_profile(str(copy), search).data == load_profile(name, search).data


def test_the_dev_nodes_profile_ships() -> None:
    assert "dev-nodes" in BUILTIN_PROFILES and "local-dev" in BUILTIN_PROFILES
    assert os.path.basename(str(builtin_dir("profiles"))) == "profiles"


# ---------------------------------------------------------------- YAML slips


@pytest.mark.parametrize("command", ["validate", "render"])
def test_bad_indentation_prints_a_hint_beyond_pyyamls_words(work: Path, command: str) -> None:
    job = write(work / "job.yaml", "profile: local-dev\nscript: t.py\nslurm:\n    partition: debug\n"
                                   "  time: \"00:01:00\"\n")
    done = ck(command, str(job))
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr == (f"{job}:5: expected <block end>, but found '<block mapping start>' (while parsing "
                           "a block mapping started on line 1); line 5 (`time:`) is indented 2 spaces, which "
                           "lines up with no key above it: indent it 4 spaces like `partition:` on line 4 "
                           "or 0 spaces like `slurm:` on line 3\n")


# ---------------------------------------------------------------- the job's script


JOB = "name: t\nprofile: local-dev\nnodes: 1\nscript: train.py\n"


@pytest.mark.parametrize("command", ["validate", "render", "submit"])
def test_a_missing_script_is_named_at_its_line_with_where_it_looked(work: Path, command: str) -> None:
    job = write(work / "jobs" / "job.yaml", JOB)
    write(work / "train.py", "print('in the wrong folder')\n")  # cwd is not where it is looked for
    done = ck(command, str(job))
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr == (f"{job}:4: script: no file {work}/jobs/train.py (without a workdir a relative "
                           f"script starts at the job file's folder, {work}/jobs); check the name, or set "
                           "workdir: to the folder that holds it\n")


def test_the_script_next_to_the_job_file_passes_and_is_what_the_job_runs(work: Path) -> None:
    job = write(work / "jobs" / "job.yaml", JOB)
    write(work / "jobs" / "train.py", "print('here')\n")
    assert ck("validate", str(job)).exit_code == 0
    rendered = ck("render", str(job))
    assert rendered.exit_code == 0, rendered.stderr
    assert f" {work}/jobs/train.py\n" in rendered.stdout  # the path checked is the path run


def test_under_a_workdir_the_script_is_looked_for_there_and_run_as_written(work: Path) -> None:
    job = write(work / "job.yaml", JOB + f"workdir: {work}/run1\n")
    missing = ck("validate", str(job))
    assert missing.exit_code == 2
    assert missing.stderr == (f"{job}:4: script: no file {work}/run1/train.py (workdir {work}/run1 + "
                              "train.py); check the name, or put train.py into the workdir\n")
    write(work / "run1" / "train.py", "print('here')\n")
    assert ck("validate", str(job)).exit_code == 0
    rendered = ck("render", str(job)).stdout
    assert f"#SBATCH --chdir={work}/run1\n" in rendered and " train.py\n" in rendered


def test_an_absolute_script_and_a_tilde_script(work: Path) -> None:
    job = write(work / "job.yaml", "profile: local-dev\nscript: /nonexistent/train.py\n")
    assert ck("validate", str(job)).stderr == f"{job}:2: script: no file /nonexistent/train.py; check the path\n"
    job = write(work / "job.yaml", "profile: local-dev\nscript: ~/train.py\n")
    err = ck("validate", str(job)).stderr
    assert err.startswith(f"{job}:2: script: '~/train.py' starts with ~, which the job does not expand")


def test_offline_validate_skips_only_the_login_hosts_script(work: Path) -> None:
    # ib-ndr has login01, which does not resolve here: --offline never contacts it
    job = write(work / "job.yaml", "profile: ib-ndr\nscript: train.py\n")
    done = ck("validate", "--offline", str(job))
    assert done.exit_code == 0, done.stderr
    assert done.stderr == f"clusterkit: note: {job}:2: script train.py not looked for on login01 (--offline)\n"


def test_validate_without_offline_looks_on_the_login_host(work: Path) -> None:
    # nothing listens on port 1: the look-up is refused at once
    write(work / "far.yaml", "login: {host: 127.0.0.1, port: 1, connect_timeout: 2}\nslurm: {partition: gpu}\n")
    job = write(work / "job.yaml", "profile: ./far.yaml\nscript: train.py\n")
    done = ck("validate", str(job))
    assert done.exit_code == 3  # the cluster (its login host) could not be asked
    assert done.stderr.startswith(f"clusterkit: error: cannot look for the job's script {work}/train.py on "
                                  "127.0.0.1: connection refused"), done.stderr
    assert "validate --offline" in done.stderr
    assert ck("validate", "--offline", str(job)).exit_code == 0


# ---------------------------------------------------------------- validate refuses what render refuses


def test_an_unknown_template_is_refused_by_validate_at_its_line(work: Path) -> None:
    write(work / "train.py", "")
    job = write(work / "job.yaml", "profile: local-dev\nscript: train.py\ntemplate: dpp\n")
    for command in ("validate", "render"):
        done = ck(command, str(job))
        assert done.exit_code == 2
        assert done.stderr.startswith(f"{job}:3: template: no template 'dpp' on the search path; "
                                      "did you mean 'ddp'? (looked in: "), done.stderr
        assert done.stderr.count("\n") == 1


def test_a_relative_template_path_starts_at_the_job_file(work: Path) -> None:
    write(work / "jobs" / "train.py", "")
    write(work / "jobs" / "mine.j2", "#!/bin/bash\n#SBATCH --job-name={{ settings.name }}\necho mine\n")
    job = write(work / "jobs" / "job.yaml", "profile: local-dev\nscript: train.py\ntemplate: ./mine.j2\n")
    assert ck("validate", str(job)).exit_code == 0
    rendered = ck("render", str(job))  # cwd is work/, not work/jobs/
    assert rendered.exit_code == 0 and rendered.stdout.endswith("echo mine\n"), rendered.stderr
    gone = write(work / "jobs" / "gone.yaml", "profile: local-dev\nscript: train.py\ntemplate: ./gone.j2\n")
    err = ck("validate", str(gone)).stderr
    assert err.startswith(f"{gone}:3: template: no template file {work}/jobs/gone.j2 (a relative path "
                          f"starts at {work}/jobs, the folder of the file naming it)"), err


def test_a_template_that_fails_to_render_fails_validate(work: Path) -> None:
    write(work / "train.py", "")
    write(work / "broken.j2", "#!/bin/bash\n{{ settings.no_such_key }}\n")
    job = write(work / "job.yaml", "profile: local-dev\nscript: train.py\ntemplate: broken.j2\n")
    done = ck("validate", str(job))
    assert done.exit_code == 2
    assert done.stderr.startswith(f"{job}:3: template: {work}/broken.j2:2: template error: "), done.stderr


def test_a_profile_given_as_a_job_file_is_one_message(work: Path) -> None:
    profile = builtin_dir("profiles") / "ib-ndr.yaml"
    for command in ("render", "submit"):
        done = ck(command, str(profile))
        assert done.exit_code == 2
        assert done.stderr == (f"{profile}:1: ib-ndr.yaml is a cluster profile, not a job file; give a job "
                               f"file (with `profile:` and `script:` keys) that names it, e.g. `profile: "
                               f"{profile}`, or pass it as --profile {profile}\n")


def test_a_job_file_given_as_a_profile_is_one_message(work: Path) -> None:
    job = write(work / "job.yaml", JOB)
    done = ck("preflight", "--profile", str(job))
    assert done.exit_code == 2
    assert done.stderr == (f"{job}:1: job.yaml is a job file, not a cluster profile; give a cluster profile "
                           "instead (`clusterkit profiles list`), such as the one this job file names: local-dev\n")
    other = write(work / "other.yaml", f"profile: {job}\nscript: train.py\n")
    err = ck("validate", str(other)).stderr
    assert err == (f"{other}:1: profile: {job} is a job file, not a cluster profile; name a cluster "
                   "profile (`clusterkit profiles list`) or a path to one\n")


def test_a_job_file_without_profile_and_script_is_still_checked_as_a_job(work: Path) -> None:
    job = write(work / "job.yaml", "nodes: 2\nlauncher: torchrun\nargs: [--epochs, 3]\n")
    err = ck("validate", str(job)).stderr
    assert "missing required key 'profile'" in err and "missing required key 'script'" in err
    assert "unknown key" not in err


# ---------------------------------------------------------------- smaller slips


def unreachable_profile(work: Path) -> Path:
    """A profile of nodes n[1-2] whose SSH port refuses at once (nothing listens on port 1)."""
    return write(work / "p.yaml", "name: p\nnodes: n[1-2]\nssh: {port: 1, connect_timeout: 2, "
                                  f"known_hosts: {work}/kh}}\n")


def test_nodes_outside_the_profile_get_a_warning_on_stderr(work: Path) -> None:
    profile = unreachable_profile(work)
    done = ck("preflight", "--profile", str(profile), "--nodes", "127.0.0.1", "--json")
    assert done.exit_code == 1  # unreachable, as it should be; the warning is what matters
    assert done.stderr == ("clusterkit: warning: --nodes 127.0.0.1 is not in profile p's nodes (n[1-2]); "
                           "checking it against its expectations anyway\n")
    assert done.stdout.startswith("{")  # --json keeps stdout one JSON document


@pytest.mark.parametrize("option", ["--save-baseline", "-o"])
def test_audit_output_paths_are_checked_before_any_node_is_probed(work: Path, option: str) -> None:
    profile = unreachable_profile(work)
    done = ck("audit", "--profile", str(profile), option, "/nonexistent/out")
    assert done.exit_code == 2 and done.stdout == ""
    assert done.stderr == (f"clusterkit: error: {option} /nonexistent/out: cannot write there: the folder "
                           "/nonexistent does not exist\n  fix: name a file in an existing folder you can write to\n")


def test_a_baseline_of_another_profile_is_compared_with_a_warning(work: Path) -> None:
    from cluster_kit.fleet.audit import baseline_profile_warning, save_baseline

    baseline = save_baseline({"n1": {"gpu.driver": "550.54.15"}}, profile="prod", created="2026-12-01T00:00:00Z")
    assert baseline_profile_warning(baseline, "prod", "b.json") is None
    assert baseline_profile_warning(baseline, "staging", "b.json") == (
        "b.json was saved for profile 'prod', not 'staging': its changes compare two profiles; "
        "pass a baseline saved with --profile staging")
    write(work / "b.json", json.dumps(baseline))
    profile = unreachable_profile(work)
    done = ck("audit", "--profile", str(profile), "--baseline", str(work / "b.json"), "--format", "json")
    assert done.stderr.startswith(f"clusterkit: warning: {work}/b.json was saved for profile 'prod', not 'p': ")


def test_status_leaves_out_slurms_reason_none() -> None:
    from cluster_kit.slurm.jobs import JobStatus

    running = JobStatus("12", "RUNNING", "None", "n1", "0:05", None, None, "squeue")
    assert "reason" not in dict(running.items())
    pending = JobStatus("13", "PENDING", "Resources", "", "0:00", None, None, "squeue")
    assert dict(pending.items())["reason"] == "Resources"


SLURM_TEXT = Path(__file__).resolve().parents[2] / "data" / "slurm"


class UnknownJobRunner:
    """Answers each Slurm command with what Slurm 22.05 printed for a job id it never had
    (recorded in tests/data/slurm; this cluster keeps no accounting)."""

    where = "on this machine"
    recorded: ClassVar[dict[str, str]] = {"squeue": "squeue_unknown", "scontrol": "scontrol_show_job_unknown",
                                          "sacct": "sacct_disabled"}

    def run(self, argv: list[str], stdin: str | None = None, timeout: float = 60) -> object:
        from cluster_kit.slurm.runner import Completed

        case = self.recorded[argv[0]]
        return Completed(list(argv), 1, (SLURM_TEXT / f"{case}.stdout").read_text(),
                         (SLURM_TEXT / f"{case}.stderr").read_text())


def test_logs_of_a_job_slurm_never_had_says_so() -> None:
    from cluster_kit.errors import ClusterRefused
    from cluster_kit.slurm import jobs

    with pytest.raises(ClusterRefused) as caught:
        jobs.read_output(UnknownJobRunner(), "99999")  # type: ignore[arg-type]
    assert caught.value.message == "Slurm on this machine does not know job 99999"


def test_every_example_job_validates_offline(work: Path) -> None:
    examples = sorted(str(p) for p in (Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    done = ck("validate", "--offline", *examples)
    assert done.exit_code == 0, done.stderr
    assert done.stdout == f"{len(examples)} file(s) valid\n"
