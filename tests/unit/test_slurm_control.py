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
