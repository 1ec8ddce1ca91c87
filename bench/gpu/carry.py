"""Carry a folder of packages to the GPU machine in chunks, and install it there once.

The device tool carries at most 64 MiB a call, and the machine keeps ``/tmp`` only while it stays warm
(~30 s between calls): a large payload travels as chunks of <= 60 MiB, one call each, sent back to back,
and a later call joins and installs them (docs/gpu-machine.md). Stdlib only: it runs here (Python 3.11)
and on the machine's Python 3.12.

    here:   python3 bench/gpu/carry.py pack .gpu-pkg .gpu-carry      # -> .gpu-carry/c00, c01, ...
    there:  python3 bench/gpu/carry.py receive .gpu-carry/c01        # one chunk per call (carry: .gpu-carry/c01)
            python3 bench/gpu/carry.py install --site /tmp/site      # joins, checks, runs install.sh SITE
            python3 bench/gpu/carry.py status                        # what is there, what is missing

Every step is idempotent on a warm machine: ``receive`` of a chunk already there (same sha256) copies
nothing; ``install`` of a payload already installed (its sha256 recorded in SITE) runs nothing and says so;
a missing or damaged chunk stops ``install`` before anything is touched, naming the chunk.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

CHUNK = 60 << 20
MANIFEST = "manifest.json"
ACC = Path(os.environ.get("RLRUN_CARRY_ACC", "/tmp/acc"))


class CarryError(RuntimeError):
    """A step cannot go on; the message says what is missing or wrong."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(src: Path, out: Path, chunk: int = CHUNK) -> dict:
    """Tar ``src`` (which must hold ``install.sh``) and split it into ``out/cNN/part`` + a manifest each."""
    src, out = Path(src), Path(out)
    if not (src / "install.sh").is_file():
        raise CarryError(f"{src} has no install.sh: the payload must say how it is installed (install.sh SITE)")
    if chunk <= 0 or chunk > 62 << 20:
        raise CarryError(f"chunk size {chunk} bytes: expected 1 .. {62 << 20} (the device call carries 64 MiB)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # the packages are compressed already
        for path in sorted(src.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(src)), recursive=False)
    data = buf.getvalue()
    parts = [data[i:i + chunk] for i in range(0, len(data), chunk)]
    manifest = {"payload_sha256": hashlib.sha256(data).hexdigest(), "payload_bytes": len(data),
                "parts": [hashlib.sha256(p).hexdigest() for p in parts]}
    if out.exists():
        shutil.rmtree(out)
    for i, part in enumerate(parts):
        d = out / f"c{i:02d}"
        d.mkdir(parents=True)
        (d / "part").write_bytes(part)
        (d / MANIFEST).write_text(json.dumps({**manifest, "index": i}))
    return manifest


def _read_manifest(chunk_dir: Path) -> dict:
    path = Path(chunk_dir) / MANIFEST
    if not path.is_file():
        raise CarryError(f"{chunk_dir}: no {MANIFEST}; expected a chunk folder made by `carry.py pack`")
    return json.loads(path.read_text())


def receive(chunk_dir: Path, acc: Path = ACC) -> str:
    """Copy one chunk into ``acc`` (checked against its manifest); a chunk already there is left alone."""
    m = _read_manifest(chunk_dir)
    i, want = m["index"], m["parts"][m["index"]]
    dest = Path(acc) / m["payload_sha256"][:16]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MANIFEST).write_text(json.dumps({k: v for k, v in m.items() if k != "index"}))
    target = dest / f"part.{i:02d}"
    if target.is_file() and sha256_file(target) == want:
        return f"chunk {i + 1}/{len(m['parts'])}: already there"
    got = sha256_file(Path(chunk_dir) / "part")
    if got != want:
        raise CarryError(f"chunk {i} arrived damaged: sha256 {got[:12]}..., its manifest says {want[:12]}...")
    tmp = target.with_suffix(".tmp")
    shutil.copyfile(Path(chunk_dir) / "part", tmp)
    os.replace(tmp, target)
    return f"chunk {i + 1}/{len(m['parts'])}: received ({target.stat().st_size / 2**20:.1f} MiB)"


def _payloads(acc: Path) -> list[Path]:
    return sorted((p for p in Path(acc).glob("*") if (p / MANIFEST).is_file()), key=lambda p: p.stat().st_mtime)


def status(acc: Path = ACC, site: Path | None = None) -> list[str]:
    """One line per payload in ``acc``: chunks there and missing, installed or not."""
    lines = []
    for d in _payloads(acc):
        m = json.loads((d / MANIFEST).read_text())
        missing = [i for i, h in enumerate(m["parts"]) if not (d / f"part.{i:02d}").is_file()]
        installed = site is not None and (Path(site) / f".carry-{m['payload_sha256'][:16]}").exists()
        lines.append(f"payload {d.name}: {len(m['parts']) - len(missing)}/{len(m['parts'])} chunks"
                     + (f", missing {missing}" if missing else "") + (", installed" if installed else ""))
    return lines or [f"no payload in {acc}"]


def install(site: Path, acc: Path = ACC) -> str:
    """Join the latest payload's chunks, check them, unpack and run its ``install.sh SITE`` once."""
    payloads = _payloads(acc)
    if not payloads:
        raise CarryError(f"nothing received in {acc}: run `carry.py receive` for each chunk first (a cold "
                         "machine has lost /tmp: send the chunks again)")
    d = payloads[-1]
    m = json.loads((d / MANIFEST).read_text())
    marker = Path(site) / f".carry-{m['payload_sha256'][:16]}"
    if marker.exists():
        return f"payload {d.name} already installed in {site}"
    missing = [i for i in range(len(m["parts"])) if not (d / f"part.{i:02d}").is_file()]
    if missing:
        raise CarryError(f"payload {d.name}: chunks {missing} of {len(m['parts'])} not received; send them "
                         "(carry.py receive) and run install again")
    h = hashlib.sha256()
    joined = d / "payload.tar"
    with open(joined, "wb") as out:
        for i, want in enumerate(m["parts"]):
            part = (d / f"part.{i:02d}").read_bytes()
            if hashlib.sha256(part).hexdigest() != want:
                raise CarryError(f"payload {d.name}: chunk {i} is damaged; receive it again")
            h.update(part)
            out.write(part)
    if h.hexdigest() != m["payload_sha256"]:
        raise CarryError(f"payload {d.name}: joined chunks do not match the payload's sha256")
    unpacked = d / "payload"
    if unpacked.exists():
        shutil.rmtree(unpacked)
    with tarfile.open(joined) as tar:
        tar.extractall(unpacked, filter="data")
    joined.unlink()
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(unpacked / "install.sh"), str(site)], capture_output=True, text=True)
    if done.returncode != 0:
        raise CarryError(f"install.sh failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"installed": time.time(), "from": str(unpacked)}))
    return f"payload {d.name} installed in {site} in {time.monotonic() - t0:.0f} s (packages kept in {unpacked})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("pack", help="here: DIR -> OUT/c00, c01, ... (one chunk a device call)")
    sp.add_argument("src")
    sp.add_argument("out")
    sp.add_argument("--chunk-mib", type=int, default=CHUNK >> 20)
    sr = sub.add_parser("receive", help="there: copy one chunk folder into the accumulator")
    sr.add_argument("chunk_dir")
    for name in ("install", "status"):
        s = sub.add_parser(name)
        s.add_argument("--site", default="/tmp/site")
    for s in sub.choices.values():
        s.add_argument("--acc", default=str(ACC))
    args = p.parse_args(argv)
    try:
        if args.cmd == "pack":
            m = pack(Path(args.src), Path(args.out), args.chunk_mib << 20)
            print(f"{len(m['parts'])} chunks of <= {args.chunk_mib} MiB in {args.out} "
                  f"({m['payload_bytes'] / 2**20:.1f} MiB, sha256 {m['payload_sha256'][:16]})")
        elif args.cmd == "receive":
            print(receive(Path(args.chunk_dir), Path(args.acc)))
        elif args.cmd == "install":
            print(install(Path(args.site), Path(args.acc)))
        else:
            print("\n".join(status(Path(args.acc), Path(args.site))))
    except CarryError as e:
        print(f"carry: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
