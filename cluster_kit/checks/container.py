"""container.nccl and container.rdma: what the job's image lets NCCL use.

They run only for a job with `container:` (the in-job preflight, whose probe
ran inside the image). NCCL picks its transport from what it can load and open:
an image without libibverbs, or a container without /dev/infiniband, makes it
fall back to sockets without an error, so a fabric the profile calls RDMA
(infiniband, roce or listed HCAs) needs both.
"""
from __future__ import annotations

from cluster_kit.checks.findings import (
    Facts,
    Finding,
    Profile,
    failed,
    passed,
    section,
    settings,
)

RDMA_FABRICS = ("infiniband", "roce")
VERBS_FIX = ("add rdma-core's user space to the image (Debian/Ubuntu: `apt-get install -y "
             "libibverbs1 ibverbs-providers`; NGC images ship it)")
DEVICES_FIX = ("the node must have /dev/infiniband (`modprobe ib_uverbs`); with Apptainer add "
               "`/dev/infiniband:/dev/infiniband` to container.mounts")
NCCL_FIX = ("use an image that ships NCCL (NGC PyTorch images, or `pip install nvidia-nccl-cu12` "
            "in the image), or mount the host's NCCL and put its folder on LD_LIBRARY_PATH")


def wants_rdma(profile: Profile) -> bool:
    """The profile's network uses InfiniBand/RoCE verbs."""
    network = settings(profile, "network")
    return network.get("fabric") in RDMA_FABRICS or bool(network.get("ib_hca"))


def image_of(profile: Profile) -> str:
    return str((profile.get("container") or {}).get("image") or "the image")


def check_nccl(facts: Facts, image: str) -> Finding:
    """container.nccl: a libnccl is loadable inside the container."""
    nccl = section(facts, "nccl")
    if nccl.get("path"):
        return passed("container.nccl", f"libnccl {nccl.get('version')} in {image} ({nccl['path']})")
    return failed("container.nccl", f"no libnccl inside the container ({image}): NCCL cannot start",
                  NCCL_FIX)


def check_rdma(facts: Facts, image: str) -> Finding:
    """container.rdma: libibverbs and /dev/infiniband are visible inside the container."""
    verbs = section(facts, "verbs")
    missing = []
    if not verbs.get("libibverbs"):
        missing.append(("no libibverbs in the image", VERBS_FIX))
    if not verbs.get("dev_infiniband"):
        missing.append(("no /dev/infiniband in the container", DEVICES_FIX))
    if not missing:
        return passed("container.rdma", f"libibverbs and /dev/infiniband are visible in {image}")
    what = " and ".join(text for text, _fix in missing)
    return failed("container.rdma", f"{what} ({image}): NCCL would fall back to sockets without an error",
                  "; ".join(fix for _text, fix in missing))


def check(facts: Facts, profile: Profile) -> list[Finding]:
    """The container checks that apply to this job (none without `container:`)."""
    if not profile.get("container"):
        return []
    image = image_of(profile)
    findings = []
    if wants_rdma(profile) or settings(profile, "expect").get("nccl"):
        findings.append(check_nccl(facts, image))
    if wants_rdma(profile):
        findings.append(check_rdma(facts, image))
    return findings


def inside(finding: Finding, profile: Profile) -> Finding:
    """A finding of a job with a container, saying that it was seen inside the image."""
    if not profile.get("container") or finding.id.startswith("container."):
        return finding
    return Finding(finding.id, finding.status, f"inside the container: {finding.message}", finding.fix)
