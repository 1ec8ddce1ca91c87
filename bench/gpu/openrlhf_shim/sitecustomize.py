"""Run at the start of every Python process of OpenRLHF's side-by-side run (this folder is first on its
PYTHONPATH, which its Ray workers and vLLM's engine processes inherit): the vLLM store-port fix that rlrun's
engines get too, and the one change made to how OpenRLHF runs.

vLLM 0.26's RayExecutorV2 searches its TCPStore port from ``VLLM_DP_MASTER_PORT + 100`` (0 + 100 when unset),
so OpenRLHF's two TP-2 engines, started together on one host, both took port 100 and the second died with
EADDRINUSE (nvidia-h200-x4, 2026-11-27). The V1 executor tried instead (``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``)
failed later, in Ray's compiled graph: ``CUDA_VISIBLE_DEVICES set incorrectly. expected to include 3``
(vLLM issue 25113; 2026-11-27 22:49). So each process starts the search from a port the OS gives it
(:func:`trainer.rollout.vllm_compat.give_store_port`, as rlrun's engines do through ``pin_ray_store_port``).
A value the caller set is kept; one a parent set this way is replaced (Ray's workers inherit the driver's).

This file shadows the system's ``sitecustomize`` (on Ubuntu: apport's exception hook) in those processes only.
"""

import os

try:
    from trainer.rollout.vllm_compat import STORE_PORT_MARK, give_store_port
except ImportError:  # the project is not on the path: nothing to do
    pass
else:
    if not os.environ.get("VLLM_DP_MASTER_PORT") or os.environ.get(STORE_PORT_MARK):
        give_store_port(os.environ)
