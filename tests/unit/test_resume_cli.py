"""`rlrun submit --resume PATH` and `rlrun slurm render --requeue` without a cluster: the command a resumed job
runs, the checkpoint looked at before submitting, the one-line refusals. `--resume JOB` (the Jobs API) runs
against the session's cluster in tests/integration/test_presets_cluster.py, a requeued Slurm job in
tests/integration/test_slurm.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlrun import resume
from rlrun.cli import main
from rlrun.errors import RlrunError
from rlrun.slurm.script import JobOptions, render
from rlrun.slurm.spec import evaluate, ph
from tests.conftest import PROJECT
from tests.unit.test_checkpoint_files import make

TRAINER = ["python", "-m", "trainer.train_ppo_ray", "--pretrain", "/m", "--prompt_data", "/d.jsonl", "--reward_fn",
           "pkg.mod:fn", "--actor_num_nodes", "1", "--actor_num_gpus_per_node", "1", "--rollout_batch_size", "8",
           "--train_batch_size", "8", "--advantage_estimator", "reinforce", "--save_steps", "5"]


def _entrypoint(out: str) -> list[str]:
    return shlex.split(out.split("entrypoint: ", 1)[1].splitlines()[0])


def test_a_preset_resumes_from_the_newest_complete_checkpoint_of_a_path(tmp_path, capsys):
    make(tmp_path, "global_step2", 2)
    make(tmp_path, "global_step4", 4)
    make(tmp_path, "global_step6", 6, drop="zero_pp_rank_1_mp_rank_00_optim_states.pt")
    assert main(["submit", "--dry-run", "--no-check", "--resume", str(tmp_path), "--preset", "tiny-rloo"]) == 0
    out, err = capsys.readouterr()
    argv = _entrypoint(out)
    assert "--load_checkpoint" in argv and argv[argv.index("--ckpt_path") + 1] == str(tmp_path)
    assert "--set load_checkpoint: False (preset) -> True" in err
    assert (f"resuming from global_step4 (step 4) in {tmp_path} (looked at here); checkpoint {tmp_path}/global_step6 "
            "skipped: policy/zero_pp_rank_1_mp_rank_00_optim_states.pt is missing (saved by 2 ranks)") in err


def test_nothing_complete_is_one_line_and_nothing_is_submitted(tmp_path, capsys):
    make(tmp_path, "global_step2", 2, marker=False)
    assert main(["submit", "--dry-run", "--no-check", "--resume", str(tmp_path), "--preset", "tiny-rloo"]) == 1
    out, err = capsys.readouterr()
    assert "entrypoint:" not in out
    lines = [line for line in err.splitlines() if line.startswith("error:") or "nothing to resume" in line]
    assert lines == [f"error: nothing to resume: no complete checkpoint in {tmp_path} (here; directory {tmp_path}) "
                     f"(checkpoint {tmp_path}/global_step2 skipped: no completion marker (COMPLETE): torn, or not "
                     "written by this trainer)"], err


def test_a_trainer_command_gets_load_checkpoint_and_the_path_once(tmp_path, capsys):
    make(tmp_path, "global_step5", 5)
    command = [*TRAINER, "--ckpt_path", "/old/ckpt", "--load_checkpoint"]
    assert main(["submit", "--dry-run", "--no-check", "--no-working-dir", "--resume", str(tmp_path), "--",
                 *command]) == 0
    argv = _entrypoint(capsys.readouterr().out)
    assert argv == [*TRAINER, "--load_checkpoint", "--ckpt_path", str(tmp_path)]


@pytest.mark.parametrize(("args", "message"), [
    ([], "--resume {p} needs the job to continue: give --preset NAME or the trainer command after `--`"),
    (["--", "python", "train.py"], "--resume: python train.py... is not the trainer"),
    (["--preset", "tiny-rloo", "--set", "ckpt_path=/elsewhere"],
     "--set ckpt_path=/elsewhere and --resume (directory {p}: --ckpt_path {p}) name two checkpoint directories"),
    (["--preset", "tiny-rloo", "--set", "use_ds_universal_ckpt=true", "--set", "ckpt_path={p}"], None),
])
def test_what_cannot_resume_says_so_in_one_line(tmp_path, capsys, args, message):
    make(tmp_path, "global_step1", 1)
    args = [a.replace("{p}", str(tmp_path)) for a in args]
    code = main(["submit", "--dry-run", "--no-check", "--no-working-dir", "--resume", str(tmp_path), *args])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 1
    assert f"error: {message.replace('{p}', str(tmp_path))}" in err, err


def test_a_path_this_machine_does_not_see_is_looked_at_on_the_head_unless_no_check(capsys):
    assert main(["submit", "--dry-run", "--no-check", "--resume", "/nonexistent/ckpt", "--preset", "tiny-rloo"]) == 0
    assert ("/nonexistent/ckpt: not looked at (not on this machine; --no-check): the trainer starts fresh if no "
            "complete checkpoint is there") in capsys.readouterr().err
    assert resume.is_path("./ckpt") and resume.is_path("~/c") and resume.is_path("a/b")
    assert not resume.is_path("rlrun-20261126-101010-abcdef") and not resume.is_path("raysubmit_XYZ")


# --- Slurm: a requeued job resumes by itself ------------------------------------------------------------------


def test_requeue_plans_a_stable_checkpoint_dir_and_the_resume_flag(tmp_path):
    job = ph("JOB_CKPT")
    relative = resume.requeue_plan({"ckpt_path": "./ckpts/x", "save_steps": 10}, [], tmp_path, job)
    assert (relative.ckpt_args, relative.resume_args, relative.ckpt_path) == (
        ["--set", f"ckpt_path={job}"], ["--set", "load_checkpoint=true"], job)
    workdir = resume.requeue_plan({"ckpt_path": "{workdir}/c", "save_steps": 10}, [], tmp_path, job)
    assert (workdir.ckpt_args, workdir.ckpt_path) == ([], f"{tmp_path}/c")  # absolute: the job's own
    command = resume.requeue_plan(None, TRAINER, tmp_path, job)  # the default --ckpt_path is relative
    assert (command.ckpt_args, command.resume_args) == (["--ckpt_path", job], ["--load_checkpoint"])
    assert resume.requeue_plan(None, ["python", "train.py"], tmp_path, job) is None
    with pytest.raises(RlrunError, match=r"--requeue: the job saves no checkpoints \(--save_steps -1\), so a requeued "
                                         r"job would start over: give --set save_steps=N"):
        resume.requeue_plan({"ckpt_path": "/c"}, [], tmp_path, job)


def test_the_requeue_script_resumes_a_requeued_run(tmp_path):
    spec = evaluate(PROJECT / "inventory")
    plan = resume.requeue_plan({"ckpt_path": "./c", "save_steps": 2}, [], tmp_path, ph("JOB_CKPT"))
    text = render(spec, JobOptions(nodes=1, submit_args=["--preset", "tiny-rloo"], job_root=Path("/shared/jobs"),
                                   sbatch_args=["--requeue"], ckpt_args=plan.ckpt_args, resume_args=plan.resume_args,
                                   ckpt_shown=plan.ckpt_path))
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in text
    assert text.count("#SBATCH --requeue") == 1
    assert 'JOB_CKPT="$JOB_ROOT/$SLURM_JOB_ID.ckpt"' in text
    assert 'args+=(--set "ckpt_path=${JOB_CKPT}")' in text
    assert re.search(r'if \[ "\$\{SLURM_RESTART_COUNT:-0\}" -gt 0 \]; then\n\s+args\+=\(--set load_checkpoint=true\)',
                     text)
    plain = render(spec, JobOptions(nodes=1, submit_args=["--preset", "tiny-rloo"]))
    assert "--requeue" not in plain and "JOB_CKPT" not in plain and "load_checkpoint" not in plain


def test_cli_requeue_refuses_a_job_without_checkpoints_and_renders_one_with(tmp_path, capsys):
    base = ["-i", str(PROJECT / "inventory"), "slurm", "render", "--requeue", "--preset", "tiny-rloo"]
    assert main(base) == 1
    assert "--requeue: the job saves no checkpoints (--save_steps -1)" in capsys.readouterr().err
    out = tmp_path / "job.sbatch"
    assert main([*base, "--set", "save_steps=4", "--working-dir", str(tmp_path), "-o", str(out)]) == 0
    text = out.read_text()
    # tiny-rloo's --ckpt_path is {workdir}/build/tiny/rloo/ckpt: absolute, so every run finds it as it is
    assert "JOB_CKPT" not in text and "args+=(--set load_checkpoint=true)" in text
    assert f"complete checkpoint in\" {tmp_path}/build/tiny/rloo/ckpt" in text


def test_a_port_left_in_time_wait_by_the_earlier_run_is_free_a_listening_one_is_not():
    """What a requeued job meets on its nodes: its first run's connections in TIME_WAIT on its ports."""
    import socket

    from rlrun.slurm.runtime import port_free

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    with pytest.raises(RlrunError, match=f"port 127.0.0.1:{port} of this job's block is taken"):
        port_free("127.0.0.1", port)
    accepted.close()  # the server's side closes first: its end of the connection stays in TIME_WAIT
    client.close()
    server.close()
    with socket.socket() as plain, pytest.raises(OSError):  # what the check did before: refused
        plain.bind(("127.0.0.1", port))
    port_free("127.0.0.1", port)
