"""trainer.deepspeed_ops: what ray_node__deepspeed_ops runs on a node. Its build ("built", then "cached" at
idempotence, the library under the node's state dir) runs in molecule/ray_node; here the refusals, which must
come before anything is built, and a build that fails for want of a compiler; and --check (what rlrun
submit's probe job runs on the nodes of an --adam_offload job), which builds nothing."""

import json
import os
import sys

import pytest

from trainer import deepspeed_ops
from trainer.deepspeed_ops import OpError, check_names, known_ops, main


def test_the_nodes_ops_include_cpu_adam():
    assert "cpu_adam" in known_ops()


@pytest.mark.parametrize("names, named", [(["cpu_adamm"], ["'cpu_adamm'"]),
                                          (["cpu_adam", "lion", "x"], ["'lion'", "'x'"])])
def test_unknown_ops_are_refused_with_the_ones_this_node_has(names, named):
    with pytest.raises(OpError) as e:
        check_names(names, known_ops())
    assert e.value.code == 2
    message = str(e.value)
    for name in named:
        assert name in message
    assert "'cpu_adam'" not in message  # a known name is not called unknown
    assert "cpu_adam" in message.split("has", 1)[1]  # ... but listed among the node's ops


def test_no_op_named_is_refused():
    with pytest.raises(OpError, match="no op named: expected one or more of .*cpu_adam"):
        check_names([], {"cpu_adam": object()})


def test_an_unknown_op_builds_nothing(monkeypatch, capsys):
    """One bad name among good ones: exit 2 before any op is built (nothing half done)."""
    built = []
    monkeypatch.setattr(deepspeed_ops, "build", lambda name, builder: built.append(name))
    assert main(["cpu_adam", "nope"]) == 2
    out, err = capsys.readouterr()
    assert built == [] and out == ""
    assert "unknown DeepSpeed op(s) 'nope'" in err


def test_a_build_without_a_compiler_fails_naming_the_op_and_what_it_needs(monkeypatch, tmp_path, capsys):
    """A real JIT build of cpu_adam whose compiler is /bin/false (torch reads CXX), in an empty cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    assert main(["cpu_adam"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"DeepSpeed op 'cpu_adam' did not build in {tmp_path / 'cpu_adam'}" in err
    assert "C++ compiler" in err and "ninja" in err
    assert not (tmp_path / "cpu_adam" / "cpu_adam.so").exists()


def test_a_build_removes_a_killed_builds_lock_before_it_loads(monkeypatch, tmp_path, capsys):
    """The same real build, over a lock a killed build left two hours ago: torch would have waited on it for
    ever; the build removes it first, says so, and gets as far as the compiler."""
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    lock = tmp_path / "cpu_adam" / "lock"
    lock.parent.mkdir()
    lock.touch()
    os.utime(lock, (time.time() - 7200, time.time() - 7200))
    assert main(["cpu_adam"]) == 1
    _, err = capsys.readouterr()
    assert f"deepspeed_ops: removed {lock}, a build lock 1 h old or more" in err
    assert "did not build in" in err  # it reached the compiler instead of waiting


def _check(capsys) -> dict:
    assert main(["--check", "cpu_adam", "cpu_adam"]) == 0
    out, _ = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1  # one line per op, each op once
    return json.loads(lines[0])


def test_check_finds_cpu_adam_missing_and_buildable_with_a_compiler_and_ninja(monkeypatch, tmp_path, capsys):
    ext = tmp_path / "ext"  # a node whose jobs have built nothing yet: no cache directory at all
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    monkeypatch.setenv("CXX", sys.executable)  # any executable on the path: --check only looks for it
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])  # the venv's ninja
    assert _check(capsys) == {"op": "cpu_adam", "state": "missing", "path": str(ext / "cpu_adam" / "cpu_adam.so"),
                              "buildable": True}
    assert list(tmp_path.iterdir()) == []  # nothing built, not even torch's empty build directory


def test_the_check_finds_where_a_build_puts_the_op(monkeypatch, tmp_path):
    """The path --check reports (torch's directory maker held back) is the one a build's load uses."""
    import torch.utils.cpp_extension as cpp_extension

    from trainer.deepspeed_ops import _library

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    looked = _library("cpu_adam", make=False)
    assert not (tmp_path / "ext").exists()
    assert cpp_extension.os is os  # torch's module has its os back
    made = _library("cpu_adam")  # as a load: torch makes the directory it will build in
    assert made == looked == tmp_path / "ext" / "cpu_adam" / "cpu_adam.so" and made.parent.is_dir()


def test_check_says_why_cpu_adam_cannot_be_built(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no ninja either
    found = _check(capsys)
    assert found["state"] == "missing" and found["buildable"] is False
    assert found["why"] == f"no C++ compiler {str(tmp_path / 'no-such-c++')!r} on PATH; no ninja on PATH"


def test_check_finds_a_cached_build_where_a_load_would_look(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))  # a cached op needs no compiler
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    assert _check(capsys) == {"op": "cpu_adam", "state": "cached", "path": str(tmp_path / "cpu_adam" / "cpu_adam.so")}


def test_check_refuses_unknown_ops_as_a_build_does(capsys):
    assert main(["--check", "cpu_adamm"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "unknown DeepSpeed op(s) 'cpu_adamm'" in err


def test_a_killed_builds_lock_is_removed_and_a_running_builds_is_kept(monkeypatch, tmp_path, capsys):
    """torch waits for a build lock to go, for ever: one an hour old (a killed build's, in a cache that outlives
    jobs) goes before a build; a younger one (another process building now) stays."""
    import time

    from trainer.deepspeed_ops import STALE_LOCK_S, clear_stale_lock

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "cpu_adam" / "lock"
    assert clear_stale_lock("cpu_adam") is None  # no cache, no lock: nothing made either
    assert list(tmp_path.iterdir()) == []
    lock.parent.mkdir()
    lock.touch()
    os.utime(lock, (time.time() - 60, time.time() - 60))
    assert clear_stale_lock("cpu_adam") is None and lock.exists()
    os.utime(lock, (time.time() - STALE_LOCK_S - 5, time.time() - STALE_LOCK_S - 5))
    assert clear_stale_lock("cpu_adam") == lock and not lock.exists()
