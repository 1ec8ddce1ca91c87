"""bench/gpu/carry.py, the chunked carry of packages to the GPU machine, run here on a small payload split
into many chunks: the round trip is exact, every step is idempotent on a warm machine (a chunk sent twice is
copied once, a payload installed once), and a missing or damaged chunk stops before anything is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import PROJECT

spec = importlib.util.spec_from_file_location("carry", PROJECT / "bench" / "gpu" / "carry.py")
carry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(carry)


@pytest.fixture()
def payload(tmp_path: Path) -> Path:
    src = tmp_path / "pkg"
    (src / "vllm").mkdir(parents=True)
    (src / "vllm" / "blob.bin").write_bytes(bytes(range(256)) * 40)  # 10 KiB: 10 chunks of 1 KiB
    # The install script records each run, so a second install that ran it would show.
    (src / "install.sh").write_text('set -e\nhere=$(dirname "$0")\nmkdir -p "$1"\n'
                                    'cp "$here/vllm/blob.bin" "$1/"\necho ran >>"$1/runs"\n')
    return src


def test_chunks_travel_and_install_once(payload: Path, tmp_path: Path) -> None:
    m = carry.pack(payload, tmp_path / "out", chunk=1024)
    chunks = sorted((tmp_path / "out").iterdir())
    assert len(chunks) == len(m["parts"]) > 5
    assert all((c / "part").stat().st_size <= 1024 for c in chunks)
    acc, site = tmp_path / "acc", tmp_path / "site"
    for c in chunks:
        assert "received" in carry.receive(c, acc)
    assert "already there" in carry.receive(chunks[3], acc)  # a chunk sent twice is copied once
    assert "installed in" in carry.install(site, acc)
    assert (site / "blob.bin").read_bytes() == (payload / "vllm" / "blob.bin").read_bytes()
    assert "already installed" in carry.install(site, acc)
    assert (site / "runs").read_text() == "ran\n"  # install.sh ran exactly once
    assert carry.status(acc, site) == [f"payload {m['payload_sha256'][:16]}: {len(chunks)}/{len(chunks)} chunks, installed"]


def test_a_missing_chunk_stops_install_before_anything_runs(payload: Path, tmp_path: Path) -> None:
    carry.pack(payload, tmp_path / "out", chunk=1024)
    chunks = sorted((tmp_path / "out").iterdir())
    acc, site = tmp_path / "acc", tmp_path / "site"
    for c in chunks[:2] + chunks[3:]:
        carry.receive(c, acc)
    with pytest.raises(carry.CarryError, match=rf"chunks \[2\] of {len(chunks)} not received"):
        carry.install(site, acc)
    assert not site.exists()
    assert "missing [2]" in carry.status(acc, site)[0]
    carry.receive(chunks[2], acc)
    carry.install(site, acc)
    assert (site / "runs").read_text() == "ran\n"


def test_a_damaged_chunk_is_refused_on_arrival_and_on_install(payload: Path, tmp_path: Path) -> None:
    carry.pack(payload, tmp_path / "out", chunk=1024)
    chunks = sorted((tmp_path / "out").iterdir())
    bad = chunks[1] / "part"
    bad.write_bytes(b"x" + bad.read_bytes()[1:])
    with pytest.raises(carry.CarryError, match="chunk 1 arrived damaged"):
        carry.receive(chunks[1], tmp_path / "acc")
    acc = tmp_path / "acc"
    for c in chunks:
        if c != chunks[1]:
            carry.receive(c, acc)
    (next(acc.iterdir()) / "part.01").write_bytes(b"garbage")  # damaged after arrival
    with pytest.raises(carry.CarryError, match="chunk 1 is damaged"):
        carry.install(tmp_path / "site", acc)


def test_install_with_nothing_received_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(carry.CarryError, match="nothing received.*send the chunks again"):
        carry.install(tmp_path / "site", tmp_path / "acc")


def test_a_payload_without_install_sh_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    with pytest.raises(carry.CarryError, match="no install.sh"):
        carry.pack(tmp_path / "pkg", tmp_path / "out")


def test_a_failing_install_leaves_no_marker(payload: Path, tmp_path: Path) -> None:
    (payload / "install.sh").write_text("echo broken >&2; exit 3\n")
    carry.pack(payload, tmp_path / "out", chunk=4096)
    for c in sorted((tmp_path / "out").iterdir()):
        carry.receive(c, tmp_path / "acc")
    with pytest.raises(carry.CarryError, match="install.sh failed \\(exit 3\\):\n.*broken"):
        carry.install(tmp_path / "site", tmp_path / "acc")
    assert not list(tmp_path.glob("site/.carry-*"))  # a later install runs it again


def test_the_cli_reports_errors_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert carry.main(["install", "--site", str(tmp_path / "s"), "--acc", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("carry: nothing received") and err.count("\n") == 1
