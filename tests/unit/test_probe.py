"""The probe job's look at a node's DeepSpeed ops (rlrun.probe._ops): it runs the node's own
`python -m trainer.deepspeed_ops --check` in a process of its own, and a node where that does not answer
for an op (an older trainer without --check, an op it does not know) is reported as unknown, with why,
never as built. The whole probe job runs against a live cluster in tests/integration/test_presets_cluster.py."""

from __future__ import annotations

from rlrun import probe


def test_the_nodes_check_is_run_and_its_finding_returned(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert probe._ops(["cpu_adam"]) == {
        "cpu_adam": {"op": "cpu_adam", "state": "cached", "path": str(tmp_path / "cpu_adam" / "cpu_adam.so")}}


def test_the_jobs_own_extension_dir_is_where_the_check_looks(monkeypatch, tmp_path):
    """`rlrun submit --env TORCH_EXTENSIONS_DIR=...`: the job's workers would load the op from there, not from
    the node's default, so the check runs under the job's value."""
    node_default, jobs = tmp_path / "node", tmp_path / "job"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(node_default))  # the node's env: nothing built there
    (jobs / "cpu_adam").mkdir(parents=True)
    (jobs / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert probe._ops(["cpu_adam"], {"TORCH_EXTENSIONS_DIR": str(jobs)})["cpu_adam"]["state"] == "cached"
    assert probe._ops(["cpu_adam"])["cpu_adam"]["state"] == "missing"


def test_no_ops_asked_runs_nothing(monkeypatch):
    monkeypatch.setattr(probe.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    assert probe._ops([]) == {}


def test_a_check_that_refuses_is_unknown_with_its_last_line():
    found = probe._ops(["cpu_adam", "no_such_op"])
    assert set(found) == {"cpu_adam", "no_such_op"}
    for op, finding in found.items():
        assert finding["op"] == op and finding["state"] == "unknown"
        assert finding["why"].startswith("`python -m trainer.deepspeed_ops --check` exited 2: deepspeed_ops: "
                                         "unknown DeepSpeed op(s) 'no_such_op'"), finding


def test_a_node_whose_python_cannot_run_the_check_is_unknown(monkeypatch, tmp_path):
    """As on a node whose Python has no trainer package (or one too old for --check)."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"No module named trainer.deepspeed_ops\" >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(probe.sys, "executable", str(fake))
    assert probe._ops(["cpu_adam"]) == {"cpu_adam": {
        "op": "cpu_adam", "state": "unknown",
        "why": "`python -m trainer.deepspeed_ops --check` exited 1: No module named trainer.deepspeed_ops"}}
    monkeypatch.setattr(probe.sys, "executable", str(tmp_path / "gone"))
    gone = probe._ops(["cpu_adam"])["cpu_adam"]
    assert gone["state"] == "unknown" and "did not run (FileNotFoundError" in gone["why"]
