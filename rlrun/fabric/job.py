"""The fabric check's Ray job: ``python -m rlrun.fabric.job REQUEST_JSON``; its last line is ``@fabric {json}``.

``rlrun/fabric/check.py`` ships this file, ``rank.py`` (the actors) and the few modules they import
(``SHIPPED`` there) as the job's working dir, so the check runs the controller's code whatever rlrun the nodes have installed.

What it does, on the environment the trainer gets (every rank is a Ray actor that inherits its node's
``ray start`` environment: the accelerator env file with the NCCL / Gloo interface variables and
``NCCL_HOSTID``; only ``NCCL_DEBUG=INFO`` and a private ``NCCL_DEBUG_FILE`` are added):

1. one rank per GPU (NCCL) or per node (gloo, on CPU clusters), on one placement group with a bundle per
   node (``STRICT_SPREAD``, each bundle pinned to its node);
2. what each node has: versions, interfaces (state, link speed, addresses), InfiniBand adapters;
3. a send/recv between every pair of nodes (their first ranks) and between two GPUs of each node, in
   rounds of disjoint pairs, each pair in a 2-rank group of its own: latency (8-byte ping-pong), GB/s
   each way, and the transport and interface (NCCL: from its INFO lines; gloo: the sockets it opened);
4. an all-reduce across every rank, when every pair got through.

Every collective, the forming of each group included, runs under a deadline
(``trainer.collective_deadline.GroupWatch``): a hang is a line naming both ends, the transport and the
interface, and the check goes on with the other pairs. Nothing is left behind: the actors, the placement
group and the ranks' NCCL log files go at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback

FABRIC_TAG = "@fabric"
PROGRESS = "fabric:"


_STARTED = time.monotonic()


def say(text: str) -> None:
    """A progress line (rlrun check --fabric shows them as they come), with the seconds since the job began."""
    print(f"{PROGRESS} [{time.monotonic() - _STARTED:5.1f} s] {text}", flush=True)


# --- the driver ------------------------------------------------------------------------------------------------
def _rounds(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The pairs in rounds where no rank is in two pairs at once (greedy; the order kept within a round)."""
    rounds: list[list[tuple[int, int]]] = []
    for pair in pairs:
        for r in rounds:
            if not any(set(pair) & set(other) for other in r):
                r.append(pair)
                break
        else:
            rounds.append([pair])
    return rounds


def plan(nodes: list[dict], backend: str) -> tuple[list[dict], list[tuple[int, int, str]]]:
    """The ranks (one per GPU of each GPU node for NCCL, one per node for gloo) and the pairs to test:
    (rank a, rank b, inter|intra). Pure: tested without a cluster."""
    ranks: list[dict] = []
    for node in sorted(nodes, key=lambda n: _ip_key(n["address"])):
        count = int(node["gpus"]) if backend == "nccl" else 1
        for local in range(count):
            ranks.append({"rank": len(ranks), "address": node["address"], "node_id": node["node_id"],
                          "local_rank": local, "bundle": None})
    leaders = [r for r in ranks if r["local_rank"] == 0]
    pairs = [(a["rank"], b["rank"], "inter") for i, a in enumerate(leaders) for b in leaders[i + 1:]]
    pairs += [(r["rank"], r["rank"] + 1, "intra") for r in leaders
              if r["rank"] + 1 < len(ranks) and ranks[r["rank"] + 1]["address"] == r["address"]]
    return ranks, pairs


def _ip_key(address: str) -> tuple:
    try:
        return tuple(int(p) for p in address.split("."))
    except ValueError:
        return (999, address)


def _label(rank: dict, ranks: list[dict], backend: str, gpu: str | None = None) -> str:
    """How lines name a rank: its node's address, with the GPU where a node has several ranks."""
    if backend == "nccl" and sum(r["address"] == rank["address"] for r in ranks) > 1:
        return f"{rank['address']} gpu{gpu if gpu not in (None, '') else rank['local_rank']}"
    return rank["address"]


class Check:
    def __init__(self, req: dict):
        self.req = req
        self.deadline = float(req["deadline_s"])
        self.report: dict = {"deadline_s": self.deadline, "pairs": [], "allreduce": None, "nodes": [],
                             "ranks": [], "problems": [], "skipped_nodes": []}
        self.pg = None
        self.actors: list = []

    def run(self) -> dict:
        # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
        import ray

        t0 = time.monotonic()
        try:
            self._run(ray)
        except Exception as exc:  # noqa: BLE001 - reported, never a traceback instead of a report
            # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
            from trainer.errors import one_line

            self.report["problems"].append({"check": "job", "message": one_line(exc),
                                            "traceback": traceback.format_exc()[-2000:]})
        finally:
            self._cleanup(ray)
        self.report["seconds"] = round(time.monotonic() - t0, 2)
        return self.report

    def _run(self, ray) -> None:
        nodes = [{"address": n["NodeManagerAddress"], "node_id": n["NodeID"],
                  "gpus": int(n["Resources"].get("GPU", 0)), "cpus": n["Resources"].get("CPU", 0),
                  "is_head": "node:__internal_head__" in n["Resources"]}
                 for n in ray.nodes() if n["Alive"]]
        backend = self.req.get("backend") or "auto"
        if backend == "auto":
            backend = "nccl" if any(n["gpus"] for n in nodes) else "gloo"
        self.report["backend"] = backend
        members = [n for n in nodes if n["gpus"] or backend == "gloo"]
        self.report["skipped_nodes"] = [{"address": n["address"], "why": "no GPU"} for n in nodes
                                        if n not in members]
        if not members:
            raise RuntimeError("backend nccl, but no alive node has a GPU (--backend gloo runs one rank per node)")
        size = int(self.req.get("size_bytes") or (256 << 20 if backend == "nccl" else 16 << 20))
        iters = int(self.req.get("iters") or (10 if backend == "nccl" else 5))
        self.report.update(size_bytes=size, iters=iters)
        ranks, pairs = plan(members, backend)
        say(f"{len(ranks)} {backend} rank{'s' if len(ranks) != 1 else ''} on {len(members)} node"
            f"{'s' if len(members) != 1 else ''}; deadline {self.deadline:g} s per collective")
        if not self._place(ray, members, ranks, backend):
            return
        self._start(ray, members, ranks, backend)
        if self.report["problems"]:
            return
        self._pairs(ray, ranks, pairs, size, iters)
        self._allreduce(ray, ranks, size, iters)

    def _place(self, ray, members: list[dict], ranks: list[dict], backend: str) -> bool:
        # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
        from ray.util.placement_group import placement_group

        bundles = []
        for node in sorted(members, key=lambda n: _ip_key(n["address"])):
            bundle = {f"node:{node['address']}": 0.001}
            if backend == "nccl":
                bundle["GPU"] = float(node["gpus"])
            bundles.append(bundle)
        for r in ranks:
            r["bundle"] = next(i for i, b in enumerate(bundles) if f"node:{r['address']}" in b)
        timeout = float(self.req.get("place_timeout_s") or 30)
        self.pg = placement_group(bundles, strategy="STRICT_SPREAD", name="rlrun-fabric-check")
        ready, _ = ray.wait([self.pg.ready()], timeout=timeout)
        if ready:
            say(f"placed: {len(bundles)} bundle{'s' if len(bundles) != 1 else ''}, one per node")
            return True
        free = {}
        try:
            # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
            from ray._private.state import available_resources_per_node

            free = available_resources_per_node()
        except Exception:  # noqa: BLE001 - a private API: the message then says less
            pass
        by_ip = {n["address"]: n["node_id"] for n in members}
        short = []
        for b in bundles:
            ip = next(k[5:] for k in b if k.startswith("node:"))
            have = free.get(by_ip[ip], {})
            if "GPU" in b and have.get("GPU", 0) < b["GPU"]:
                short.append(f"{ip}: {have.get('GPU', 0):g} of {b['GPU']:g} GPUs free (a job holds the others?)")
        self.report["problems"].append({
            "check": "placement",
            "message": f"cannot place {len(ranks)} ranks ({', '.join(map(str, bundles))}) within {timeout:g} s"
                       + (": " + "; ".join(short) if short else "")})
        return False

    def _start(self, ray, members: list[dict], ranks: list[dict], backend: str) -> None:
        # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
        from rlrun.fabric.rank import Rank

        remote = ray.remote(Rank)
        created = time.time()
        for r in ranks:
            label = _label(r, ranks, backend)
            self.actors.append(remote.options(
                num_cpus=0, num_gpus=1 if backend == "nccl" else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=r["bundle"]),
            ).remote(r["rank"], r["address"], label, backend))
        refs = [a.describe.remote(r["local_rank"] == 0) for a, r in zip(self.actors, ranks, strict=True)]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=self.deadline + 60)
        if pending:
            late = [ranks[refs.index(p)]["address"] for p in pending]
            self.report["problems"].append({"check": "start", "message": f"the ranks on {', '.join(late)} did "
                                            f"not start within {self.deadline + 60:g} s"})
            return
        described = ray.get(refs)
        for r, d in zip(ranks, described, strict=True):
            r["label"] = _label(r, ranks, backend, (d.get("gpu") or {}).get("visible"))
            self.report["ranks"].append({k: r[k] for k in ("rank", "address", "label", "local_rank")}
                                        | {"gpu": d.get("gpu"), "pid": d["pid"],
                                           # seconds to the actor's __init__ (Ray starting a worker process with
                                           # the job's working dir), then to its first answer (torch's import)
                                           "start_s": round(d["started"] - created, 2),
                                           "describe_s": round(d["described"] - d["started"], 2)})
            if r["local_rank"] == 0:
                node = next(n for n in members if n["address"] == r["address"])
                self.report["nodes"].append({**{k: node[k] for k in ("address", "node_id", "gpus", "is_head")},
                                             "hostname": d["hostname"], "env": d["env"],
                                             "versions": d["versions"], "interfaces": d["interfaces"],
                                             "infiniband": d["infiniband"]})
        for actor, r in zip(self.actors, ranks, strict=True):
            actor.set_label.remote(r["label"])  # runs before this driver's next call to it (Ray keeps the order)
        slowest = max(self.report["ranks"], key=lambda r: r["start_s"] + r["describe_s"])
        say("ranks up: " + ", ".join(r["label"] for r in ranks) + f" (slowest {slowest['label']}: process "
            f"{slowest['start_s']:.1f} s, torch and the node's facts {slowest['describe_s']:.1f} s)")

    def _budget(self) -> float:
        """How long a driver waits for one test: each of its steps has the deadline, plus slack."""
        return 6 * self.deadline + 30

    def _pairs(self, ray, ranks: list[dict], pairs: list[tuple[int, int, str]], size: int, iters: int) -> None:
        kinds = {(a, b): kind for a, b, kind in pairs}
        for number, batch in enumerate(_rounds([(a, b) for a, b, _ in pairs]), 1):
            calls = []
            for i, (a, b) in enumerate(batch):
                entry = {"a": ranks[a]["label"], "b": ranks[b]["label"], "kind": kinds[(a, b)]}
                self.report["pairs"].append(entry)
                stuck = [ranks[r]["label"] for r in (a, b) if ranks[r].get("stuck")]
                if stuck:
                    entry.update(status="skipped", why=f"{', '.join(stuck)} still hangs in an earlier test")
                    continue
                try:
                    store = ray.get(self.actors[a].listen.remote(), timeout=self._budget())
                except Exception as exc:  # noqa: BLE001 - a rank that died (NCCL's watchdog aborts a hung one)
                    entry.update(status="error", phase="store", line=f"{entry['a']}: {_died(exc)}")
                    ranks[a]["stuck"] = True
                    continue
                spec = {"id": f"{number}.{i}", "store": store, "size": size, "iters": iters, "pings": 20,
                        "deadline": self.deadline}
                calls.append((entry, a, b, [self.actors[a].pair.remote({**spec, "rank": 0}),
                                            self.actors[b].pair.remote({**spec, "rank": 1})]))
            for entry, a, b, refs in calls:
                ready, _ = ray.wait(refs, num_returns=2, timeout=self._budget())
                sides = [_answer(ray, r, ranks[x]["label"]) if r in ready else None
                         for r, x in zip(refs, (a, b), strict=True)]
                self._pair_entry(entry, sides, ranks, a, b)
                say(_pair_summary(entry))

    def _pair_entry(self, entry: dict, sides: list[dict | None], ranks: list[dict], a: int, b: int) -> None:
        # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
        from rlrun.fabric.nccl_log import between, main_transport, parse

        # each side as it answered, without its raw NCCL lines (the evidence below keeps the telling ones)
        entry["sides"] = [s and {k: v for k, v in s.items() if k != "nccl"} for s in sides]
        if any(s is None for s in sides):
            late = [ranks[r]["label"] for r, s in zip((a, b), sides, strict=True) if s is None]
            entry.update(status="no-progress", line=f"{entry['a']} -> {entry['b']}: no answer from "
                         f"{', '.join(late)} in {self._budget():g} s (the rank itself hangs)")
            for r in (a, b):
                ranks[r]["stuck"] = True
            return
        bad = [s for s in sides if s["status"] != "ok"]
        if bad:
            named = [s for s in bad if s.get("line") and " -> " in s["line"].split(":")[0]]
            first = (named or bad)[0]
            entry.update(status=first["status"], phase=first["phase"],
                         line=first.get("line") or f"{first['label']} ({first['phase']}): {first.get('error')}")
            for r, s in zip((a, b), sides, strict=True):
                if s["status"] == "no-progress" and self.report["backend"] == "nccl":
                    ranks[r]["stuck"] = True
        else:
            entry["status"] = "ok"
        gbps = {}
        for s in sides:
            gbps.update(s.get("gbps") or {})
        entry.update(gbps=gbps, latency_us=sides[0].get("latency_us"), connect_s=sides[0].get("connect_s"))
        if self.report["backend"] == "nccl":
            lines = list(dict.fromkeys(sides[0].get("nccl", []) + sides[1].get("nccl", [])))
            log = parse(lines)
            channels = between(log, 0, 1)
            entry["transport"] = main_transport(channels)
            names = [log.interface(c) for c in channels if c.transport == entry["transport"]]
            entry["interface"] = next((n for n in names if n), None)
            entry["nccl_version"] = log.version
            entry["evidence"] = [line for line in lines if " via " in line or " : Using " in line][:12]
        else:
            # gloo's connections of this pair: those both sides see, one's local end the other's remote end
            # (Ray's own connections opened meanwhile have no mirror on the peer)
            mirror = {(s["remote"], s["local"]): s for s in sides[1].get("sockets", [])}
            socks = [(s, mirror[(s["local"], s["remote"])]) for s in sides[0].get("sockets", [])
                     if (s["local"], s["remote"]) in mirror]
            entry["transport"] = "gloo/TCP" if socks else None
            entry["interface"] = ",".join(sorted({x["interface"] or "?" for both in socks for x in both})) or None
            entry["evidence"] = [f"{x['local']} ({x['interface'] or '?'}) <-> {y['local']} ({y['interface'] or '?'})"
                                 for x, y in socks][:12]

    def _allreduce(self, ray, ranks: list[dict], size: int, iters: int) -> None:
        world = len(ranks)
        result: dict = {"ranks": world, "size_bytes": size}
        self.report["allreduce"] = result
        failed = [p for p in self.report["pairs"] if p.get("status") != "ok"]
        if world < 2:
            result.update(status="skipped", why="one rank: nothing to reduce")
        elif failed:
            result.update(status="skipped", why=f"{len(failed)} pair test{'s' if len(failed) != 1 else ''} "
                          "failed; an all-reduce across them would hang as well")
        if "status" in result:
            say(f"all-reduce: {result['status']} ({result['why']})")
            return
        try:
            store = ray.get(self.actors[0].listen.remote(), timeout=self._budget())
        except Exception as exc:  # noqa: BLE001
            result.update(status="error", line=f"all-reduce: {ranks[0]['label']}: {_died(exc)}")
            return
        spec = {"store": store, "size": size, "iters": iters, "deadline": self.deadline, "world": world}
        refs = [a.allreduce.remote({**spec, "rank": r["rank"]}) for a, r in zip(self.actors, ranks, strict=True)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._budget())
        sides = [_answer(ray, r, rank["label"]) if r in ready else None for r, rank in zip(refs, ranks, strict=True)]
        if any(s is None for s in sides):
            late = [r["label"] for r, s in zip(ranks, sides, strict=True) if s is None]
            result.update(status="no-progress", line=f"all-reduce over {world} ranks: no answer from "
                          f"{', '.join(late)} in {self._budget():g} s")
        elif any(s["status"] != "ok" for s in sides):
            bad = [s for s in sides if s["status"] != "ok"]
            named = [s for s in bad if s.get("line") and " -> " in s["line"].split(":")[0]]
            first = (named or bad)[0]
            result.update(status=first["status"], phase=first["phase"],
                          line=first.get("line") or f"all-reduce: {first['label']}: {first.get('error')}")
        else:
            seconds = max(s["seconds"] for s in sides)
            algbw = size / seconds / 1e9
            result.update(status="ok", seconds=seconds, algbw_gbps=algbw, busbw_gbps=algbw * 2 * (world - 1) / world)
        if self.report["backend"] == "nccl":
            # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
            from rlrun.fabric.nccl_log import parse

            lines = [line for s in sides if s for line in s.get("nccl", [])]
            result["transports"] = parse(lines).transports()
        say("all-reduce: " + (f"{result['busbw_gbps']:.2f} GB/s bus bandwidth over {world} ranks"
                              if result["status"] == "ok" else result.get("line", result["status"])))

    def _cleanup(self, ray) -> None:
        """The actors (closing their files first; a rank whose collective hangs still answers: the hang is
        on a helper thread), then the placement group."""
        if self.actors:
            refs = [a.close.remote() for a in self.actors]
            ray.wait(refs, num_returns=len(refs), timeout=10)
        for actor in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                ray.util.remove_placement_group(self.pg)


def _died(exc: BaseException) -> str:
    # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
    from trainer.errors import one_line

    return f"the rank is gone ({one_line(exc)})"


def _answer(ray, ref, label: str) -> dict:
    """A rank's answer; a rank that died meanwhile (NCCL's watchdog aborts a process whose collective hangs
    past the group's timeout) answers as an error."""
    try:
        return ray.get(ref)
    except Exception as exc:  # noqa: BLE001
        return {"label": label, "status": "error", "phase": "?", "error": _died(exc)}


def _pair_summary(entry: dict) -> str:
    head = f"{entry['a']} <-> {entry['b']} ({entry['kind']}): "
    if entry.get("status") == "ok":
        gbps = entry.get("gbps") or {}
        return head + (f"{gbps.get('a->b', 0):.2f} / {gbps.get('b->a', 0):.2f} GB/s, "
                       f"{entry.get('latency_us') or 0:.0f} us, {entry.get('transport') or '?'}"
                       + (f" on {entry['interface']}" if entry.get("interface") else ""))
    return head + (entry.get("line") or entry.get("why") or entry.get("status", "?"))


def main(argv: list[str]) -> int:
    # the job's side: loaded on the nodes where it runs (the controller imports only the constants)
    import ray

    if len(argv) != 2:
        print("usage: python -m rlrun.fabric.job REQUEST_JSON", file=sys.stderr)
        return 2
    req = json.loads(argv[1])
    ray.init(log_to_driver=False)
    say("connected to the cluster")
    report = Check(req).run()
    print(FABRIC_TAG, json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    # The actors' class by its module's name (rlrun.fabric.job, importable from the job's working dir on
    # every node), not __main__'s.
    from rlrun.fabric.job import main as _main

    sys.exit(_main(sys.argv))
