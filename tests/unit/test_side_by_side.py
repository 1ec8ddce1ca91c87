"""bench/gpu/side_by_side.py's parts that need no GPU: each system's environment (the one change made to
OpenRLHF reaches OpenRLHF's processes only)."""

from __future__ import annotations

import importlib.util
import sys

from tests.conftest import PROJECT

sys.path.insert(0, str(PROJECT / "bench" / "gpu"))  # side_by_side imports its neighbour isolated.py
try:
    spec = importlib.util.spec_from_file_location("side_by_side", PROJECT / "bench" / "gpu" / "side_by_side.py")
    sbs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sbs)
finally:
    sys.path.remove(str(PROJECT / "bench" / "gpu"))

BASE = {"PATH": "/usr/bin", "PYTHONPATH": "/tmp/site", "RAY_ADDRESS": "10.0.0.1:6379", "NCCL_NVLS_ENABLE": "0"}


def test_only_openrlhf_runs_with_the_v1_ray_executor():
    orl = sbs.system_env("openrlhf", BASE, ray_tmp="/tmp/r", shim="/shim")
    assert orl["VLLM_USE_RAY_V2_EXECUTOR_BACKEND"] == "0"
    assert orl["PYTHONPATH"] == f"{PROJECT}:/shim:/tmp/site"
    # a shell that set it must not change how rlrun runs vLLM
    rl = sbs.system_env("rlrun", {**BASE, "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0"}, ray_tmp="/tmp/r", shim="/shim")
    assert "VLLM_USE_RAY_V2_EXECUTOR_BACKEND" not in rl
    assert rl["PYTHONPATH"] == f"{PROJECT}:/tmp/site"
    for env in (orl, rl):
        assert "RAY_ADDRESS" not in env and env["RAY_TMPDIR"] == "/tmp/r" and env["NCCL_NVLS_ENABLE"] == "0"
    assert "RAY_ADDRESS" in BASE  # the caller's dict is left as it was
