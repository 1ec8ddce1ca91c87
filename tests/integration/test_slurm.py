"""`rlrun slurm` with the real thing: ansible-playbook's evaluation of the roles (golden), shellcheck,
and a private Slurm 22.05 on this machine (tests/lab/slurm.py, lab 61: munged, slurmctld and three slurmd
"nodes", each in a network and PID namespace of its own) running the sbatch script end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rlrun.slurm.ports import block_for_job
from rlrun.slurm.script import JobOptions, render
from rlrun.slurm.spec import PORT_VARS, evaluate, ph, substitute
from tests.conftest import BIN, PROJECT, ansible_env, write_inventory

pytestmark = pytest.mark.integration

SEED_AMD = {  # the seed runbook's ROCm/RCCL settings (seeds/001), as accel_env variables
    "cluster__accelerator": "amd", "accel_env__rocm_version": "6.2", "accel_env__rccl_msccl_enable": False,
    "accel_env__hsa_no_scratch_reclaim": True, "accel_env__nccl_ib_hca": "mlx5_0,mlx5_1,mlx5_2,mlx5_3",
    "accel_env__nccl_ib_gid_index": 3, "accel_env__nccl_debug": "TRACE", "ray_node__num_gpus": 8,
    "ray_node__num_cpus": 24, "ray_node__extra_args": ["--resources", '{"slot": 1}'],
}



def _golden_play(out: Path) -> str:
    roles = "\n".join(f"""    - name: Role {r}
      ansible.builtin.import_role:
        name: {r}
      when: false""" for r in ("cluster", "accel_env", "ray_node"))
    return f"""- name: What the roles would start on each node
  hosts: ray_cluster
  gather_facts: false
  tasks:
{roles}
    - name: The node-start spec of this host
      ansible.builtin.copy:
        dest: "{out}/{{{{ inventory_hostname }}}}.json"
        mode: "0600"
        content: >-
          {{{{ {{'command': ray_node__command, 'env_files': ray_node__env_files, 'accel_vars': accel_env__vars,
              'node_ip': cluster__node_address, 'head_ip': cluster__head_address,
              'state_dir': cluster__state_dir, 'temp_dir': cluster__ray_temp_dir,
              'spill_dir': cluster__ray_spill_dir, 'num_cpus': ray_node__num_cpus,
              'ports': {{{", ".join(f"'{v}': {v}" for v in PORT_VARS)}}}}} | to_json }}}}
    - name: The accelerator env file, by the role's template
      ansible.builtin.template:
        src: "{PROJECT}/roles/accel_env/templates/accel.env.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}.accel.env"
        mode: "0600"
"""


def test_the_slurm_script_starts_what_the_roles_start(tmp_path):
    """Golden: substituting each host's values for the script's ${...} gives ansible-playbook's own
    ray_node__command, env files and accel.env (AMD, the seed's RCCL/ROCm settings) for that host."""
    workers = {"w1": {"ansible_connection": "local", "ansible_python_interpreter": str(BIN / "python"),
                      "cluster__node_address": "10.77.0.12"}}
    inv = write_inventory(tmp_path, "golden", "10.77.0.11", 21000, heads=["h1"], workers=workers,
                          group_vars=SEED_AMD)
    out = tmp_path / "out"
    out.mkdir()
    play = tmp_path / "golden.yml"
    play.write_text(_golden_play(out))
    facts = json.dumps({"ansible_env": {"HOME": "/home/alice"}, "ansible_user_id": "alice"})
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(play), "-e", facts],
                          capture_output=True, text=True, env=ansible_env(), timeout=300, cwd=PROJECT)
    assert proc.returncode == 0, proc.stdout[-3000:]
    spec = evaluate(inv)
    for host, argv in (("h1", spec.head_argv), ("w1", spec.worker_argv)):
        want = json.loads((out / f"{host}.json").read_text())
        values = {"NODE": host, "NODE_IP": want["node_ip"], "HEAD_IP": want["head_ip"], "USER_HOME": "/home/alice",
                  "USER_NAME": "alice", "STATE_DIR": want["state_dir"], "TEMP_DIR": want["temp_dir"],
                  "SPILL_DIR": want["spill_dir"], "NUM_CPUS": str(want["num_cpus"]),
                  **{name: str(want["ports"][var]) for var, name in PORT_VARS.items()}}
        assert [substitute(a, values) for a in argv] == want["command"], host
        assert [substitute(f, values) for f in spec.env_files] == want["env_files"]
        accel = (out / f"{host}.accel.env").read_text().splitlines()
        mine = substitute(spec.accel_env, values).splitlines()
        # The first line is each side's "managed by" comment.
        assert mine[1:] == accel[1:], host
    assert "RCCL_MSCCL_ENABLE='0'" in accel and "HSA_NO_SCRATCH_RECLAIM='1'" in accel
    assert "NCCL_IB_HCA='mlx5_0,mlx5_1,mlx5_2,mlx5_3'" in accel


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="unreachable: make test installs shellcheck")
def test_rendered_scripts_pass_shellcheck(tmp_path):
    """Batch (plain and --requeue) and long-lived, CPU and AMD, with DeepSpeed ops to build: shellcheck finds
    nothing (warnings included)."""
    amd = write_inventory(tmp_path, "amdsc", "10.77.0.11", 21000, group_vars=SEED_AMD)
    ops = write_inventory(tmp_path / "ops", "opssc", "10.77.0.11", 21000,
                          group_vars={"ray_node__deepspeed_ops": ["cpu_adam"]})
    requeue = JobOptions(nodes=3, submit_args=["--preset", "tiny-rloo"], requeue=True,
                         ckpt_args=["--set", f"ckpt_path={ph('JOB_CKPT')}"], resume_args=["--set", "load_checkpoint=true"],
                         ckpt_shown=ph("JOB_CKPT"))
    for inv, opts in ((PROJECT / "inventory", JobOptions(nodes=3, submit_args=["--preset", "tiny-rloo"])),
                      (PROJECT / "inventory", requeue),
                      (amd, JobOptions(nodes=2, gpus_per_node=8, cluster_dir=tmp_path / "c", partition="mi300")),
                      (ops, JobOptions(nodes=2, submit_args=["--preset", "7b-ppo"]))):
        script = tmp_path / "job.sbatch"
        script.write_text(render(evaluate(inv), opts))
        proc = subprocess.run(["shellcheck", "-S", "style", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
    assert block_for_job(0).base >= 16384


# ---------------------------------------------------------------- a real Slurm on this machine
LAB_INDEX = 61
TINY = ["--set", "sft_warmup_steps=2", "--set", "max_samples=8", "--set", "rollout_batch_size=8",
        "--set", "micro_rollout_batch_size=8", "--set", "n_samples_per_prompt=4", "--set", "train_batch_size=32",
        "--set", "micro_train_batch_size=32", "--set", "num_episodes=2"]


# Stand-ins for another cluster's processes on this machine, outside the lab's nodes: what a signal sent
# by process name (raylet, gcs_server) or by a match on the command line (trainer.reward.server) in the
# lab's teardown or in Slurm's epilog would hit (each in a session of its own, as a node service is).
# Only these are watched: a real cluster of another test lane may end on its own while the Slurm tests run.
def _start_sentinels(bindir: Path) -> list[subprocess.Popen]:
    procs = []
    for name, argv0 in (("gcs_server", "gcs_server"), ("raylet", "raylet"),
                        ("python3", "python3 -m trainer.reward.server --sentinel")):
        (bindir / name).symlink_to(shutil.which("sleep"))  # the process's name is the link's
        procs.append(subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" {bindir / name} 3600'],
                                      start_new_session=True))
    return procs


@pytest.fixture(scope="module")
def lab():
    from tests.lab.netns import LabError
    from tests.lab.slurm import SlurmLab

    try:
        lab = SlurmLab(LAB_INDEX, nodes=3, cpus=4, owner=f"pytest-{__import__('os').getpid()}").create()
    except LabError as exc:  # never a silent skip: make test installs what the lab needs
        pytest.fail(f"the Slurm lab cannot run here: {exc}", pytrace=False)
    sentinels = _start_sentinels(Path(tempfile.mkdtemp(prefix="rlrun-sentinel-")))
    try:
        yield lab
    finally:
        lab.destroy()
        ended = {" ".join(p.args): p.poll() for p in sentinels if p.poll() is not None}
        for p in sentinels:
            p.kill()
            p.wait()
    assert lab.leftovers() == []
    assert not ended, f"processes named like another cluster's ended during the Slurm tests: {ended}"


@pytest.fixture(scope="module")
def slurm_inv(tmp_path_factory) -> Path:
    """The cluster's inventory as a Slurm site would write it: group_vars only (the nodes come from the
    allocation); the lab nodes' interface is eth0, so Gloo and NCCL are told so."""
    return write_inventory(tmp_path_factory.mktemp("slurm-inv"), "slurmlab", "10.245.61.11", 21000,
                           group_vars={"accel_env__gloo_socket_ifname": "eth0"})


def _rlrun(lab, *args: str, inv: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "rlrun"), "-i", str(inv), *args], capture_output=True,
                          text=True, env=lab.env(ansible_env()), timeout=timeout, cwd=PROJECT)


def _nothing_left(lab, job_id: str, job_root: Path) -> None:
    """No process of the job on any node (slurmd aside), no temp dir, no job dir."""
    assert lab.job_pids() == [], [subprocess.run(["ps", "-o", "pid,cmd", "-p", str(p)], capture_output=True,
                                                 text=True).stdout for p in lab.job_pids()]
    left = sorted(str(p) for p in lab.node_tmp.glob(f"rlrun-*/s{job_id}-*"))
    assert left == [], left
    assert not (job_root / job_id).exists()


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_tiny_rloo_on_three_slurm_nodes_succeeds_is_requeued_resumes_and_leaves_nothing(lab, slurm_inv, tmp_path):
    """`rlrun slurm submit --requeue --preset tiny-rloo`: head on n1, workers on n2/n3 via srun, reward service as
    its own step, the Ray job through the Jobs API. Requeued by Slurm inside the save of its last checkpoint
    (RLRUN_TEST_CHECKPOINT_PAUSE holds the save there), it runs again from the top and resumes from its
    newest complete checkpoint, global_step1; the Slurm job COMPLETES only because the Ray job SUCCEEDED."""
    job_root = tmp_path / "jobs"
    ckpt = tmp_path / "build" / "tiny" / "rloo" / "ckpt"
    env = lab.env(ansible_env())
    env["RLRUN_TEST_CHECKPOINT_PAUSE"] = "global_step2:20"  # the job's env: sbatch, srun and Ray pass it on
    proc = subprocess.Popen([str(BIN / "rlrun"), "-i", str(slurm_inv), "slurm", "submit", "--requeue", "--nodes", "3",
                             "--node-tmp", str(lab.node_tmp),
                             "--cpus-per-node", "2", "--job-root", str(job_root), "--working-dir", str(tmp_path),
                             "--time", "15", "--preset", "tiny-rloo", *TINY, "--set", "save_steps=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=PROJECT)
    try:
        output = _wait(lambda: next(job_root.glob("*.out"), None), 120, "the job's output file")
        job_id = output.stem
        _wait(lambda: "pausing 20 s before the completion marker" in output.read_text(errors="replace")
              or proc.poll() is not None, 600, "the save of global_step2")
        assert proc.poll() is None, output.read_text(errors="replace")[-4000:]
        lab.run("scontrol", "requeue", job_id)
        # Slurm holds a requeued job ~2 minutes (BeginTime); let it start at once.
        _wait(lambda: "BeginTime" in lab.run("squeue", "-h", "-j", job_id, "-o", "%r", check=False).stdout, 120,
              "the job pending again")
        lab.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = stdout
    assert proc.returncode == 0, out[-4000:] + stderr[-2000:]
    assert f"Slurm job {job_id}: COMPLETED (exit 0:0); Ray job slurm-{job_id} exit 0" in stderr
    for ip in ("10.245.61.11", "10.245.61.12", "10.245.61.13"):
        assert f"node {ip} alive" in out
    assert "reward service http://10.245.61.11:" in out and "healthy" in out
    # the first run: both steps, killed inside the save of global_step2; the requeued run: step 2 again
    first, _, again = out.partition(f"requeued (restart 1): resuming from the newest complete checkpoint in {ckpt}")
    assert again, out[-4000:]
    assert "[1/2] reward/mean=" in first and "[2/2] reward/mean=" in first and "SUCCEEDED" not in first
    assert f"resumed from {ckpt / 'global_step1'} (step 1)" in again
    assert "[1/2]" not in again and "[2/2] reward/mean=" in again
    assert f"job slurm-{job_id}: SUCCEEDED after 2/2 steps" in again
    assert (ckpt / "latest").read_text() == "global_step2"
    record = json.loads((job_root / f"{job_id}.json").read_text())
    assert record["state"] == "done" and record["ray_exit"] == 0 and record["head"] == "n1"
    assert record["restarts"] == 1
    assert record["port_base"] == block_for_job(int(job_id)).base
    assert (job_root / f"{job_id}.json").stat().st_mode & 0o077 == 0
    _nothing_left(lab, job_id, job_root)
    status = _rlrun(lab, "slurm", "status", job_id, "--job-root", str(job_root), "--json", inv=slurm_inv)
    assert json.loads(status.stdout)["slurm_state"] == "COMPLETED", status.stderr


def test_two_jobs_share_the_nodes_and_scancel_mid_job_leaves_nothing(lab, slurm_inv, tmp_path):
    """A long-lived cluster (an inventory rlrun -i uses) and a batch job on the same three nodes at once,
    each with its own port block and token; scancel of the batch job mid-job ends its Ray and removes its
    dirs, and the other job's cluster keeps running its job."""
    job_root = tmp_path / "jobs"
    cluster_dir = tmp_path / "cluster"
    common = ["--nodes", "3", "--node-tmp", str(lab.node_tmp), "--job-root", str(job_root), "--no-follow", "--time",
              "10"]
    up = _rlrun(lab, "slurm", "submit", *common, "--cluster-dir", str(cluster_dir), inv=slurm_inv)
    assert up.returncode == 0, up.stderr
    long_id = up.stdout.strip()
    batch = _rlrun(lab, "slurm", "submit", *common, "--reward-node", "none", "--working-dir", str(tmp_path),
                   "--", "python", "-c", "import time; print('batch job running', flush=True); time.sleep(600)",
                   inv=slurm_inv)
    assert batch.returncode == 0, batch.stderr
    batch_id = batch.stdout.strip()

    _wait(lambda: (cluster_dir / "hosts.yml").exists(), 240, "the long-lived cluster's inventory")
    _wait(lambda: "batch job running" in (job_root / f"{batch_id}.out").read_text(errors="replace"), 240,
          "the batch job's Ray job")
    running = lab.run("squeue", "-h", "-o", "%i %T %N").stdout.split("\n")
    assert {f"{long_id} RUNNING n[1-3]", f"{batch_id} RUNNING n[1-3]"} <= set(running), running
    records = [json.loads((job_root / f"{j}.json").read_text()) for j in (long_id, batch_id)]
    assert records[0]["port_base"] != records[1]["port_base"]
    assert (cluster_dir / ".secrets").stat().st_mode & 0o077 == 0

    # The long-lived cluster is an inventory: rlrun -i DIR status / submit.
    status = _rlrun(lab, "status", "--json", inv=cluster_dir)
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert sorted(n["node_ip"] for n in info["nodes"] if n["state"] == "ALIVE") == ["10.245.61.11", "10.245.61.12",
                                                                        "10.245.61.13"]
    assert list(info["reward_services"].values()) == ["ok"]

    cancel = _rlrun(lab, "slurm", "cancel", batch_id, inv=slurm_inv)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stdout + cancel.stderr
    _wait(lambda: json.loads((job_root / f"{batch_id}.json").read_text()).get("state") == "cancelled", 60,
          "the batch job's record to say cancelled")
    _wait(lambda: not list(lab.node_tmp.glob(f"rlrun-*/s{batch_id}-*")), 60, "the batch job's temp dirs to go")
    assert not (job_root / batch_id).exists()

    # The other job's cluster is untouched: all three nodes alive, and it runs a job to the end.
    job = _rlrun(lab, "submit", "--no-working-dir", "--follow", "--", "python", "-c",
                 "import os, ray; ray.init(); print('nodes', len([n for n in ray.nodes() if n['Alive']])); "
                 "print('extensions', os.environ.get('TORCH_EXTENSIONS_DIR'))",
                 inv=cluster_dir)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    assert "nodes 3" in job.stdout
    # torch's extension cache (DeepSpeed's JIT ops) is the node's and the user's, outside the job's dirs
    assert f"extensions {lab.node_tmp}/rlrun-" in job.stdout and "/torch_extensions\n" in job.stdout, job.stdout

    stop = _rlrun(lab, "slurm", "cancel", long_id, inv=slurm_inv)
    assert stop.returncode == 0, stop.stderr
    _wait(lambda: not cluster_dir.exists(), 60, "the long-lived cluster's inventory to go")
    _wait(lambda: not lab.job_pids(), 60, "every job process on the nodes to end")
    _nothing_left(lab, long_id, job_root)
    _nothing_left(lab, batch_id, job_root)


def test_a_node_that_cannot_build_its_deepspeed_ops_ends_the_job_before_its_cluster_is_up(lab, tmp_path):
    """ray_node__deepspeed_ops is built by each node step before its Ray starts (as the role builds it when it
    provisions a node): one the node's DeepSpeed cannot build ends that step with the tool's message, and the
    job with it, before any Ray job runs, and leaves nothing behind."""
    inv = write_inventory(tmp_path / "inv", "slurmops", "10.245.61.11", 21000, group_vars={
        "accel_env__gloo_socket_ifname": "eth0", "ray_node__deepspeed_ops": ["rlrun_no_such_op"]})
    job_root = tmp_path / "jobs"
    proc = _rlrun(lab, "slurm", "submit", "--nodes", "1", "--reward-node", "none", "--node-tmp", str(lab.node_tmp),
                  "--job-root", str(job_root), "--working-dir", str(tmp_path), "--time", "5", "--",
                  "python", "-c", "print('the job ran')", inv=inv, timeout=300)
    out = proc.stdout + proc.stderr
    job_id = next(job_root.glob("*.out")).stem
    log = (job_root / f"{job_id}.out").read_text(errors="replace")
    assert proc.returncode != 0, out[-3000:]
    assert "DeepSpeed ops rlrun_no_such_op: building into" in log, log[-3000:]
    assert "unknown DeepSpeed op(s) 'rlrun_no_such_op'" in log and "cpu_adam" in log  # the node's own ops named
    assert "(ray_node__deepspeed_ops) did not build on n1" in log
    assert "the head's step ended before the cluster was up" in log
    assert "the job ran" not in log and "ray start on" not in log
    assert json.loads((job_root / f"{job_id}.json").read_text())["state"] == "failed"
    _nothing_left(lab, job_id, job_root)
