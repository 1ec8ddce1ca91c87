"""trainer/files.py: the one atomic replace of a file and of a directory (checkpoints, the retrieval index, the
metrics file, rlrun's files on a Slurm node)."""

from __future__ import annotations

import stat

import pytest

from trainer.files import TMP_PREFIX, replace_dir, replace_file


def test_replace_file_writes_with_its_mode_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "main.yml"
    replace_file(path, "one\n", 0o600)
    replace_file(path, "two\n", 0o600)
    assert path.read_text() == "two\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["main.yml"]


def test_a_replace_that_fails_keeps_the_old_file_and_removes_its_temporary_one(tmp_path):
    path = tmp_path / "latest"
    replace_file(path, "global_step2")
    with pytest.raises(UnicodeEncodeError):
        replace_file(path, "global_step4 \udc80")  # cannot be written as UTF-8: fails in the middle
    assert path.read_text() == "global_step2" and [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_replace_dir_swaps_the_whole_directory_and_removes_the_old_one(tmp_path):
    dst, src = tmp_path / "index", tmp_path / "building"
    dst.mkdir()
    (dst / "meta.json").write_text("old")
    src.mkdir()
    (src / "meta.json").write_text("new")
    replace_dir(src, dst)
    assert (dst / "meta.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def test_a_directory_swap_that_fails_puts_the_old_one_back(tmp_path):
    dst = tmp_path / "global_step4"
    dst.mkdir()
    (dst / "COMPLETE").write_text("{}")
    with pytest.raises(FileNotFoundError):
        replace_dir(tmp_path / f"{TMP_PREFIX}gone", dst)
    assert (dst / "COMPLETE").read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["global_step4"]
