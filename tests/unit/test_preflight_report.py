"""The preflight's controller side: cross-host version comparison and the table."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPORT = Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files" / "preflight_report.py"
spec = importlib.util.spec_from_file_location("preflight_report", REPORT)
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

VERSIONS = {"python": "3.11.2", "ray": "2.60.0", "torch": "2.13.0+cpu", "vllm": None}


def host(versions=VERSIONS, problems=(), failures=()):
    return {"check": {"versions": dict(versions), "problems": list(problems)},
            "probe": {"failures": list(failures), "tried": 3}, "error": None}


def test_versions_are_compared_with_the_head():
    data = {"reference": "head", "hosts": {
        "head": host(), "w1": host(), "w2": host({**VERSIONS, "ray": "2.59.0", "vllm": "0.32.0"})}}
    assert report.rows_of(data) == [
        ("w2", "versions", "ray 2.59.0 here, 2.60.0 on head"),
        ("w2", "versions", "vllm 0.32.0 here, missing on head"),
    ]


def test_local_problems_probe_failures_and_silent_hosts_are_rows():
    data = {"reference": "head", "hosts": {
        "head": host(problems=[{"check": "ulimit", "problem": "too low"}]),
        "w1": host(failures=[{"host": "head", "address": "10.0.0.5", "port": 8100, "name": "cluster__ray_gcs_port",
                              "error": "No route to host"},
                             {"host": "head", "url": "http://10.0.0.5:5001/health_check", "error": "HTTP 500"}]),
        "w2": {"check": None, "probe": None, "error": "Failed to connect to the host via ssh"}}}
    assert report.rows_of(data) == [
        ("head", "ulimit", "too low"),
        ("w1", "reachable", "cannot reach head 10.0.0.5:8100 (cluster__ray_gcs_port): No route to host"),
        ("w1", "reward", "reward service of head (http://10.0.0.5:5001/health_check) does not answer from here: HTTP 500"),
        ("w2", "reachable", "Failed to connect to the host via ssh"),
    ]


def test_a_host_whose_probe_failed_is_a_problem():
    data = {"reference": "head", "hosts": {"head": host(), "w1": {**host(), "probe": None}}}
    assert report.rows_of(data) == [("w1", "reachable", "no probe result (the probe failed on this host)")]


def test_the_script_prints_one_table_and_exits_1_on_problems():
    data = {"reference": "head", "hosts": {"head": host(problems=[{"check": "gpus", "problem": "8 > 0"}])}}
    proc = subprocess.run([sys.executable, str(REPORT)], input=json.dumps(data), capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["preflight: 1 problem on 1 host", "host  check  problem",
                                        "----  -----  -------", "head  gpus   8 > 0"]
    clean = {"reference": "head", "hosts": {"head": host(), "w1": host()}}
    proc = subprocess.run([sys.executable, str(REPORT)], input=json.dumps(clean), capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("preflight: no problems on 2 hosts (head, w1)")


def test_a_venv_missing_everywhere_is_a_fresh_cluster_but_missing_somewhere_is_a_problem():
    fresh = {**host(), "check": {"versions": None, "venv_missing": "/v/bin/python", "problems": []}}
    assert report.rows_of({"reference": "head", "hosts": {"head": fresh, "w1": fresh}}) == []
    assert report.rows_of({"reference": "head", "hosts": {"head": host(), "w1": fresh}}) == [
        ("w1", "versions", "no Python at /v/bin/python (the venv is missing; site.yml installs it)")]
