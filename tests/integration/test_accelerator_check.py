"""A GPU vendor on a host without its GPUs (issue 40): `cluster__accelerator: amd` (or nvidia) on this CPU-only
machine passed `rlrun validate` (it cannot know) and `rlrun check` (which only compared ray_node__num_gpus
with the GPUs found, and the inventory pins 0). Now the preflight's rule (roles/preflight/library/
preflight_node.py accelerator_problems) names it in `rlrun check`'s table, and site.yml asks it on each GPU
node before changing anything there, failing with its one line. This machine has no GPU: /proc/driver/nvidia
and /sys/class/kfd are absent."""

from __future__ import annotations

import glob
import re

import pytest

from tests.conftest import playbook, rlrun, write_inventory

pytestmark = pytest.mark.integration

ADDRESS, PORT = "127.0.74.1", 9740  # nothing else uses them


@pytest.fixture(autouse=True)
def _no_gpu_here():
    if glob.glob("/proc/driver/nvidia/gpus/*") or glob.glob("/sys/class/kfd/kfd/topology/nodes/*"):
        pytest.skip("this machine has GPUs")


@pytest.mark.parametrize("vendor,name", [("amd", "AMD"), ("nvidia", "NVIDIA")])
def test_site_yml_refuses_a_gpu_vendor_without_its_gpus_before_changing_anything(tmp_path, vendor, name):
    inv = write_inventory(tmp_path, f"acc{vendor}", ADDRESS, PORT, group_vars={"cluster__accelerator": vendor})
    result = playbook(inv, "site.yml", timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    line = (f"localhost: cluster__accelerator is {vendor}, but this host has no {name} GPU (")
    assert re.search(rf"Task failed: Module failed: {re.escape(line)}[^\n]*\): set cluster__accelerator to cpu "
                     "for a host without GPUs\n", out), out[-3000:]
    assert re.search(r"localhost +: ok=\d+ +changed=0 +unreachable=0 +failed=1", out), out[-2000:]
    assert not (tmp_path / "state").exists() and not (inv / ".secrets").exists()


def test_rlrun_check_names_a_gpu_vendor_without_its_gpus(tmp_path):
    inv = write_inventory(tmp_path, "accchk", ADDRESS, PORT, group_vars={"cluster__accelerator": "amd"})
    check = rlrun(inv, "check", timeout=600)
    out = " ".join((check.stdout + check.stderr).split())  # rich wraps long lines
    assert check.returncode == 1, out[-3000:]
    assert re.search(r"localhost +gpus +cluster__accelerator is amd, but this host has no AMD GPU \(/sys/class/kfd: "
                     r"no GPU node with SIMD units\): set cluster__accelerator to cpu for a host without GPUs", out), \
        out[-3000:]
