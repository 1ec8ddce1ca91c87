"""trainer.checkpoint on files alone: which checkpoint a resume takes, what it skips and why, what pruning
keeps, and the atomic `latest`. The checkpoints are written here the way `save` lays them out (DeepSpeed's
file names per rank, the marker, the client state); the DeepSpeed and Ray side runs in
tests/integration/test_train_loop.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import checkpoint as ck

REPO = Path(__file__).resolve().parents[2]


def _zero3_files(world: int) -> dict[str, int]:
    files = {}
    for r in range(world):
        files[f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"] = 100 + r
        files[f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"] = 1000 + r
    return files


def make(root: Path, tag: str, step: int, *, world: int = 2, groups=("policy",), marker: bool = True,
         drop: str | None = None, cut: str | None = None, client: bool = True) -> Path:
    """A checkpoint as trainer.checkpoint.save leaves it; drop/cut: one file missing / shorter than listed."""
    path = root / tag
    listed = {}
    for group in groups:
        files = _zero3_files(world)
        (path / group).mkdir(parents=True)
        for name, size in files.items():
            if name == drop:
                continue
            (path / group / name).write_bytes(b"x" * (size - 1 if name == cut else size))
        listed[group] = {"world_size": world, "files": files}
    if client:
        (path / ck.CLIENT_STATE).write_text(json.dumps({"step": step}))
    if marker:
        (path / ck.MARKER).write_text(json.dumps({"version": 1, "tag": tag, "step": step, "groups": listed}))
    return path


def test_the_newest_complete_checkpoint_is_taken(tmp_path):
    make(tmp_path, "global_step2", 2)
    make(tmp_path, "global_step4", 4)
    (tmp_path / "latest").write_text("global_step4")
    lines = []
    found = ck.newest(tmp_path, lines.append)
    assert found.tag == "global_step4" and found.step == 4 and found.complete
    assert lines == []


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"marker": False}, "no completion marker (COMPLETE): torn, or not written by this trainer"),
    ({"drop": "zero_pp_rank_1_mp_rank_00_optim_states.pt"},
     "policy/zero_pp_rank_1_mp_rank_00_optim_states.pt is missing (saved by 2 ranks)"),
    ({"cut": "zero_pp_rank_0_mp_rank_00_model_states.pt"},
     "policy/zero_pp_rank_0_mp_rank_00_model_states.pt has 99 bytes, the marker says 100"),
    ({"client": False}, "client_state.json is missing"),
])
def test_a_torn_checkpoint_is_skipped_with_a_line_naming_it(tmp_path, kwargs, why):
    make(tmp_path, "global_step2", 2)
    make(tmp_path, "global_step4", 4, **kwargs)
    (tmp_path / "latest").write_text("global_step4")  # even when latest names it
    lines = []
    assert ck.newest(tmp_path, lines.append).tag == "global_step2"
    assert lines == [f"checkpoint {tmp_path / 'global_step4'} skipped: {why}"]


def test_an_unfinished_write_is_skipped_and_named(tmp_path):
    make(tmp_path, "global_step2", 2)
    (tmp_path / "latest").write_text("global_step2")
    tmp = make(tmp_path, ".tmp-global_step4-0a1b2c3d", 4, marker=False, client=False)
    lines = []
    assert ck.newest(tmp_path, lines.append).tag == "global_step2"
    assert lines == [f"checkpoint {tmp} skipped: an unfinished write (the job ended while writing it)"]


def test_a_checkpoint_renamed_into_place_before_latest_moved_is_taken(tmp_path):
    """The job ended between the rename and `latest`: the newer checkpoint is complete, so it is the one."""
    make(tmp_path, "global_step2", 2)
    make(tmp_path, "global_step4", 4)
    (tmp_path / "latest").write_text("global_step2")
    assert ck.newest(tmp_path, None).tag == "global_step4"


def test_nothing_complete_gives_none(tmp_path):
    assert ck.newest(tmp_path / "absent", None) is None
    make(tmp_path, "global_step2", 2, marker=False)
    assert ck.newest(tmp_path, None) is None


def test_a_named_tag_is_no_resume_point_unless_latest_names_it(tmp_path):
    make(tmp_path, "global_step2", 2)
    make(tmp_path, "best", 6)
    assert ck.newest(tmp_path, None).tag == "global_step2"
    (tmp_path / "latest").write_text("best")
    assert ck.newest(tmp_path, None).tag == "best"


def test_the_ranks_that_saved_a_group_come_from_its_files(tmp_path):
    found = ck.inspect(make(tmp_path, "global_step2", 2, world=4, groups=("policy", "critic")))
    assert found.saved_world_size("policy") == 4 and found.saved_world_size("critic") == 4
    (tmp_path / "global_step2" / "policy" / "bf16_zero_pp_rank_4_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert found.saved_world_size("policy") == 5
    stage0 = tmp_path / "s0" / "policy"
    stage0.mkdir(parents=True)
    (stage0 / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert ck.Found(tmp_path / "s0", 1).saved_world_size("policy") is None  # loads on any number of ranks


def test_pruning_keeps_the_newest_never_latest_nor_a_named_tag(tmp_path):
    for step in (2, 4, 6, 8):
        make(tmp_path, f"global_step{step}", step)
    make(tmp_path, "global_step10", 10, marker=False)  # torn and newer: kept (a resume names it)
    make(tmp_path, "global_step1", 1, marker=False)  # torn and older: garbage
    make(tmp_path, "best", 3)
    (tmp_path / "latest").write_text("global_step4")  # e.g. the newest was renamed in, latest not yet moved
    removed = ck.prune(tmp_path, 1, lambda _: None)
    assert sorted(p.name for p in removed) == ["global_step1", "global_step2", "global_step6"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["best", "global_step10", "global_step4", "global_step8", "latest"]


def test_latest_is_replaced_atomically_and_leaves_no_temporary_file(tmp_path):
    ck.replace_file(tmp_path / "latest", "global_step2")
    ck.replace_file(tmp_path / "latest", "global_step4")
    assert (tmp_path / "latest").read_text() == "global_step4"
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]
    assert ck.read_latest(tmp_path) == "global_step4"
    (tmp_path / "latest").write_text("../elsewhere")
    assert ck.read_latest(tmp_path) is None


def test_the_command_line_lists_the_checkpoints_and_the_one_a_resume_takes(tmp_path):
    make(tmp_path, "global_step2", 2)
    make(tmp_path, "global_step4", 4, drop="zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (tmp_path / "latest").write_text("global_step2")
    run = subprocess.run([sys.executable, "-m", "trainer.checkpoint", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "global_step2 (latest): step 2, policy x2; complete",
        "global_step4: step 4, policy x2; skipped on resume: policy/zero_pp_rank_0_mp_rank_00_optim_states.pt is "
        "missing (saved by 2 ranks)",
        "resume takes: global_step2 (step 2)"]
    as_json = subprocess.run([sys.executable, "-m", "trainer.checkpoint", "--json", str(tmp_path / "none")], cwd=REPO,
                             capture_output=True, text=True)
    assert json.loads(as_json.stdout)["newest"] is None


def test_a_tag_that_is_not_a_plain_name_is_refused(tmp_path):
    for tag in ("latest", "../x", ".hidden", ""):
        with pytest.raises(ck.CheckpointError, match="expected a plain directory name"):
            ck.save(tmp_path, tag, {}, {})
