"""container.nccl and container.rdma, whole findings: what the job's image lets NCCL use.

A job with `container:` runs the probe inside its image; these checks say what the
image lacks (libnccl, libibverbs, /dev/infiniband) and how to add it, and every
other finding says it was seen inside the container.
"""
from __future__ import annotations

from typing import Any

import pytest

from cluster_kit.checks import Finding, container, evaluate
from cluster_kit.checks.container import DEVICES_FIX, NCCL_FIX, VERBS_FIX

IMAGE = "nvcr.io#nvidia/pytorch:24.05-py3"
NCCL_OK = {"status": "ok", "path": "/usr/lib/libnccl.so.2", "version": "2.21.5"}
VERBS_OK = {"status": "ok", "libibverbs": True, "dev_infiniband": True}


def job(network: dict[str, Any] | None = None, expect: dict[str, Any] | None = None,
        image: str | None = IMAGE) -> dict[str, Any]:
    """Effective job settings with a container (its image unless None)."""
    return {"network": network or {}, "expect": expect or {},
            "container": {"runtime": "pyxis", **({"image": image} if image else {})}}


@pytest.mark.parametrize("network, wanted", [
    ({"fabric": "infiniband"}, True),
    ({"fabric": "roce"}, True),
    ({"fabric": "ethernet", "ib_hca": ["mlx5_0:1"]}, True),
    ({"fabric": "ethernet", "ib_hca": []}, False),
    ({"fabric": "ethernet"}, False),
    ({}, False),
])
def test_rdma_is_wanted_for_verbs_fabrics_and_listed_hcas(network: dict[str, Any], wanted: bool) -> None:
    assert container.wants_rdma({"network": network}) is wanted


def test_the_image_is_named_or_called_the_image() -> None:
    assert container.image_of(job()) == IMAGE
    assert container.image_of(job(image=None)) == "the image"
    assert container.image_of({"container": None}) == "the image"


def test_no_container_no_container_checks() -> None:
    profile = {"network": {"fabric": "infiniband"}, "expect": {"nccl": ">=2.18"}}
    assert container.check({"nccl": {}, "verbs": {}}, profile) == []
    assert container.check({"nccl": {}, "verbs": {}}, {**profile, "container": None}) == []


def test_an_ethernet_job_without_expect_nccl_has_no_container_checks() -> None:
    assert container.check({}, job({"fabric": "ethernet"})) == []


def test_expect_nccl_alone_checks_the_library_only() -> None:
    facts = {"nccl": NCCL_OK, "verbs": {}}
    assert container.check(facts, job({"fabric": "ethernet"}, {"nccl": ">=2.18"})) == [
        Finding("container.nccl", "pass", f"libnccl 2.21.5 in {IMAGE} (/usr/lib/libnccl.so.2)")]


def test_an_rdma_job_checks_the_library_and_verbs_and_both_pass() -> None:
    facts = {"nccl": NCCL_OK, "verbs": VERBS_OK}
    assert container.check(facts, job({"fabric": "roce"})) == [
        Finding("container.nccl", "pass", f"libnccl 2.21.5 in {IMAGE} (/usr/lib/libnccl.so.2)"),
        Finding("container.rdma", "pass", f"libibverbs and /dev/infiniband are visible in {IMAGE}"),
    ]


def test_an_image_without_nccl_or_verbs_gets_both_fixes() -> None:
    facts = {"nccl": {"status": "absent"}, "verbs": {"status": "ok", "libibverbs": False, "dev_infiniband": False}}
    assert container.check(facts, job({"ib_hca": ["mlx5_0:1"]}, image=None)) == [
        Finding("container.nccl", "fail", "no libnccl inside the container (the image): NCCL cannot start",
                NCCL_FIX),
        Finding("container.rdma", "fail", "no libibverbs in the image and no /dev/infiniband in the container "
                "(the image): NCCL would fall back to sockets without an error", f"{VERBS_FIX}; {DEVICES_FIX}"),
    ]
    assert NCCL_FIX == ("use an image that ships NCCL (NGC PyTorch images, or `pip install nvidia-nccl-cu12` "
                        "in the image), or mount the host's NCCL and put its folder on LD_LIBRARY_PATH")
    assert VERBS_FIX == ("add rdma-core's user space to the image (Debian/Ubuntu: `apt-get install -y "
                         "libibverbs1 ibverbs-providers`; NGC images ship it)")
    assert DEVICES_FIX == ("the node must have /dev/infiniband (`modprobe ib_uverbs`); with Apptainer add "
                           "`/dev/infiniband:/dev/infiniband` to container.mounts")


def test_libibverbs_alone_missing() -> None:
    assert container.check_rdma({"verbs": {"libibverbs": False, "dev_infiniband": True}}, IMAGE) == Finding(
        "container.rdma", "fail",
        f"no libibverbs in the image ({IMAGE}): NCCL would fall back to sockets without an error", VERBS_FIX)


def test_dev_infiniband_alone_missing() -> None:
    assert container.check_rdma({"verbs": {"libibverbs": True}}, IMAGE) == Finding(
        "container.rdma", "fail",
        f"no /dev/infiniband in the container ({IMAGE}): NCCL would fall back to sockets without an error",
        DEVICES_FIX)


def test_findings_of_a_container_job_say_they_were_seen_inside_it() -> None:
    facts = {"memlock": {"status": "ok", "soft_kib": "unlimited"}, "nccl": NCCL_OK}
    profile = job({"fabric": "ethernet"}, {"memlock": "unlimited", "nccl": ">=2.18"})
    assert evaluate(facts, profile) == [
        Finding("nccl.library", "pass", "inside the container: libnccl 2.21.5 (/usr/lib/libnccl.so.2) "
                "satisfies >=2.18"),
        Finding("sys.memlock", "pass", "inside the container: RLIMIT_MEMLOCK is unlimited"),
        Finding("container.nccl", "pass", f"libnccl 2.21.5 in {IMAGE} (/usr/lib/libnccl.so.2)"),
    ]


def test_inside_keeps_status_and_fix_and_leaves_container_findings_and_host_jobs_alone() -> None:
    finding = Finding("sys.memlock", "fail", "RLIMIT_MEMLOCK is 64 KiB", "raise it")
    assert container.inside(finding, job()) == Finding(
        "sys.memlock", "fail", "inside the container: RLIMIT_MEMLOCK is 64 KiB", "raise it")
    assert container.inside(finding, {"container": None}) is finding
    for own in (Finding("container.nccl", "fail", "no libnccl", "x"), Finding("container.rdma", "pass", "seen")):
        assert container.inside(own, job()) is own
