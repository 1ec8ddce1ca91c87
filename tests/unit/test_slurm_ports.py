"""The per-job port block of `rlrun slurm`: below the ephemeral range, clear of the deny-list, and
different for jobs that run at the same time."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrun.slurm import ports as P

ROOT = Path(__file__).resolve().parents[2]


def test_every_default_block_is_below_the_ephemeral_range_and_clear_of_the_deny_list():
    bases = P.block_bases(ephemeral=32768)
    assert len(bases) >= 40
    for base in bases:
        block = P.PortBlock(base, P.DEFAULT_BLOCK)
        used = set(block.ports().values()) | set(range(block.worker_min, block.worker_max + 1))
        assert min(used) >= P.DEFAULT_WINDOW[0] and max(used) < 30000
        for lo, hi in P.DEFAULT_DENY_RANGES:
            assert not used & set(range(lo, hi + 1)), (base, lo, hi)
    # torch.distributed's MASTER_PORT 29500 and torchrun's 29400 are in no block.
    assert all(not (b <= 29500 <= b + P.DEFAULT_BLOCK - 1) for b in bases)


def test_jobs_running_together_get_disjoint_blocks_and_the_block_repeats_after_a_full_turn():
    n = len(P.block_bases(ephemeral=32768))
    blocks = [P.block_for_job(j, ephemeral=32768) for j in range(1000, 1000 + n)]
    spans = sorted((b.base, b.worker_max) for b in blocks)
    assert all(prev_hi < lo for (_, prev_hi), (lo, _) in zip(spans, spans[1:], strict=False))
    assert P.block_for_job(1000 + n, ephemeral=32768) == blocks[0]


def test_the_layout_keeps_the_fixed_ports_before_the_worker_range():
    block = P.block_for_job(7, ephemeral=32768)
    ports = block.ports()
    # the head's five, every node's six, then the reward service's (the contract's order)
    assert ports["PORT_GCS"] == block.base and ports["PORT_REWARD"] == block.base + 11
    assert ports["PORT_WORKER_MIN"] == block.base + 16 and ports["PORT_WORKER_MAX"] == block.base + 255
    assert len(set(ports.values())) == len(ports)


def test_the_block_holds_every_fixed_port_of_the_cluster_contract():
    """What a Slurm job's block holds is the contract's (roles/cluster/vars/main.yml), not a list of its own: the
    head's two Prometheus ports, which the restated list had left out, have their place; the worker range's fewest
    ports are the contract's."""
    import yaml

    from rlrun.slurm.spec import PORT_VARS

    contract = yaml.safe_load((ROOT / "roles" / "cluster" / "vars" / "main.yml").read_text())
    fixed = [*contract["cluster__ray_head_ports"], *contract["cluster__ray_node_ports"], "cluster__reward_port"]
    worker = contract["cluster__port_range_specs"]["worker"]
    assert list(PORT_VARS) == [*fixed, *worker["vars"]]
    assert {"cluster__ray_dashboard_metrics_port", "cluster__ray_autoscaler_metrics_port"} <= set(PORT_VARS)
    assert set(PORT_VARS.values()) == set(P.block_for_job(3, ephemeral=32768).ports())
    assert P.layout().smallest == P.FIXED + worker["min_span"]


def test_a_low_ephemeral_range_shrinks_the_window():
    bases = P.block_bases(window=(16384, 29999), ephemeral=20000)
    assert bases and max(bases) + P.DEFAULT_BLOCK - 1 < 20000


def test_a_denied_port_moves_the_next_block_past_it():
    bases = P.block_bases(window=(20000, 21000), size=200, deny=[(20150, 20150)], ephemeral=60000)
    assert bases == [20151, 20351, 20551, 20751]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: P.parse_ranges("29400-x"), "--deny-ports '29400-x': expected PORT or LOW-HIGH"),
    (lambda: P.parse_ranges("70000"), "expected ports 1-65535"),
    (lambda: P.parse_window("20000"), "expected one range LOW-HIGH"),
    (lambda: P.block_bases(size=50), "--port-block 50: at least 116 ports"),
    (lambda: P.block_bases(window=(80, 5000)), "ports below 1024 need root"),
    (lambda: P.block_bases(window=(40000, 50000), ephemeral=32768), "no block of 256 ports fits the window"),
    (lambda: P.block_for_job(-1), "job id -1: expected a non-negative Slurm job id"),
])
def test_bad_port_settings_are_named(call, message):
    with pytest.raises(P.PortError, match=None) as exc:
        call()
    assert message in str(exc.value)
