"""The accelerator env file's rules (roles/accel_env): the visible devices, the NCCL / Gloo interfaces, NCCL's
debug level and GID index, the ROCm version, the extra variables. Their one home: `rlrun validate` and the
validate play run them with every other rule (rlrun.checks.check_inventory), the cluster role's assert with the
other rules about one host, and roles/accel_env's own first task alone (lookup_plugins/accel_env_problems.py,
:func:`rlrun.checks.check_accel`). tests/unit/test_accel_rules_once.py fails when a role writes one of them
again in Jinja."""

from __future__ import annotations

import re

from rlrun.checks.node import given
from rlrun.checks.problems import Recorder
from rlrun.checks.shapes import whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN

IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
ROCM_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXTRA = "accel_env__extra"
# What the env file holds, as roles/accel_env/vars/main.yml computes it for the host (the role's expression):
# accel_env__extra may not redefine those.
WRITTEN = "accel_env__vars"
# The variables these rules check (tests/unit/test_accel_rules_once.py: no role's Jinja checks them again).
VARIABLES = (N.visible_devices, N.gloo_ifname, N.nccl_ifname, N.nccl_debug, N.ib_gid_index, N.rocm_version, EXTRA)


def check_accel_env(r: Recorder, host: str) -> None:
    """The rules of a Ray node's accelerator env file."""
    _devices(r, host)
    _fabric(r, host)
    _rocm(r, host)
    _extra(r, host)


def _devices(r: Recorder, host: str) -> None:
    devices = r.user_value(host, N.visible_devices)
    if given(devices) and not isinstance(devices, list):
        r.add(host, N.visible_devices, r.raw(host)[N.visible_devices], "must be a list of GPU indices, e.g. [0, 1] "
              "(not a string)")
    if isinstance(devices, list):
        gpus = r.value(host, N.num_gpus)
        if any(not whole(d) or int(d) < 0 for d in devices):
            r.add(host, N.visible_devices, devices, "must list GPU indices (whole numbers 0, 1, ...)")
        elif len(set(devices)) != len(devices):
            r.add(host, N.visible_devices, devices, "lists a GPU twice")
        elif devices and whole(gpus) and int(gpus) > len(devices):
            r.add(host, N.num_gpus, gpus, f"is more than the {len(devices)} GPUs {N.visible_devices} shows")


def _fabric(r: Recorder, host: str) -> None:
    gloo = r.user_value(host, N.gloo_ifname)
    if given(gloo) and (not isinstance(gloo, str) or not IFNAME.match(gloo)):
        r.add(host, N.gloo_ifname, gloo, "must be exactly one interface name (Gloo takes no list and no ^exclusion), "
              "e.g. eth0")
    nccl = r.user_value(host, N.nccl_ifname)
    if given(nccl):
        names = str(nccl).lstrip("^=").split(",")
        if not isinstance(nccl, str) or not all(IFNAME.match(n) for n in names):
            r.add(host, N.nccl_ifname, nccl, "must be interface names or prefixes separated by commas "
                  "(NCCL_SOCKET_IFNAME: eth0, ib0,ib1, ^docker,lo), without spaces")
    debug = r.user_value(host, N.nccl_debug)
    if given(debug) and debug not in ("VERSION", "WARN", "INFO", "TRACE"):
        r.add(host, N.nccl_debug, debug, "must be VERSION, WARN, INFO or TRACE (or null)")
    gid = r.user_value(host, N.ib_gid_index)
    if given(gid) and (not whole(gid) or not 0 <= int(gid) <= 255):
        r.add(host, N.ib_gid_index, gid, "must be a whole number from 0 to 255 (the RoCE GID index, often 3)")


def _rocm(r: Recorder, host: str) -> None:
    raw = r.raw(host).get(N.rocm_version)
    if isinstance(raw, float):
        r.add(host, N.rocm_version, raw, f"is a number, so YAML may have changed it (6.10 reads as 6.1): write it "
              f"quoted, e.g. '{raw}'")
        return
    rocm = r.user_value(host, N.rocm_version)
    if not given(rocm):
        return
    if isinstance(rocm, bool) or not ROCM_VERSION.match(str(rocm)):
        r.add(host, N.rocm_version, rocm, "must be a ROCm version such as '6.2' (or null)")
        return
    vendor = r.value(host, N.accelerator, "cpu")
    if vendor not in (UNKNOWN, "amd"):
        r.add(host, N.rocm_version, rocm, f"is only for AMD GPUs, and this host's {N.accelerator} is {vendor}: "
              f"remove it, or set {N.accelerator} to amd")


def _extra(r: Recorder, host: str) -> None:
    extra = r.user_value(host, EXTRA)
    if not given(extra):
        return
    if not isinstance(extra, dict):
        return  # its type's rule (rlrun/checks/variables.py) names it
    bad = sorted(str(k) for k in extra if not isinstance(k, str) or not ENV_NAME.match(k))
    if bad:
        r.add(host, EXTRA, extra, f"names {', '.join(bad)}: an environment variable's name is letters, digits and "
              "'_', not starting with a digit")
    quoted = sorted(str(k) for k, v in extra.items() if "'" in str(v))
    if quoted:
        r.add(host, EXTRA, extra, f"gives {', '.join(quoted)} a value with a single quote, which the env file "
              "cannot hold (it writes KEY='value')")
    # Known where roles/accel_env's vars are (offline, and in its plays); a problem of its inputs is theirs.
    written, _error = r.view.resolve(host, WRITTEN)
    if isinstance(written, dict):
        clash = sorted(set(extra) & set(written))
        if clash:
            r.add(host, EXTRA, extra, f"sets {', '.join(clash)}, which the role writes from its own variables "
                  "(accel_env__nccl_debug, accel_env__visible_devices, ...): set those instead")
