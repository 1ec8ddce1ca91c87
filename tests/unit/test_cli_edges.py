"""The CLI's edges that need no cluster: empty inventory paths, `--` before a command's options, preset jobs
that upload nothing, `down` that asks, one-line errors (vault, unexpected exceptions), job rows and the
status comparison against the inventory."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from rlrun.cli import main
from rlrun.commands.output import columns
from rlrun.dashboard import Node, cluster_problems
from rlrun.jobs import log_tail, progress_of, row_of, short_message
from tests.conftest import BIN, write_inventory


def test_an_empty_inventory_path_is_an_error_not_the_default_cluster(capsys, monkeypatch):
    assert main(["-i", "", "down", "--yes"]) == 2
    assert "'-i' / '--inventory': is empty (an unset shell variable?)" in capsys.readouterr().err
    monkeypatch.setenv("RLRUN_INVENTORY", "")
    assert main(["down", "--yes"]) == 1
    assert "RLRUN_INVENTORY is set but empty" in capsys.readouterr().err


def test_options_after_the_command_need_a_double_dash(capsys):
    assert main(["submit", "--dry-run", "python", "train.py", "--env", "A=B"]) == 2
    err = capsys.readouterr().err
    assert "--env after the command 'python'" in err and "rlrun submit [OPTIONS] -- python train.py --env A=B" in err
    assert main(["submit", "--dry-run", "--no-working-dir", "--env", "X=1", "--", "python", "train.py", "--env",
                 "A=B"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["entrypoint: python train.py --env A=B", 'runtime_env: {"env_vars": {"X": "1"}}']
    assert main(["submit", "--dry-run", "--no-working-dir", "python", "train.py"]) == 0  # no options: no `--` needed
    assert capsys.readouterr().out.startswith("entrypoint: python train.py\n")


def test_a_preset_job_uploads_nothing_unless_asked(capsys, tmp_path):
    assert main(["submit", "--preset", "tiny-rloo", "--dry-run", "--no-check"]) == 0
    runtime_env = json.loads(capsys.readouterr().out.split("runtime_env: ", 1)[1])
    assert "working_dir" not in runtime_env
    (tmp_path / "job.py").write_text("print(1)\n")
    assert main(["submit", "--preset", "tiny-rloo", "--dry-run", "--no-check", "--working-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out.split("runtime_env: ", 1)[1])["working_dir"] == str(tmp_path)


def test_down_names_the_cluster_and_wants_a_confirmation(tmp_path, capsys, monkeypatch):
    inv = write_inventory(tmp_path, "precious", "127.0.0.9", 9300,
                          group_vars={"cluster__token": "ab" * 32})
    ran = []
    monkeypatch.setattr("rlrun.provision.run_playbook", lambda *a, **k: ran.append(a))
    monkeypatch.setattr("sys.stdin", SimpleNamespace(isatty=lambda: False))
    assert main(["-i", str(inv), "--timeout", "1", "down"]) == 1
    err = capsys.readouterr().err
    assert "this stops cluster 'precious' from inventory" in err and "head localhost" in err
    assert "without a confirmation: stdin is not a terminal, pass --yes" in err
    assert ran == []


def test_down_asks_on_a_terminal_and_no_stops_nothing(tmp_path):
    inv = write_inventory(tmp_path, "precious", "127.0.0.9", 9300, group_vars={"cluster__token": "ab" * 32})
    # A real terminal is not available here; `script` would be, but click.confirm reads stdin: feed "n" through a
    # pipe and make isatty() true with a pseudo-terminal via python's pty.
    code = (f"import pty, os, sys\n"
            f"pid, fd = pty.fork()\n"
            f"if pid == 0:\n"
            f"    os.execv({str(BIN / 'rlrun')!r}, ['rlrun', '-i', {str(inv)!r}, '--timeout', '1', 'down'])\n"
            f"out = b''\n"
            f"while b'?' not in out:\n"
            f"    out += os.read(fd, 1024)\n"
            f"os.write(fd, b'n\\n')\n"
            f"while True:\n"
            f"    try:\n"
            f"        chunk = os.read(fd, 1024)\n"
            f"    except OSError:\n"
            f"        break\n"
            f"    if not chunk:\n"
            f"        break\n"
            f"    out += chunk\n"
            f"_, status = os.waitpid(pid, 0)\n"
            f"sys.stdout.write(out.decode(errors='replace'))\n"
            f"sys.exit(os.waitstatus_to_exitcode(status))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout
    assert "tear down cluster 'precious'? [y/N]" in result.stdout
    assert "nothing torn down" in result.stdout


def test_an_unexpected_exception_is_one_line(capsys, monkeypatch):
    def boom(*_a, **_k):
        raise ValueError("something\nmulti-line")

    monkeypatch.setattr("rlrun.presets.load_all", boom)
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected ValueError: something multi-line" in err
    assert "Traceback" not in err
    monkeypatch.setenv("RLRUN_TRACEBACK", "1")
    with pytest.raises(ValueError):
        main(["presets"])


@pytest.fixture
def vaulted(tmp_path):
    inv = write_inventory(tmp_path, "vaulted", "127.0.0.9", 9300)
    (tmp_path / "pass").write_text("right\n")
    (tmp_path / "wrong").write_text("wrong\n")
    enc = subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(tmp_path / "pass"),
                          "cd" * 32, "--name", "cluster__token"], capture_output=True, text=True, check=True)
    (inv / "group_vars" / "all" / "vault.yml").write_text(enc.stdout)
    return inv, tmp_path


def test_a_vaulted_token_without_the_password_is_a_hint_not_a_traceback(vaulted, capsys):
    inv, root = vaulted
    assert main(["-i", str(inv), "list"]) == 1
    err = capsys.readouterr().err
    assert "inventory holds vault-encrypted values: pass --vault-password-file FILE" in err and "Traceback" not in err
    assert main(["-i", str(inv), "--vault-password-file", str(root / "wrong"), "list"]) == 1
    assert f"the vault password in {root / 'wrong'} does not open" in capsys.readouterr().err
    # The right password opens it (a new process: Ansible sets its vault secrets once per process).
    right = subprocess.run([str(BIN / "rlrun"), "-i", str(inv), "--vault-password-file", str(root / "pass"),
                            "--timeout", "2", "list"], capture_output=True, text=True, timeout=120)
    assert right.returncode == 1 and "cannot reach the Ray Jobs API at http://127.0.0.9:9301" in right.stderr


def test_rays_failure_message_loses_the_log_it_repeats():
    message = ("Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"
               + "x" * 20_000)
    assert short_message(message) == "Job entrypoint command failed with exit code 1"
    assert short_message("Job finished successfully.") == "Job finished successfully."
    assert short_message(None) == ""


def test_log_tail_and_progress():
    log = "a\nb\n@plan {\"total_steps\": 8}\n@metrics {\"step\": 3, \"reward/mean\": 1}\nc\n"
    assert log_tail(log, 2) == "@metrics {\"step\": 3, \"reward/mean\": 1}\nc\n"
    assert log_tail(log, 0) == log
    assert progress_of(log) == (3, 8)
    assert progress_of("hello\n") == (None, None)


def _details(**kw):
    base = dict(type=SimpleNamespace(value="SUBMISSION"), submission_id="rlrun-x", job_id="02000000",
                status=SimpleNamespace(value="RUNNING"), entrypoint="python -c 'print(1)' --flag",
                message=None, start_time=1_000_000, end_time=None, metadata={})
    base.update(kw)
    return SimpleNamespace(**base)


def test_job_rows_name_the_preset_and_give_drivers_their_real_id():
    preset = row_of(_details(metadata={"preset": "tiny-rloo", "submitted_by": "rlrun"}))
    assert (preset.job_id, preset.name, preset.preset) == ("rlrun-x", "tiny-rloo", "tiny-rloo")
    named = row_of(_details(metadata={"name": "sweep-lr-3e-4"}))
    assert named.name == "sweep-lr-3e-4"
    plain = row_of(_details())
    assert plain.name == "python -c print(1)"
    driver = row_of(_details(type=SimpleNamespace(value="DRIVER"), submission_id=None, job_id="01000000",
                             status=SimpleNamespace(value="SUCCEEDED"), end_time=61_000_000))
    as_json = driver.to_json()
    assert (as_json["job_id"], as_json["type"], as_json["submission_id"]) == ("01000000", "DRIVER", None)
    assert driver.duration == 60_000


def test_list_columns_are_never_cut():
    long_id = "rlrun-20261124-042106-7e5d86-with-a-much-longer-custom-submission-id"
    text = columns([("JOB", "NAME"), (long_id, "tiny-rloo"), ("b", "x")])
    assert text.splitlines()[1] == f"{long_id}  tiny-rloo"
    assert all(len(line) <= len(long_id) + 2 + len("tiny-rloo") for line in text.splitlines())


def _cluster(**kw):
    base = dict(nodes=["head", "w1"], node_addresses={"head": "10.0.0.1", "w1": "10.0.0.2"},
                node_gpus={"head": 8.0, "w1": 8.0}, node_cpus={"head": None, "w1": None},
                expected_nodes=None, expected_gpus=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _node(ip, gpus=8.0, state="ALIVE", cpus=64.0):
    return Node(node_id=ip, node_ip=ip, is_head=ip.endswith(".1"), state=state, cpus=cpus, gpus=gpus)


def test_status_is_clean_when_the_cluster_is_as_the_inventory_says():
    assert cluster_problems(_cluster(), [_node("10.0.0.1"), _node("10.0.0.2")], {"http://r/get_reward": "ok"}) == []


def test_status_names_a_dead_node_a_gpu_count_and_the_reward_service():
    nodes = [_node("10.0.0.1", gpus=4.0), _node("10.0.0.2", state="DEAD")]
    problems = cluster_problems(_cluster(), nodes, {"http://10.0.0.1:5001/get_reward": "unreachable (ConnectTimeout)"})
    assert problems == [
        "node head (10.0.0.1) has 4 GPUs, its ray_node__num_gpus is 8",
        "node w1 (10.0.0.2) is not alive (state DEAD)",
        "4 GPUs in the cluster, the inventory expects 16",
        "reward service http://10.0.0.1:5001/get_reward: unreachable (ConnectTimeout)",
    ]


def test_shell_completion_offers_commands_and_preset_names():
    def complete(words: str, cword: int) -> list[str]:
        env = {"COMP_WORDS": words, "COMP_CWORD": str(cword), "_RLRUN_COMPLETE": "bash_complete", "PATH": str(BIN)}
        out = subprocess.run([str(BIN / "rlrun")], capture_output=True, text=True, env=env, timeout=60).stdout
        return [line.split(",", 1)[1] for line in out.splitlines()]

    assert complete("rlrun su", 1) == ["submit"]
    assert complete("rlrun submit --preset tiny-r", 3) == ["tiny-rloo", "tiny-rloo-async"]
    assert "validate" in complete("rlrun ", 1) and "plot" in complete("rlrun ", 1)


@pytest.mark.parametrize("action", ["up", "check", "down"])
def test_playbook_commands_refuse_a_bad_inventory_before_ansible_runs(action, tmp_path, capsys, monkeypatch):
    """`up`, `check` and `down` run the offline check of `rlrun validate` first and print every problem; the
    playbook (and so any host) is never reached."""
    import rlrun.provision

    def never(*args, **kwargs):
        raise AssertionError("a playbook ran on a bad inventory")

    monkeypatch.setattr(rlrun.provision, "run_playbook", never)
    inv = write_inventory(tmp_path, "bad", "127.0.0.256", 9400, group_vars={"cluster__token": "ab" * 32,
                                                                           "cluster__reward_port": 70000})
    assert main(["-i", str(inv), action, "--yes"] if action == "down" else ["-i", str(inv), action]) == 1
    err = capsys.readouterr().err
    assert "2 problems; nothing was done on any host" in err, err
    assert "'127.0.0.256'" in err and "70000" in err, err


def test_a_play_level_error_is_shown_not_an_empty_host_list():
    """A run that stops outside any host's task (here the validate play's lookup) has no failed host; its
    message is Ansible's own error block, without the colours and the source excerpt."""
    from rlrun.provision import play_error

    out = ("\x1b[0;31m[ERROR]: Error processing keyword 'hosts': The lookup plugin 'rlrun_validate' failed: "
           "the inventory has 1 problem\n- hosts.yml:10: bad\x1b[0m\nOrigin: /x/validate.yml:12:10\n\n12 - name\n")
    assert play_error(out) == ("Error processing keyword 'hosts': The lookup plugin 'rlrun_validate' failed: "
                               "the inventory has 1 problem\n- hosts.yml:10: bad")
    assert play_error("PLAY RECAP\nlocalhost : ok=1\n") == ""


@pytest.mark.parametrize("as_json", [False, True])
def test_a_playbook_run_is_one_table_or_its_json(as_json, tmp_path, capsys, monkeypatch):
    """`up` / `check` / `down` show each host's recap as a table, or with --json the same as JSON; a failed host
    fails the command either way."""
    import rlrun.provision
    from rlrun.provision import HostResult, RunResult

    result = RunResult(rc=2, hosts={"w1": HostResult(ok=3, changed=1, failed=1, errors=["task x: boom"]),
                                    "head": HostResult(ok=9)}, messages=["preflight: 1 problem"])
    monkeypatch.setattr(rlrun.provision, "run_playbook", lambda *a, **k: result)
    inv = write_inventory(tmp_path, "fine", "127.0.0.9", 9300, group_vars={"cluster__token": "ab" * 32})
    assert main(["-i", str(inv), "check"] + (["--json"] if as_json else [])) == 1
    out, err = capsys.readouterr()
    assert "`rlrun check` failed on w1 (ansible exit 2)" in err
    if as_json:
        shown = json.loads(out)
        assert shown["hosts"]["w1"] == {"ok": 3, "changed": 1, "failed": 1, "unreachable": 0, "skipped": 0,
                                        "errors": ["task x: boom"]}
        assert (shown["rc"], shown["messages"], list(shown["hosts"])) == (2, ["preflight: 1 problem"], ["head", "w1"])
    else:
        rows = [line for line in out.splitlines() if "head" in line or "w1" in line]
        assert [r.split()[1:6:2] for r in rows] == [["head", "9", "0"], ["w1", "3", "1"]], out
        assert "w1: task x: boom" in err and "preflight: 1 problem" in out


ECHO = ["--dry-run", "--no-working-dir", "--", "echo", "hi"]


@pytest.mark.parametrize("argv,flag,expected", [
    (["submit", "--num-gpus", "-1", *ECHO], "'--num-gpus': '-1' is not a number of GPUs", "a number >= 0"),
    (["submit", "--num-gpus", "two", *ECHO], "'--num-gpus': 'two' is not a number of GPUs", "a number >= 0"),
    (["submit", "--num-cpus", "nan", *ECHO], "'--num-cpus': 'nan' is not a number of CPUs", "a number >= 0"),
    (["submit", "--num-cpus", "inf", *ECHO], "'--num-cpus': 'inf'", "a number >= 0"),
    (["submit", "--num-cpus", "-0.5", *ECHO], "'--num-cpus': '-0.5'", "a number >= 0"),
    (["--timeout", "0", "list"], "'--timeout': '0' is not a time in seconds", "a number >= 0.1"),
    (["--timeout", "nan", "list"], "'--timeout': 'nan'", "a number >= 0.1"),
    (["up", "--max-time", "-5"], "'--max-time': '-5' is not a time in seconds", "a number >= 1"),
    (["check", "--max-time", "soon"], "'--max-time': 'soon'", "a number >= 1"),
    (["down", "--yes", "--max-time", "inf"], "'--max-time': 'inf'", "a number >= 1"),
    (["list", "-n", "-1"], "'--last': -1", "x>=0"),
    (["logs", "--tail", "0", "some-job"], "'--tail': 0", "x>=1"),
    (["slurm", "cancel", "--timeout", "-1", "7"], "'--timeout': '-1' is not a time in seconds", "a number >= 0"),
    (["slurm", "render", "--nodes", "two", "--", "echo"], "'--nodes' / '-N': 'two'", "integer"),
    (["slurm", "render", "--gpus-per-node", "1.5", "--", "echo"], "'--gpus-per-node': '1.5'", "integer"),
    (["slurm", "render", "--cpus-per-node", "x", "--", "echo"], "'--cpus-per-node': 'x'", "integer"),
])
def test_a_negative_or_non_numeric_resource_request_is_refused_in_one_line(argv, flag, expected, capsys):
    """Issue 33: `rlrun submit --num-gpus -1 --dry-run -- echo hi` was accepted. Every numeric resource flag refuses
    a negative, non-numeric, NaN or infinite value before anything runs: one line, naming the flag and the value,
    saying what was expected and where the options are listed; exit 2 (a usage error)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("error: Invalid value for ") and flag in err and expected in err, err
    assert "--help lists the options" in err


def test_negative_slurm_sizes_are_refused_naming_each(capsys):
    """The Slurm job's sizes are checked together (every problem at once) before a script is written."""
    assert main(["slurm", "render", "--nodes", "-1", "--gpus-per-node", "-2", "--cpus-per-node", "-1",
                 "--wait-timeout", "-1", "--", "echo"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[1:] == ["  - --nodes -1: expected 1 or more", "  - --gpus-per-node -2: expected 0 or more",
                                    "  - --cpus-per-node -1: expected 0 or more",
                                    "  - --wait-timeout -1: expected at least 10 seconds"], err


def test_fractional_gpus_and_cpus_are_still_accepted(capsys):
    assert main(["submit", "--num-gpus", "0.5", "--num-cpus", "2", *ECHO]) == 0
    assert capsys.readouterr().out.splitlines() == ["entrypoint: echo hi", "runtime_env: {}"]
