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
