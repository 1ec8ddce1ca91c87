"""`rlrun slurm status|logs|cancel` without a Slurm: the job root's files and the errors that name them."""

from __future__ import annotations

import json

import pytest

from rlrun.errors import RlrunError
from rlrun.slurm import control


def test_job_ids_and_records_come_from_the_job_root(tmp_path):
    (tmp_path / "12.out").write_text("x")
    (tmp_path / "3.json").write_text(json.dumps({"state": "running", "head": "n1"}))
    (tmp_path / "rlrun-c-1.sbatch").write_text("#!/bin/bash\n")
    assert control.known_jobs(tmp_path) == ["3", "12"]
    assert control.record(tmp_path, "3") == {"state": "running", "head": "n1"}
    assert control.record(tmp_path, "12") == {}
    assert control.known_jobs(tmp_path / "missing") == []


def test_a_broken_record_and_a_bad_job_id_are_named(tmp_path):
    (tmp_path / "4.json").write_text("{not json")
    with pytest.raises(RlrunError, match="cannot read the record .*4.json"):
        control.record(tmp_path, "4")
    with pytest.raises(RlrunError, match="job id '4; rm -rf /': expected a Slurm job id"):
        control.check_job_id("4; rm -rf /")


def test_scripts_are_kept_private_next_to_the_output(tmp_path):
    path = control.write_script(tmp_path / "jobs", "#!/bin/bash\n", "rlrun-c")
    assert path.parent == tmp_path / "jobs" and path.suffix == ".sbatch"
    assert path.stat().st_mode & 0o077 == 0 and (tmp_path / "jobs").stat().st_mode & 0o077 == 0


def test_without_slurm_commands_the_error_says_what_is_needed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RlrunError, match="`squeue` not found: `rlrun slurm status` runs on a host with Slurm"):
        control.slurm_state("5")


def test_the_job_inventory_names_both_token_stores_and_rlrun_reads_them(tmp_path, monkeypatch):
    """The sbatch script's `runtime inventory` writes the job's inventory; rlrun reads the Ray and the
    reward token from the stores it names (not from a file name it would have to guess), even when the
    tokens were handed in under other names."""
    from rlrun.inventory import load_cluster
    from rlrun.slurm import runtime
    from rlrun.slurm.spec import PORT_VARS

    for i, name in enumerate(PORT_VARS.values()):
        monkeypatch.setenv(name, str(23000 + i))
    (tmp_path / "t1").write_text("ab" * 32)
    (tmp_path / "t2").write_text("cd" * 32)
    inv = tmp_path / "inv"
    assert runtime.main(["inventory", "--dir", str(inv), "--name", "sj", "--head", "n1=10.9.0.1",
                         "--reward", "n1=10.9.0.1", "--token-file", str(tmp_path / "t1"),
                         "--reward-token-file", str(tmp_path / "t2"), "--job-id", "77"]) == 0
    cluster = load_cluster(inv)
    assert (cluster.token, cluster.reward_token) == ("ab" * 32, "cd" * 32)
    assert cluster.reward_token_store.parent == cluster.token_store.parent == inv / ".secrets"


def test_a_node_step_checks_the_fixed_ports_its_role_holds(monkeypatch):
    """`runtime free --of head --of node` checks every fixed port of the job's block a head holds (read from the
    contract's layout, the Prometheus ports of the head included), and names a taken one."""
    import socket

    from rlrun.slurm import ports as P
    from rlrun.slurm import runtime

    block = P.block_for_job(11, ephemeral=32768).ports()
    for name, port in block.items():
        monkeypatch.setenv(name, str(port))
    held = P.layout().shell_ports("head") + P.layout().shell_ports("node")
    assert {"PORT_GCS", "PORT_DASHBOARD_METRICS", "PORT_AUTOSCALER_METRICS", "PORT_NODE_MANAGER"} <= set(held)
    assert "PORT_REWARD" not in held and P.layout().shell_ports("reward") == ["PORT_REWARD"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", block["PORT_AUTOSCALER_METRICS"]))
        s.listen()
        assert runtime.main(["free", "--address", "127.0.0.1", "--of", "node"]) == 0
        assert runtime.main(["free", "--address", "127.0.0.1", "--of", "head", "--of", "node"]) == 1
