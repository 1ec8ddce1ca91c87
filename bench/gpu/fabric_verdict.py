"""The verdict on a `rlrun check --fabric --json` report of the miniature's two loopback nodes (issue 32).

    python3 bench/gpu/fabric_verdict.py x4 OUT    # OUT/fabric.json -> OUT/verdict.txt, OUT/nccl.txt
    python3 bench/gpu/fabric_verdict.py cpu OUT

The target on x4 (inventory-x4: node1 GPUs 0,1 and node2 GPUs 2,3, each its own NCCL_HOSTID): the report
says `P2P/CUMEM` between the two GPUs of a node and `NET/Socket` between the nodes, and it rests on NCCL's
own lines (written beside it to nccl.txt, per pair, to read against the verdict). On cpu (gloo over lo)
every pair is `gloo/TCP`. Prints one line per pair, the all-reduce, the findings, then PASS or FAIL (exit
status 0 or 1). `bench/gpu/fabric.sh` runs it; so can the pipeline after `miniature/run.sh` with FABRIC=1
(which writes the same fabric.json). Stdlib only (the GPU image's python3).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WANT = {"x4": {"intra": ("P2P/CUMEM",), "inter": ("NET/Socket",)}, "cpu": {"inter": ("gloo/TCP",)}}


def verdict(kind: str, report: dict) -> tuple[list[str], list[str], bool]:
    """(lines to print, NCCL / socket evidence lines, passed)."""
    want = WANT[kind]
    out, evidence, bad = [], [], []
    for p in report.get("pairs", []):
        ok = p.get("status") == "ok" and p.get("transport") in want.get(p["kind"], ())
        gbps = p.get("gbps") or {}
        out.append(f"{'ok  ' if ok else 'FAIL'} {p['a']} <-> {p['b']} ({p['kind']}): {p.get('transport')} on "
                   f"{p.get('interface')}, {gbps.get('a->b', 0):.2f} / {gbps.get('b->a', 0):.2f} GB/s, "
                   f"{p.get('latency_us') or 0:.0f} us; want {' or '.join(want.get(p['kind'], ('?',)))}"
                   + ("" if p.get("status") == "ok" else f" ({p.get('line') or p.get('why') or p.get('status')})"))
        if not ok:
            bad.append(p)
        evidence += [f"# {p['a']} <-> {p['b']} ({p['kind']})", *p.get("evidence", [])]
    missing = [k for k in want if k not in {p["kind"] for p in report.get("pairs", [])}]
    reduce = report.get("allreduce") or {}
    out.append(f"all-reduce: {reduce.get('status')}, {reduce.get('busbw_gbps') or 0:.2f} GB/s busbw, "
               f"connections {reduce.get('transports') or {}}")
    out.append("findings: " + ("; ".join(f"{f['severity']} {f['message']}" for f in report.get("findings", []))
                               or "none") + f"; {report.get('seconds')} s in the job")
    out += [f"FAIL: no {k} pair in the report" for k in missing]
    passed = not bad and not missing
    out.append("PASS" if passed else "FAIL")
    return out, evidence, passed


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in WANT:
        print(f"usage: python3 {argv[0]} x4|cpu OUT (OUT holds fabric.json)", file=sys.stderr)
        return 2
    out = Path(argv[2])
    try:
        report = json.loads((out / "fabric.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"FAIL: no JSON report in {out / 'fabric.json'} ({exc})")
        return 1
    lines, evidence, passed = verdict(argv[1], report)
    (out / "verdict.txt").write_text("\n".join(lines) + "\n")
    (out / "nccl.txt").write_text("\n".join(evidence) + "\n")
    print("\n".join(lines))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
