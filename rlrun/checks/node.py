"""What a Ray node offers and how its accelerator is set: CPUs, GPUs, object store, custom resources, the
vendor, the visible devices, the NCCL / Gloo interfaces, the open-file limit."""

from __future__ import annotations

import difflib
import re

from rlrun.checks.problems import Recorder
from rlrun.checks.shapes import whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN

VENDORS = ("nvidia", "amd", "cpu")
VENDOR_GUESSES = {"cuda": "nvidia", "gpu": "nvidia", "nv": "nvidia", "rocm": "amd", "hip": "amd", "none": "cpu"}
IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


def _given(value) -> bool:
    return value not in (UNKNOWN, None)


def check_resources(r: Recorder, host: str) -> None:
    gpus = r.user_value(host, N.num_gpus)
    if _given(gpus) and (not whole(gpus) or int(gpus) < 0):
        r.add(host, N.num_gpus, r.raw(host)[N.num_gpus], "must be a whole number of GPUs (0 or more), or null to "
              "let Ray count them")
    cpus = r.user_value(host, N.num_cpus)
    if _given(cpus) and (not whole(cpus) or int(cpus) < 1):
        r.add(host, N.num_cpus, r.raw(host)[N.num_cpus], "must be a whole number of CPUs (1 or more), or null to "
              "let Ray count them")
    mem = r.user_value(host, N.object_store_memory)
    if _given(mem) and (not whole(mem) or int(mem) < 78_643_200):
        r.add(host, N.object_store_memory, r.raw(host)[N.object_store_memory], "must be a number of bytes, at least "
              "78643200 (75 MiB, Ray's minimum), e.g. 10000000000 for 10 GB; null = Ray's default")
    res = r.user_value(host, N.resources)
    if _given(res) and not isinstance(res, dict):
        r.add(host, N.resources, r.raw(host)[N.resources], "must be a mapping of name: value (custom resource: "
              "amount), e.g. {accel: 1}")
    if isinstance(res, dict):
        for name, amount in res.items():
            if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
                r.add(host, N.resources, res, f"resource {name!r} must be a number >= 0")


def check_vendor(r: Recorder, host: str) -> None:
    """The accelerator's vendor, on every host of the cluster: python_stack installs the stack for it."""
    vendor = r.value(host, N.accelerator, "cpu")
    if vendor is not UNKNOWN and vendor not in VENDORS:
        text = str(vendor).strip().lower()
        guess = text if text in VENDORS else VENDOR_GUESSES.get(text) or \
            next(iter(difflib.get_close_matches(text, list(VENDORS), n=1, cutoff=0.6)), None)
        r.add(host, N.accelerator, r.raw(host).get(N.accelerator, vendor),
              "must be nvidia, amd or cpu" + (f": did you mean {guess}?" if guess else ""))


def check_accelerator(r: Recorder, host: str) -> None:
    raw = r.raw(host)
    vendor = r.value(host, N.accelerator, "cpu")
    gpus = r.value(host, N.num_gpus)
    if vendor == "cpu" and whole(gpus) and int(gpus) > 0:
        r.add(host, N.num_gpus, gpus, f"is more than 0 on a host whose {N.accelerator} is cpu: set {N.accelerator} "
              f"to nvidia or amd, or {N.num_gpus} to 0")
    devices = r.user_value(host, N.visible_devices)
    if _given(devices) and not isinstance(devices, list):
        r.add(host, N.visible_devices, raw[N.visible_devices], "must be a list of GPU indices, e.g. [0, 1] (not a "
              "string)")
    if isinstance(devices, list):
        if any(not whole(d) or int(d) < 0 for d in devices):
            r.add(host, N.visible_devices, devices, "must list GPU indices (whole numbers 0, 1, ...)")
        elif len(set(devices)) != len(devices):
            r.add(host, N.visible_devices, devices, "lists a GPU twice")
        elif devices and whole(gpus) and int(gpus) > len(devices):
            r.add(host, N.num_gpus, gpus, f"is more than the {len(devices)} GPUs {N.visible_devices} shows")
    _fabric(r, host)


def _fabric(r: Recorder, host: str) -> None:
    gloo = r.user_value(host, N.gloo_ifname)
    if _given(gloo) and (not isinstance(gloo, str) or not IFNAME.match(gloo)):
        r.add(host, N.gloo_ifname, gloo, "must be exactly one interface name (Gloo takes no list and no ^exclusion), "
              "e.g. eth0")
    nccl = r.user_value(host, N.nccl_ifname)
    if _given(nccl):
        names = str(nccl).lstrip("^=").split(",")
        if not isinstance(nccl, str) or not all(IFNAME.match(n) for n in names):
            r.add(host, N.nccl_ifname, nccl, "must be interface names or prefixes separated by commas "
                  "(NCCL_SOCKET_IFNAME: eth0, ib0,ib1, ^docker,lo), without spaces")
    debug = r.user_value(host, N.nccl_debug)
    if _given(debug) and debug not in ("VERSION", "WARN", "INFO", "TRACE"):
        r.add(host, N.nccl_debug, debug, "must be VERSION, WARN, INFO or TRACE (or null)")
    gid = r.user_value(host, N.ib_gid_index)
    if _given(gid) and (not whole(gid) or not 0 <= int(gid) <= 255):
        r.add(host, N.ib_gid_index, gid, "must be a whole number from 0 to 255 (the RoCE GID index, often 3)")
    rocm = r.raw(host).get(N.rocm_version)
    if isinstance(rocm, float):
        r.add(host, N.rocm_version, rocm, f"is a number, so YAML may have changed it (6.10 reads as 6.1): write it "
              f"quoted, e.g. '{rocm}'")
    nofile = r.user_value(host, N.nofile_limit)
    if _given(nofile) and (not whole(nofile) or not 1024 <= int(nofile) <= 1_048_576):
        r.add(host, N.nofile_limit, nofile, "must be a whole number from 1024 to 1048576 (Linux's nr_open)")
