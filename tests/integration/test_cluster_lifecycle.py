"""The whole foundation on this machine, against the session's one-node cluster (conftest's
local_cluster: a name, ports and dirs of its own): up -> idempotent re-run -> token enforced -> jobs;
then, after every other test of the session (mark changes_cluster), a change left by an interrupted
run, a new token, a supervisor restart, and teardown that leaves a second, hand-started cluster running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import (
    BIN,
    LOCAL_ADDRESS,
    LOCAL_NAME,
    LOCAL_PORT,
    ansible_env,
    playbook,
    rlrun,
    write_inventory,
)

pytestmark = pytest.mark.integration

ADDRESS, PORT, NAME = LOCAL_ADDRESS, LOCAL_PORT, LOCAL_NAME


def _recap_changed(output: str) -> int:
    match = re.search(r"localhost\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", output)
    assert match, output[-3000:]
    return int(match.group(1))


def _alive(url: str, token: str | None) -> bool:
    try:
        r = requests.get(
            f"{url}/api/v0/nodes", headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=5
        )
        return r.status_code == 200 and any(
            n["state"] == "ALIVE" for n in r.json()["data"]["result"]["result"]
        )
    except requests.RequestException:
        return False


@pytest.fixture
def cluster(local_cluster):
    return local_cluster


def test_up_brings_the_node_alive(cluster):
    assert cluster["up"].returncode == 0, cluster["up"].stdout[-4000:]
    assert "1 nodes alive, 2 CPUs, 0 GPUs" in cluster["up"].stdout
    token = (cluster["state"] / "auth_token").read_text()
    assert _alive(cluster["url"], token)


def test_token_files_are_private_and_never_printed(cluster):
    token = (cluster["state"] / "auth_token").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert (cluster["state"] / "auth_token").stat().st_mode & 0o777 == 0o600
    store = cluster["inv"] / ".secrets" / f"{NAME}-ray.token"
    assert store.read_text().strip() == token and store.stat().st_mode & 0o777 == 0o600
    assert token not in cluster["up"].stdout + cluster["up"].stderr


def test_second_run_changes_nothing_and_keeps_the_pid(cluster):
    pid = cluster["pidfile"].read_text().strip()
    again = playbook(cluster["inv"], "site.yml")
    assert again.returncode == 0, again.stdout[-3000:]
    assert _recap_changed(again.stdout) == 0, again.stdout[-5000:]
    assert cluster["pidfile"].read_text().strip() == pid


def test_jobs_api_refuses_requests_without_the_right_token(cluster):
    assert requests.get(f"{cluster['url']}/api/jobs/", timeout=5).status_code == 401
    bad = {"Authorization": "Bearer " + "0" * 64}
    assert requests.get(f"{cluster['url']}/api/jobs/", headers=bad, timeout=5).status_code == 403


REWARD_BODY = {"query": ["What is 2/4? \\boxed{1/2}"], "prompts": ["What is 2/4? "], "labels": ["0.5"]}


def test_reward_service_wants_its_own_token_and_verifies(cluster):
    url = f"http://{ADDRESS}:{PORT + 50}/get_reward"
    assert requests.post(url, json=REWARD_BODY, timeout=10).status_code == 401
    bad = {"Authorization": "Bearer " + "0" * 64}
    assert requests.post(url, json=REWARD_BODY, headers=bad, timeout=10).status_code == 403
    # Its own token, not the cluster's: a reward request never carries a token that runs code on the nodes.
    cluster_token = (cluster["state"] / "auth_token").read_text().strip()
    assert requests.post(url, json=REWARD_BODY, headers={"Authorization": f"Bearer {cluster_token}"},
                         timeout=10).status_code == 403
    token_file = cluster["state"] / "reward_token"
    token = token_file.read_text().strip()
    assert len(token) == 64 and token != cluster_token
    assert token_file.stat().st_mode & 0o777 == 0o600
    ok = requests.post(url, json=REWARD_BODY, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert ok.status_code == 200 and ok.json()["rewards"] == [1.0]
    supervisor = cluster["state"] / "reward" / "service" / f"rlrun-{NAME}-reward.supervise"
    assert f"--token-file {token_file}" in supervisor.read_text()
    # Jobs find it the way they find the cluster token: through the Ray node's environment.
    ray_env = (cluster["state"] / "ray.env").read_text()
    assert f"RLRUN_REWARD_TOKEN_FILE='{token_file}'" in ray_env
    status = rlrun(cluster["inv"], "status")  # posts one item with the controller's reward token
    assert f"reward service {url}: ok" in status.stdout, status.stdout + status.stderr


def test_submit_follow_prints_the_output_and_exits_zero(cluster):
    result = rlrun(
        cluster["inv"], "submit", "--follow", "--no-working-dir", "--", "python", "-c", "print(6*7)"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "42" in result.stdout.split()
    assert "SUCCEEDED" in result.stderr


def test_failing_entrypoint_makes_submit_fail_showing_the_hidden_end_of_the_log_once(cluster):
    result = rlrun(
        cluster["inv"],
        "submit",
        "--follow",
        "--no-working-dir",
        "--",
        "python",
        "-c",
        "import sys, warnings; print('last words'); warnings.warn('disk nearly full'); sys.exit(3)",
    )
    assert result.returncode == 1
    assert "ended FAILED: Job entrypoint command failed with exit code 3" in result.stderr
    assert "last available logs" not in result.stderr  # Ray's message, cut before the log it repeats
    assert result.stdout.count("last words") == 1 and "last words" not in result.stderr
    assert result.stderr.count("UserWarning: disk nearly full") == 1 and "disk nearly full" not in result.stdout


def test_submit_uploads_the_working_dir_without_excluded_parts(cluster, tmp_path):
    (tmp_path / "job.py").write_text("import os; print(sorted(os.listdir('.')))\n")
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "big.bin").write_bytes(b"0" * 1000)
    result = rlrun(
        cluster["inv"], "submit", "--follow", "--working-dir", str(tmp_path), "--", "python", "job.py"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "['job.py']" in result.stdout


def test_list_status_logs_and_unknown_job(cluster):
    sub = rlrun(
        cluster["inv"],
        "submit",
        "--no-working-dir",
        "--submission-id",
        "pytest-logs",
        "--",
        "python",
        "-c",
        # Ray's job supervisor writes its "Running entrypoint ..." line through a buffered file object that it
        # flushes only after starting the driver on the same descriptor (ray 2.60, job_supervisor.py): a driver
        # that prints at once can land before it, and the log's last line is then Ray's. A second's wait
        # keeps the order a slower job has.
        "import time; time.sleep(1); print('hello-logs')",
    )
    assert sub.returncode == 0 and sub.stdout.strip() == "pytest-logs"
    assert "rlrun" in sub.stderr and "logs -f pytest-logs" in sub.stderr
    assert f"dashboard: http://{ADDRESS}:{PORT + 1}/#/jobs/pytest-logs" in sub.stderr
    deadline = time.time() + 60
    while time.time() < deadline and "SUCCEEDED" not in rlrun(cluster["inv"], "status", "pytest-logs").stdout:
        time.sleep(1)
    # the job's own line (the entrypoint's echo holds 'hello-logs' too)
    while time.time() < deadline and "hello-logs" not in rlrun(cluster["inv"], "logs", "pytest-logs").stdout.splitlines():
        time.sleep(1)
    assert "hello-logs" in rlrun(cluster["inv"], "logs", "pytest-logs").stdout.splitlines()
    assert rlrun(cluster["inv"], "logs", "--tail", "1", "pytest-logs").stdout == "hello-logs\n"
    listed = rlrun(cluster["inv"], "list", "--json")
    assert any(
        j["job_id"] == "pytest-logs" and j["status"] == "SUCCEEDED"
        for j in __import__("json").loads(listed.stdout)
    )
    table = rlrun(cluster["inv"], "list", "--status", "succeeded", "--name", "python*").stdout.splitlines()
    assert table[0].split() == ["JOB", "NAME", "STATUS", "STEP", "STARTED", "TOOK"]
    assert any(line.startswith("pytest-logs ") and " SUCCEEDED " in line for line in table[1:])
    assert all("FAILED" not in line for line in table)
    unknown = rlrun(cluster["inv"], "status", "no-such-job")
    assert unknown.returncode == 1
    assert "no job 'no-such-job'" in unknown.stderr


def test_wrong_token_and_unreachable_cluster_are_one_clear_line(cluster, tmp_path):
    wrong = write_inventory(
        tmp_path / "w", NAME, ADDRESS, PORT, group_vars={"cluster__token": "1" * 64}
    )
    result = rlrun(wrong, "list")
    assert result.returncode == 1
    assert "refused the token" in result.stderr and "Traceback" not in result.stderr
    away = write_inventory(
        tmp_path / "u", NAME, ADDRESS, PORT + 50, group_vars={"cluster__token": "1" * 64}
    )
    result = rlrun(away, "list")
    assert result.returncode == 1
    assert f"cannot reach the Ray Jobs API at http://{ADDRESS}:{PORT + 51}" in result.stderr


def test_status_exits_1_naming_what_differs_from_the_inventory(cluster, tmp_path):
    ok = rlrun(cluster["inv"], "status")
    assert ok.returncode == 0, ok.stderr
    token = (cluster["state"] / "auth_token").read_text().strip()
    # The same cluster, described by an inventory that expects a GPU, a second node and a reward service on a
    # port nothing listens on.
    off = write_inventory(tmp_path, NAME, ADDRESS, PORT, workers={"w1": {"cluster__node_address": "127.0.0.77"}},
                          group_vars={"cluster__token": token, "ray_node__num_cpus": 2, "ray_node__num_gpus": 1,
                                      "cluster__reward_port": PORT + 60})
    result = rlrun(off, "status")
    assert result.returncode == 1
    problems = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("- ")]
    assert problems == [
        "- node localhost (127.0.0.4) has 0 GPUs, its ray_node__num_gpus is 1",
        "- node w1 (127.0.0.77) is not alive (not in the cluster)",
        "- 2 CPUs in the cluster, the inventory expects 4",
        "- 0 GPUs in the cluster, the inventory expects 2",
        f"- reward service http://{ADDRESS}:{PORT + 60}/get_reward: unreachable (ConnectionError)",
    ], result.stderr


def test_rerun_after_jobs_changes_nothing_and_keeps_dirs_private(cluster):
    pid = cluster["pidfile"].read_text().strip()
    again = playbook(cluster["inv"], "site.yml")
    assert _recap_changed(again.stdout) == 0, again.stdout[-5000:]
    assert cluster["pidfile"].read_text().strip() == pid
    temp_parent = Path(f"/tmp/rlrun-{os.getuid()}")
    for private in (temp_parent, cluster["state"], cluster["state"] / "spill"):
        st = private.stat()
        assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.getuid(), private


def _service_pids(cluster, service: str) -> tuple[int, int]:
    """(supervisor, command) PIDs of one of the cluster's services on this host."""
    run_dir = cluster["state"] / ("service" if service == "ray-head" else "reward/service")
    supervisor = int((run_dir / f"rlrun-{NAME}-{service}.pid").read_text())
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(supervisor)], capture_output=True,
                              text=True).stdout.split()
    return supervisor, int(children[0]) if children else -1


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.changes_cluster
def test_a_change_left_by_an_interrupted_run_restarts_the_node(cluster):
    """A run that wrote a new accelerator env and stopped before restarting the node (here: only
    the accel_env step runs) leaves the node on its old environment; the next run finds the node's
    digest differs from the one it was started with and restarts it, and only it."""
    ray_before, reward_before = _service_pids(cluster, "ray-head"), _service_pids(cluster, "reward")
    (cluster["inv"] / "group_vars" / "all" / "debug.yml").write_text("accel_env__nccl_debug: WARN\n")
    partial = cluster["root"] / "partial.yml"
    partial.write_text("- hosts: ray_cluster\n  roles: [cluster, accel_env]\n")
    written = playbook(cluster["inv"], str(partial))
    assert written.returncode == 0 and _recap_changed(written.stdout) == 1, written.stdout[-3000:]
    assert "NCCL_DEBUG='WARN'" in (cluster["state"] / "accel.env").read_text()
    assert _service_pids(cluster, "ray-head") == ray_before  # the "interrupted" run restarted nothing

    again = playbook(cluster["inv"], "site.yml")
    assert again.returncode == 0, again.stdout[-4000:]
    ray_after = _service_pids(cluster, "ray-head")
    assert ray_after[0] != ray_before[0] and _environ(ray_after[1]).get("NCCL_DEBUG") == "WARN"
    assert _service_pids(cluster, "reward") == reward_before  # it does not load the accelerator env
    assert _recap_changed(playbook(cluster["inv"], "site.yml").stdout) == 0


@pytest.mark.changes_cluster
def test_new_tokens_restart_every_service_that_reads_them(cluster):
    """Token rotation: a new cluster__token and a new cluster__reward_token are installed once per host
    and restart the Ray node (cluster token) and the reward service (its own token); the old tokens are
    refused afterwards, and the reward service still refuses the cluster token."""
    old = (cluster["state"] / "auth_token").read_text().strip()
    old_reward = (cluster["state"] / "reward_token").read_text().strip()
    new, new_reward = "5e" * 32, "7a" * 32
    ray_before, reward_before = _service_pids(cluster, "ray-head"), _service_pids(cluster, "reward")
    (cluster["inv"] / "group_vars" / "all" / "token.yml").write_text(
        f"cluster__token: '{new}'\ncluster__reward_token: '{new_reward}'\n")
    again = playbook(cluster["inv"], "site.yml")
    assert again.returncode == 0, again.stdout[-4000:]
    assert (cluster["state"] / "auth_token").read_text() == new
    assert (cluster["state"] / "reward_token").read_text() == new_reward
    assert _service_pids(cluster, "ray-head")[0] != ray_before[0]
    assert _service_pids(cluster, "reward")[0] != reward_before[0]
    jobs = f"{cluster['url']}/api/jobs/"
    assert requests.get(jobs, headers={"Authorization": f"Bearer {new}"}, timeout=10).status_code == 200
    assert requests.get(jobs, headers={"Authorization": f"Bearer {old}"}, timeout=10).status_code == 403
    reward = f"http://{ADDRESS}:{PORT + 50}/get_reward"

    def ask(token: str) -> requests.Response:
        return requests.post(reward, json=REWARD_BODY, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    assert ask(new_reward).json()["rewards"] == [1.0]
    assert [ask(t).status_code for t in (old_reward, new)] == [403, 403]


@pytest.mark.changes_cluster
def test_supervisor_restarts_a_killed_node(cluster):
    token = (cluster["state"] / "auth_token").read_text()
    supervisor = int(cluster["pidfile"].read_text())
    child = int(
        subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(supervisor)], capture_output=True, text=True
        ).stdout.split()[0]
    )
    os.kill(child, signal.SIGKILL)
    time.sleep(2)
    deadline = time.time() + 120
    while time.time() < deadline and not _alive(cluster["url"], token):
        time.sleep(2)
    assert _alive(cluster["url"], token), (
        cluster["state"] / "service" / f"rlrun-{NAME}-ray-head.log"
    ).read_text()[-3000:]
    assert int(cluster["pidfile"].read_text()) == supervisor


def _hand_started_cluster(root: Path, token_file: Path) -> subprocess.Popen:
    env = {
        **ansible_env(),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "HOME": str(root),
    }
    p = PORT + 200
    return subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--block",
            "--head",
            "--node-ip-address",
            "127.0.0.5",
            "--port",
            str(p),
            "--dashboard-host",
            "127.0.0.5",
            "--dashboard-port",
            str(p + 1),
            "--ray-client-server-port",
            str(p + 2),
            "--node-manager-port",
            str(p + 10),
            "--object-manager-port",
            str(p + 11),
            "--dashboard-agent-listen-port",
            str(p + 12),
            "--dashboard-agent-grpc-port",
            str(p + 13),
            "--runtime-env-agent-port",
            str(p + 14),
            "--metrics-export-port",
            str(p + 15),
            "--min-worker-port",
            str(p + 100),
            "--max-worker-port",
            str(p + 300),
            "--temp-dir",
            str(root / "handtmp"),
            "--num-cpus",
            "1",
            "--object-store-memory",
            "200000000",
            "--disable-usage-stats",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.mark.changes_cluster
def test_teardown_stops_this_cluster_only(cluster, tmp_path_factory):
    root = Path(f"/tmp/rlrun-hand-{os.getpid()}")
    root.mkdir(mode=0o700, exist_ok=True)
    token_file = root / "token"
    token_file.write_text("ef" * 32)
    token_file.chmod(0o600)
    hand = _hand_started_cluster(root, token_file)
    hand_url = f"http://127.0.0.5:{PORT + 201}"
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not _alive(hand_url, "ef" * 32):
            time.sleep(1)
        assert _alive(hand_url, "ef" * 32), "hand-started cluster did not come up"

        down = playbook(cluster["inv"], "playbooks/teardown.yml")
        assert down.returncode == 0, down.stdout[-3000:]
        assert not cluster["pidfile"].exists()
        left = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout
        assert f"/tmp/rlrun-{os.getuid()}/{NAME}-localhost" not in left
        assert not _alive(cluster["url"], None) and requests.get  # our dashboard is gone
        status = rlrun(cluster["inv"], "status")
        assert status.returncode == 1

        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{ADDRESS}:{PORT + 50}/health_check", timeout=5)
        assert hand.poll() is None and _alive(hand_url, "ef" * 32)
    finally:
        os.killpg(hand.pid, signal.SIGTERM)
        try:
            hand.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hand.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(root)], check=False)
