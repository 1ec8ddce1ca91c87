"""`rlrun slurm` with the real thing: ansible-playbook's evaluation of the roles (golden), shellcheck,
and a private Slurm 22.05 on this machine (tests/lab/slurm.py, lab 61: munged, slurmctld and three slurmd
"nodes", each in a network and PID namespace of its own) running the sbatch script end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from rlrun.slurm.ports import block_for_job
from rlrun.slurm.script import JobOptions, render
from rlrun.slurm.spec import PORT_VARS, evaluate, substitute
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
    """Batch and long-lived, CPU and AMD: shellcheck finds nothing (warnings included)."""
    amd = write_inventory(tmp_path, "amdsc", "10.77.0.11", 21000, group_vars=SEED_AMD)
    for inv, opts in ((PROJECT / "inventory", JobOptions(nodes=3, submit_args=["--preset", "tiny-rloo"])),
                      (amd, JobOptions(nodes=2, gpus_per_node=8, cluster_dir=tmp_path / "c", partition="mi300"))):
        script = tmp_path / "job.sbatch"
        script.write_text(render(evaluate(inv), opts))
        proc = subprocess.run(["shellcheck", "-S", "style", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
    assert block_for_job(0).base >= 16384
