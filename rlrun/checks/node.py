"""What a Ray node offers: CPUs, GPUs, object store, custom resources, the vendor, the open-file limit. How its
accelerator and fabric are set (roles/accel_env's variables) is rlrun/checks/accel.py's."""

from __future__ import annotations

import difflib
import re

from rlrun.checks.problems import Recorder
from rlrun.checks.shapes import whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN

VENDORS = ("nvidia", "amd", "cpu")
OP_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # a DeepSpeed op's name (roles/ray_node's assert)
VENDOR_GUESSES = {"cuda": "nvidia", "gpu": "nvidia", "nv": "nvidia", "rocm": "amd", "hip": "amd", "none": "cpu"}


def given(value) -> bool:
    return value not in (UNKNOWN, None)


def check_resources(r: Recorder, host: str) -> None:
    gpus = r.user_value(host, N.num_gpus)
    if given(gpus) and (not whole(gpus) or int(gpus) < 0):
        r.add(host, N.num_gpus, r.raw(host)[N.num_gpus], "must be a whole number of GPUs (0 or more), or null to "
              "let Ray count them")
    cpus = r.user_value(host, N.num_cpus)
    if given(cpus) and (not whole(cpus) or int(cpus) < 1):
        r.add(host, N.num_cpus, r.raw(host)[N.num_cpus], "must be a whole number of CPUs (1 or more), or null to "
              "let Ray count them")
    mem = r.user_value(host, N.object_store_memory)
    if given(mem) and (not whole(mem) or int(mem) < 78_643_200):
        r.add(host, N.object_store_memory, r.raw(host)[N.object_store_memory], "must be a number of bytes, at least "
              "78643200 (75 MiB, Ray's minimum), e.g. 10000000000 for 10 GB; null = Ray's default")
    res = r.user_value(host, N.resources)
    if given(res) and not isinstance(res, dict):
        r.add(host, N.resources, r.raw(host)[N.resources], "must be a mapping of name: value (custom resource: "
              "amount), e.g. {accel: 1}")
    if isinstance(res, dict):
        for name, amount in res.items():
            if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
                r.add(host, N.resources, res, f"resource {name!r} must be a number >= 0")
    ops = r.user_value(host, N.deepspeed_ops)  # not a list: the type's rule says so
    if isinstance(ops, list) and not all(isinstance(op, str) and OP_NAME.match(op) for op in ops):
        # they go into the build's command line here and into the words of `rlrun slurm`'s script
        r.add(host, N.deepspeed_ops, r.raw(host)[N.deepspeed_ops], "must be a list of DeepSpeed op names such as "
              "[cpu_adam] (lower case, digits and underscores)")


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
    """GPUs only where the vendor has some (the accelerator env file's own rules: rlrun/checks/accel.py)."""
    vendor = r.value(host, N.accelerator, "cpu")
    gpus = r.value(host, N.num_gpus)
    if vendor == "cpu" and whole(gpus) and int(gpus) > 0:
        r.add(host, N.num_gpus, gpus, f"is more than 0 on a host whose {N.accelerator} is cpu: set {N.accelerator} "
              f"to nvidia or amd, or {N.num_gpus} to 0")
    nofile = r.user_value(host, N.nofile_limit)
    if given(nofile) and (not whole(nofile) or not 1024 <= int(nofile) <= 1_048_576):
        r.add(host, N.nofile_limit, nofile, "must be a whole number from 1024 to 1048576 (Linux's nr_open)")
