"""A lab that a killed run left behind must not fail the next run, and a lab in use must never be taken.

This is what failed a CI run: a CI run killed during the multinode scenario left lab 51 (namespaces,
bridge, sshds), and the next run's `create` refused it. The labs now record their holder (PID + start
time); `create` removes a lab whose holder has ended, says so, and still refuses one whose holder runs.
Real labs (lab 58: one namespace host with its sshd; slurm lab 62: its directory), real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.netns import Lab, LabError, find_holder, holder_alive, holder_record
from tests.lab.slurm import SlurmLab, SlurmLabError
from trainer.procs import alive

pytestmark = pytest.mark.integration

NETNS = Path(__file__).resolve().parents[1] / "lab" / "netns.py"
HOSTS = {"h": "10.244.58.11"}


@pytest.fixture
def holder():
    """A process standing for the run that holds a lab (a pytest or molecule process)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def clean_lab():
    yield
    Lab(58).destroy()
    SlurmLab(62).destroy()
    assert Lab(58).leftovers() == [] and SlurmLab(62).leftovers() == []


def test_a_lab_whose_holder_ended_is_removed_by_the_next_create(holder, clean_lab, capsys):
    first = Lab(58, dict(HOSTS), owner="run-1", holder=holder.pid).create()
    sshd = first.pids("h")
    assert sshd and json.loads((first.dir / "lab.json").read_text())["holder"]["pid"] == holder.pid
    # The run is killed before its teardown: the lab stays, its holder is gone.
    holder.kill()
    holder.wait()
    capsys.readouterr()
    second = Lab(58, dict(HOSTS), owner="run-2").create()
    err = capsys.readouterr().err
    assert f"lab 58: its holder (pid {holder.pid}: sleep 600; owner run-1) has ended" in err
    assert not any(alive(p) for p in sshd), "the left lab's sshd still runs"
    assert second.ssh("h", "hostname").stdout.strip() == "h"


def test_a_lab_whose_holder_runs_is_refused_and_left_as_it_is(holder, clean_lab):
    Lab(58, dict(HOSTS), owner="run-1", holder=holder.pid).create()
    before = Lab(58).leftovers()
    with pytest.raises(LabError, match=rf"held by pid {holder.pid} \(sleep 600\), which still runs"):
        Lab(58, dict(HOSTS), owner="run-2").create()
    assert Lab(58).leftovers() == before


def test_a_lab_without_a_holder_is_never_removed_by_create(clean_lab):
    # What `netns.py create` without --holder makes (and what older runs made): kept until `destroy`.
    Lab(58, dict(HOSTS), holder=None).create()
    with pytest.raises(LabError, match="these exist already: namespace rlrun58-h"):
        Lab(58, dict(HOSTS)).create()


def test_the_slurm_lab_removes_what_an_ended_holder_left(holder, clean_lab, capsys):
    lab = SlurmLab(62)
    lab.dir.mkdir()
    (lab.dir / "lab.json").write_text(json.dumps({"index": 62, "owner": "run-1", "holder": holder_record(holder.pid)}))
    with pytest.raises(SlurmLabError, match=rf"directory /tmp/rlrun-slurm62.*held by pid {holder.pid}"):
        lab._refuse_existing()
    holder.kill()
    holder.wait()
    lab._refuse_existing()  # the holder ended: the directory goes, nothing else stands in the way
    assert not lab.dir.exists() and "slurm lab 62: its holder" in capsys.readouterr().err


def test_a_holder_is_one_process_not_a_reused_pid(holder):
    record = holder_record(holder.pid)
    assert holder_alive(record)
    assert not holder_alive({**record, "start": record["start"] - 1})  # same PID, another process
    assert not holder_alive({"pid": holder.pid})  # no start time recorded: not provably the same


def test_holder_by_name_is_the_nearest_ancestor_of_that_name():
    # bash (kept alive by the `; true`) runs python, which looks for its nearest ancestor named bash.
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from netns import find_holder; "
            "print(find_holder('bash'), os.getppid())")
    proc = subprocess.run(["bash", "-c", f'"{sys.executable}" -c "$0" "$1"; true', code, str(NETNS.parent)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found, parent = proc.stdout.split()
    assert found == parent
    with pytest.raises(LabError, match="--holder 'no-such-program': no process named 'no-such-program' among"):
        find_holder("no-such-program")


def test_the_cli_refuses_a_holder_that_is_not_there():
    proc = subprocess.run([sys.executable, str(NETNS), "create", "--index", "58", "--host", "h=10.244.58.11",
                           "--holder", "molecule"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "error: --holder 'molecule': no process named 'molecule' among this command's ancestors" in proc.stderr
    assert Lab(58).leftovers() == []
