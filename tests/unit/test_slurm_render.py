"""`rlrun slurm render`: the sbatch script from the inventory's node-start spec; bad options named.

The script's bash is checked by shellcheck and run for real in tests/integration/test_slurm.py; the
spec's agreement with ansible-playbook's own evaluation of the roles is checked there too."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from rlrun.cli import main
from rlrun.errors import RlrunError
from rlrun.slurm.script import JobOptions, render
from rlrun.slurm.spec import evaluate, substitute
from tests.conftest import PROJECT, write_inventory

SEED_AMD = {  # the seed runbook's ROCm/RCCL settings (seeds/001), as accel_env variables
    "cluster__accelerator": "amd", "accel_env__rocm_version": "6.2", "accel_env__rccl_msccl_enable": False,
    "accel_env__hsa_no_scratch_reclaim": True, "accel_env__nccl_ib_hca": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
    "accel_env__nccl_ib_gid_index": 3, "accel_env__nccl_debug": "TRACE", "ray_node__num_gpus": 8,
}


def _render(inv: Path, **kw) -> str:
    opts = {"nodes": 3, "submit_args": ["--preset", "tiny-rloo"], "job_root": Path("/shared/jobs"), **kw}
    return render(evaluate(inv), JobOptions(**opts))


def test_the_script_starts_the_roles_ray_command_with_the_jobs_values():
    text = _render(PROJECT / "inventory")
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n" in text
    assert "#SBATCH --output=/shared/jobs/%j.out" in text
    assert "@@rlrun:" not in text
    head = re.search(r"RAY_CMD=\((.*--head.*)\)", text).group(1)
    for flag in ('--port "${PORT_GCS}"', '--node-ip-address "${NODE_IP}"', '--temp-dir "${TEMP_DIR}"',
                 '--min-worker-port "${PORT_WORKER_MIN}"', '--num-cpus "${NUM_CPUS}"', "--block"):
        assert flag in head, flag
    worker = re.findall(r"RAY_CMD=\((.*)\)", text)[1]
    assert '--address "${HEAD_IP}:${PORT_GCS}"' in worker and "--head" not in worker
    assert "SUBMIT_ARGS=(--preset tiny-rloo)" in text
    assert "RAY_AUTH_MODE='token'" in text and "RAY_AUTH_TOKEN_PATH='${STATE_DIR}/auth_token'" in text
    # Never Ray's host-wide stop command (other jobs' Ray on shared nodes): no line runs it.
    assert not [line for line in text.splitlines() if re.search(r"^\s*[^#\s].*\bray\s+stop\b", line)]


def test_the_amd_script_sets_the_accel_env_roles_rocm_and_rccl_variables(tmp_path):
    inv = write_inventory(tmp_path, "amdjob", "10.1.0.1", 21000, group_vars=SEED_AMD)
    spec = evaluate(inv)
    assert spec.accel_vars == {"GLOO_SOCKET_IFNAME": "lo", "HSA_NO_SCRATCH_RECLAIM": "1", "RCCL_MSCCL_ENABLE": "0",
                               "NCCL_IB_HCA": "mlx5_0,mlx5_1,mlx5_2,mlx5_3", "NCCL_IB_GID_INDEX": "3",
                               "NCCL_DEBUG": "TRACE"}
    text = render(spec, JobOptions(nodes=2, gpus_per_node=8, submit_args=["--", "true"]))
    body = text.split("<<RLRUN_ACCEL_ENV\n", 1)[1].split("RLRUN_ACCEL_ENV\n", 1)[0]
    for key, value in spec.accel_vars.items():
        assert f"{key}='{value}'\n" in body
    assert "#SBATCH --gpus-per-node=8" in text and '--num-gpus 8' in text
    # Slurm binds the GPUs: no device list from the inventory, ROCR_VISIBLE_DEVICES mapped for ROCm.
    assert "HIP_VISIBLE_DEVICES=" not in body and "ROCR_VISIBLE_DEVICES" in text


def test_the_reward_service_gets_the_jobs_own_token_and_tls_is_refused(tmp_path):
    spec = evaluate(PROJECT / "inventory")
    argv = spec.reward_argv
    assert argv[argv.index("--token-file") + 1] == spec.reward_token_file != spec.token_file
    assert f"RLRUN_REWARD_TOKEN_FILE='{spec.reward_token_file}'" in spec.ray_env
    inv = write_inventory(tmp_path, "tlsjob", "10.1.0.1", 21000, group_vars={"cluster__reward_tls": True})
    with pytest.raises(RlrunError, match="cluster__reward_tls = true, but a Slurm job has no CA"):
        evaluate(inv)


def test_each_node_builds_the_inventorys_deepspeed_ops_into_a_cache_kept_from_job_to_job(tmp_path):
    """ray_node__deepspeed_ops, which the role builds after a node's start, is built by each node step before its
    Ray starts, into torch's extension cache under the node's per-user dir (HOME is the job's state dir, removed
    with the job: a cache there would compile cpu_adam once a job)."""
    assert "DEEPSPEED_OPS=()\n" in _render(PROJECT / "inventory")  # none asked: nothing built
    inv = write_inventory(tmp_path, "opsjob", "10.1.0.1", 21000, group_vars={
        "ray_node__deepspeed_ops": ["cpu_adam", "cpu_adam"]})
    assert evaluate(inv).deepspeed_ops == ["cpu_adam"]
    text = _render(inv)
    assert "DEEPSPEED_OPS=(cpu_adam)\n" in text
    assert 'EXT_DIR="$parent/torch_extensions"' in text  # beside the job dirs, not in them
    job_env = text.split("<<RLRUN_JOB_ENV\n", 1)[1].split("RLRUN_JOB_ENV\n", 1)[0]
    assert "TORCH_EXTENSIONS_DIR='${EXT_DIR}'" in job_env
    node_main = text.split("node_main() {", 1)[1].split("\n}\n", 1)[0]
    build = node_main.index('run_in_session "$VENV/bin/python" -m trainer.deepspeed_ops "${DEEPSPEED_OPS[@]}"')
    assert build < node_main.index('run_in_session "${RAY_CMD[@]}"')


@pytest.mark.parametrize("ops, why", [
    ("cpu_adam", "ray_node__deepspeed_ops = 'cpu_adam': must be a list"),  # the contract's type check
    (["cpu_adam; touch /tmp/x"], r"ray_node__deepspeed_ops = \['cpu_adam; touch /tmp/x'\]: must be a list of "
                                 "DeepSpeed op names such as \\[cpu_adam\\]"),
    (["CPU-Adam"], "must be a list of DeepSpeed op names"), ([1], "must be a list of DeepSpeed op names")])
def test_deepspeed_ops_that_are_not_a_list_of_op_names_are_refused(tmp_path, ops, why):
    """They would go into the script's shell words: refused by the contract's rules (rlrun/checks, as `rlrun
    validate` and site.yml refuse them), naming the value."""
    inv = write_inventory(tmp_path, "badops", "10.1.0.1", 21000, group_vars={"ray_node__deepspeed_ops": ops})
    with pytest.raises(RlrunError, match=why):
        evaluate(inv)


def test_placeholders_substitute_back_to_a_hosts_values():
    spec = evaluate(PROJECT / "inventory")
    argv = [substitute(a, {"NODE_IP": "10.0.0.5", "HEAD_IP": "10.0.0.1", "PORT_GCS": "17000", "TEMP_DIR": "/t",
                           "SPILL_DIR": "/s", "NUM_CPUS": "4", **{k: "1" for k in (
                               "PORT_NODE_MANAGER", "PORT_OBJECT_MANAGER", "PORT_DASHBOARD_AGENT_LISTEN",
                               "PORT_DASHBOARD_AGENT_GRPC", "PORT_RUNTIME_ENV_AGENT", "PORT_METRICS_EXPORT",
                               "PORT_WORKER_MIN", "PORT_WORKER_MAX")}})
            for a in spec.worker_argv]
    assert argv[argv.index("--address") + 1] == "10.0.0.1:17000"
    assert argv[argv.index("--num-cpus") + 1] == "4"


def test_a_node_step_checks_the_ports_its_role_holds():
    """The script names no port list of its own: each node step asks for the fixed ports of the job's block its
    role holds (`runtime free --of`, from the contract's layout)."""
    script = _render(PROJECT / "inventory")
    assert "runtime free --address \"$NODE_IP\" --of reward" in script and "of+=(--of head)" in script
    assert "PORT_AGENT_HTTP" not in script and "PORT_CLIENT\"" not in script


def test_every_bad_option_is_named_at_once():
    with pytest.raises(RlrunError) as exc:
        _render(PROJECT / "inventory", nodes=0, time="tomorrow", reward_node=5, node_tmp="/very/long/node/local/tmp/dir",
                mem="lots", sbatch_args=["qos=high"], address_from="eth0")
    text = str(exc.value)
    for part in ("--nodes 0: expected 1 or more", "--time 'tomorrow'", "--reward-node 5: expected a node index",
                 "--node-tmp '/very/long/node/local/tmp/dir' is 29 characters", "--mem 'lots'",
                 "--sbatch-arg 'qos=high'", "--address-from 'eth0'"):
        assert part in text, part


def test_batch_needs_a_job_and_a_long_lived_cluster_runs_none(tmp_path):
    with pytest.raises(RlrunError, match="nothing to run: give --preset NAME or a command"):
        _render(PROJECT / "inventory", submit_args=[])
    with pytest.raises(RlrunError, match="--cluster-dir starts a long-lived cluster and runs no job"):
        _render(PROJECT / "inventory", cluster_dir=tmp_path)
    text = _render(PROJECT / "inventory", submit_args=[], cluster_dir=tmp_path / "c")
    assert f"CLUSTER_DIR={tmp_path / 'c'}" in text and 'RLRUN_MODE="cluster"' in text


def test_cli_render_refuses_an_unknown_preset_and_writes_a_script(tmp_path, capsys):
    assert main(["-i", str(PROJECT / "inventory"), "slurm", "render", "--preset", "no-such-preset"]) == 1
    assert "no-such-preset" in capsys.readouterr().err
    out = tmp_path / "job.sbatch"
    assert main(["-i", str(PROJECT / "inventory"), "slurm", "render", "--nodes", "2", "--time", "1:00:00",
                 "--partition", "gpu", "-o", str(out), "--", "python", "-c", "print(42)"]) == 0
    text = out.read_text()
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --time=1:00:00" in text
    assert "SUBMIT_ARGS=(-- python -c 'print(42)')" in text


def _step_dirs(script: Path, node_tmp: Path, job_id: str) -> subprocess.CompletedProcess:
    """The script's step_dirs on node n1 of job ``job_id`` under ``node_tmp`` (the script sourced, not run)."""
    env = {**os.environ, "RLRUN_SLURM_SOURCE_ONLY": "1", "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": job_id,
           "SLURM_RESTART_COUNT": "0"}
    return subprocess.run(["bash", "-c", 'source "$1"; NODE_TMP="$2"; step_dirs ""; echo "$STATE_DIR"', "_",
                           str(script), str(node_tmp)], capture_output=True, text=True, env=env, timeout=60)


def test_a_node_dir_left_by_an_earlier_job_of_the_same_id_is_named_and_kept():
    """Job ids restart when slurmctld's state is reset: a first run that finds its node dir left by an earlier job of
    its id stops with one line naming the dir and what to do, and removes nothing (seen in CI: a killed run's
    /tmp/rlrun-root/s1-n1 made the next lab's job 1 fail with "mkdir: ... File exists")."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="rls-", dir="/tmp"))  # short: the script caps the temp dir's length
    try:
        script = root / "job.sbatch"
        script.write_text(_render(PROJECT / "inventory"))
        fresh = _step_dirs(script, root / "nt", "8")
        assert fresh.returncode == 0, fresh.stderr
        state = Path(fresh.stdout.split()[-1])
        assert state.parent.name == "s8-n1" and not state.parent.exists()  # made, then removed as the step ended
        left = state.parent.parent / "s7-n1"
        (left / "state").mkdir(parents=True)
        (left / "state" / "keep").write_text("an earlier job's file")
        proc = _step_dirs(script, root / "nt", "7")
        assert proc.returncode == 1
        line = proc.stderr.strip().splitlines()[-1]
        assert f"{left} exists on n1: left by an earlier job 7" in line and "remove it and submit again" in line, line
        assert (left / "state" / "keep").read_text() == "an earlier job's file"
    finally:
        shutil.rmtree(root)
