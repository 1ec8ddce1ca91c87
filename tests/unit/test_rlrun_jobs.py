"""runtime_env hygiene and small pure helpers of the CLI."""

import pytest

from rlrun.commands.submit import parse_env
from rlrun.dashboard import Node, check_totals
from rlrun.errors import RlrunError
from rlrun.jobs import build_runtime_env, upload_size


def _tree(root):
    (root / "pkg").mkdir()
    (root / "pkg" / "main.py").write_text("print(1)\n")
    for d in (".git", ".venv", "ckpts", "data", "pkg/__pycache__"):
        (root / d).mkdir(parents=True)
        (root / d / "blob").write_bytes(b"x" * 1000)
    (root / "model.safetensors").write_bytes(b"x" * 1000)


def test_checkpoints_data_git_and_venv_are_not_uploaded(tmp_path):
    _tree(tmp_path)
    size, largest = upload_size(tmp_path, build_runtime_env(tmp_path, {}, [])["excludes"])
    assert [rel for _, rel in largest] == ["pkg/main.py"]
    assert size == len("print(1)\n")


def test_extra_excludes_apply(tmp_path):
    _tree(tmp_path)
    env = build_runtime_env(tmp_path, {"A": "1"}, ["pkg"])
    assert env["env_vars"] == {"A": "1"}
    assert upload_size(tmp_path, env["excludes"])[0] == 0


def test_oversize_upload_is_refused_naming_the_largest_file(tmp_path):
    with open(tmp_path / "huge.npy", "wb") as fh:  # sparse: takes no disk
        fh.truncate(200 * 1024 * 1024)
    with pytest.raises(RlrunError, match=r"would upload 200 MiB.*huge.npy \(200.0 MiB\)"):
        build_runtime_env(tmp_path, {}, [])


def test_no_working_dir_uploads_nothing():
    assert build_runtime_env(None, {}, []) == {}


def test_missing_working_dir_is_named(tmp_path):
    with pytest.raises(RlrunError, match="is not a directory"):
        build_runtime_env(tmp_path / "nope", {}, [])


@pytest.mark.parametrize("bad", ["NOVALUE", "=x"])
def test_env_pairs_need_name_and_value(bad):
    with pytest.raises(RlrunError, match="expected NAME=VALUE"):
        parse_env([bad])


def test_env_pairs_keep_equals_in_values():
    assert parse_env(["A=b=c"]) == {"A": "b=c"}


def _node(ip, cpus, gpus, state="ALIVE"):
    return Node(node_id=ip, node_ip=ip, is_head=False, state=state, cpus=cpus, gpus=gpus)


def test_status_totals_match_the_inventory():
    nodes = [_node("a", 8, 8), _node("b", 8, 8), _node("c", 8, 8, state="DEAD")]
    assert check_totals(nodes, 2, 16, 16) == []


def test_status_totals_name_what_differs():
    nodes = [_node("a", 8, 8), _node("b", 8, 8, state="DEAD")]
    assert check_totals(nodes, 2, 16, 32) == [
        "1 nodes alive, the inventory expects 2",
        "8 CPUs in the cluster, the inventory expects 16",
        "8 GPUs in the cluster, the inventory expects 32",
    ]
