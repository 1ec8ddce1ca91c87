"""Deadlines for everything the trainer waits on while it starts: placement groups, actors, engines, and the
NCCL/gloo groups they form. No silent waits: when a deadline passes the job fails with ONE line that names
what is pending, what it asked for, and what its node has free, e.g.

    vLLM engine 0 not started within 900 s: pending RayWorkerWrapper asks GPU 1 of rlrun-policy bundle 1
    (node 10.0.0.7 has GPU 0.5 of that bundle free; GPU 0, CPU 14 of the node)

Ray waits for ever for an ask nobody can satisfy (an actor asking a whole GPU of a bundle others already hold
half of: the TP > 1 hang), so what is pending comes from Ray's own tables: the job's actors in
PENDING_CREATION with their resource asks (GCS actor table), placement groups still PENDING, and the free
resources per node, placement-group bundles included (``ray._private.state``; its reading is best-effort:
where Ray's private API differs, the line says less but still names what timed out).

The deadlines themselves are flags (``--placement_timeout``, ``--engine_start_timeout``, ``--dist_timeout``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

#: Ray's name for a resource of placement-group bundle ``i``: ``GPU_group_<i>_<pg id hex>`` (``GPU_group_<pg>``:
#: the group's wildcard resource).
_PG_RESOURCE = re.compile(r"^(?P<res>[A-Za-z]+)_group_(?:(?P<bundle>\d+)_)?(?P<pg>[0-9a-f]{16,})$")


class Fault(RuntimeError):
    """A fault the job ends on, whose message is the one line it ends with (naming what failed, where, and the
    last error): a start-up deadline, an engine past --max_engine_restarts, a service past its outage deadline.
    The entry point prints that line instead of a traceback (:func:`fault_line`)."""


class StartupTimeout(Fault):
    """A start-up step did not finish within its deadline; the message is the one line the job ends with."""


def fault_line(error: BaseException) -> str | None:
    """The one line of the :class:`Fault` that ``error`` is or was caused by (a Ray task error's cause, an
    exception's ``__cause__`` / ``__context__``), or None when no fault is behind it."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)  # a RayTaskError: what the remote call raised
        if isinstance(cause, BaseException) and cause is not exc:
            todo.insert(0, cause)
            continue
        if isinstance(exc, Fault):
            return " ".join(str(exc).split())
        todo += [exc.__cause__, exc.__context__]
    return None


def wait_all(refs: Sequence[Any], labels: Sequence[str], timeout_s: float, what: str, *,
             diagnose: bool = True, check: bool = True) -> list[Any]:
    """``ray.get`` of ``refs`` within ``timeout_s``; on expiry raises :class:`StartupTimeout` naming the
    labels still pending and (``diagnose``) what the job's pending actors and placement groups wait for in
    Ray's tables (a process group that does not form has nothing pending there: its line names the ranks
    that did not join). A ref that fails raises its own error at once (a dead actor is not a timeout);
    with ``check=False`` failures are left in their refs for the caller, who gets ``[]``."""
    import ray

    refs = list(refs)
    if not refs:
        return []
    deadline = time.monotonic() + timeout_s
    pending = list(refs)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=min(left, 5.0))
        for ref in done:  # surface a failure now instead of at the deadline
            if check:
                ray.get(ref)
    if pending:
        waiting = [label for ref, label in zip(refs, labels, strict=True) if ref in pending]
        if not diagnose:
            raise StartupTimeout(f"{what} not done within {timeout_s:g} s (waiting for {', '.join(waiting)})")
        raise StartupTimeout(timeout_line(what, timeout_s, waiting))
    return ray.get(refs) if check else []


def timeout_line(what: str, timeout_s: float, waiting: Sequence[str]) -> str:
    """The one line a start-up deadline ends the job with: what did not finish, which of its parts, and what
    Ray says is pending (asks and free resources)."""
    head = f"{what} not done within {timeout_s:g} s"
    if waiting:
        shown = ", ".join(waiting[:4]) + (f" and {len(waiting) - 4} more" if len(waiting) > 4 else "")
        head += f" (waiting for {shown})"
    detail = describe_pending()
    return f"{head}: {detail}" if detail else f"{head}; nothing of this job is pending in Ray (still starting?)"


def describe_pending(job_id: str | None = None) -> str:
    """What the job's pending placement groups and actors ask for and what their nodes have free, as one
    '; '-joined text ('' when nothing is pending or Ray's tables cannot be read)."""
    try:
        return "; ".join(_pending_groups() + _pending_actors(job_id))
    except Exception as exc:  # noqa: BLE001 - private API: a failed reading must not hide the timeout
        return f"(Ray's tables could not be read: {type(exc).__name__}: {exc})"


# --- Ray's tables -------------------------------------------------------------------------------------------
def _node_ips() -> dict[str, str]:
    import ray

    return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if n.get("Alive")}


def _free_per_node() -> dict[str, dict[str, float]]:
    from ray._private import state

    return state.available_resources_per_node()


def _total_per_node() -> dict[str, dict[str, float]]:
    from ray._private import state

    return state.total_resources_per_node()


def _pg_names() -> dict[str, tuple[str, str, dict[int, str]]]:
    """pg id hex -> (name, state, bundle index -> node id)."""
    from ray.util import placement_group_table

    out = {}
    for pg_id, info in placement_group_table().items():
        nodes = {int(k): v for k, v in (info.get("bundles_to_node_id") or {}).items()}
        out[pg_id] = (info.get("name") or pg_id[:8], info.get("state", "?"), nodes)
    return out


def plain_resources(required: dict[str, float], pgs: dict[str, tuple[str, str, dict[int, str]]]) -> tuple[str, str | None, int | None]:
    """An ask as Ray records it (``{"GPU_group_1_<pg>": 0.5, ...}``) -> ("GPU 0.5", pg id, bundle)."""
    plain: dict[str, float] = {}
    pg_id, bundle = None, None
    for key, value in required.items():
        m = _PG_RESOURCE.match(key)
        if m:
            pg_id = m.group("pg")
            if m.group("bundle") is None:
                continue  # the wildcard twin of a bundle resource
            bundle = int(m.group("bundle"))
            key = m.group("res")
        if key == "bundle":
            continue
        plain[key] = plain.get(key, 0.0) + value
    text = ", ".join(f"{k} {v:g}" for k, v in sorted(plain.items(), key=lambda kv: kv[0] != "GPU")) or "nothing"
    return text, pg_id, bundle


def _node_free_text(node_id: str, free: dict[str, dict[str, float]], total: dict[str, dict[str, float]]) -> str:
    have, tot = free.get(node_id, {}), total.get(node_id, {})
    parts = [f"{k} {have.get(k, 0.0):g} of {tot.get(k, 0.0):g}" for k in ("GPU", "CPU") if tot.get(k)]
    return ", ".join(parts) or "no GPU or CPU"


def _pending_groups() -> list[str]:
    pgs = _pg_names()
    out = []
    for _pg_id, (name, state, _nodes) in pgs.items():
        if state == "PENDING":
            free, total, ips = _free_per_node(), _total_per_node(), _node_ips()
            nodes = "; ".join(f"{ips.get(n, n[:8])}: {_node_free_text(n, free, total)}" for n in ips)
            out.append(f"placement group {name} is not placed (free per node: {nodes or 'no alive node'})")
    return out


def _pending_actors(job_id: str | None) -> list[str]:
    import ray
    from ray._common.utils import binary_to_hex
    from ray._private import state
    from ray.core.generated import gcs_pb2

    accessor = state.state._connect_and_get_accessor()  # noqa: SLF001 - Ray exposes no public reader of asks
    job = ray.JobID(bytes.fromhex(job_id or ray.get_runtime_context().get_job_id()))
    rows = accessor.get_actor_table(job, "PENDING_CREATION")
    if not rows:
        return []
    pgs, free, total, ips = _pg_names(), _free_per_node(), _total_per_node(), _node_ips()
    out = []
    starting = []
    for raw in rows:
        actor = gcs_pb2.ActorTableData.FromString(raw)
        ask, pg_id, bundle = plain_resources(dict(actor.required_resources), pgs)
        who = actor.class_name.rsplit(".", 1)[-1] or "actor"
        if actor.pid:  # placed: its process runs the constructor (vLLM start-up, or waiting for its workers)
            node = binary_to_hex(actor.address.node_id)
            starting.append(f"{who} still in its constructor (pid {actor.pid} on {ips.get(node, node[:8])})")
            continue
        if pg_id is None:
            nodes = "; ".join(f"{ips.get(n, n[:8])}: {_node_free_text(n, free, total)}" for n in ips)
            out.append(f"pending {who} asks {ask} (free per node: {nodes or 'no alive node'})")
            continue
        name, _state, bundle_nodes = pgs.get(pg_id, (pg_id[:8], "?", {}))
        where = f"rlrun-{name}" if not name.startswith("rlrun-") else name
        node = bundle_nodes.get(bundle) if bundle is not None else None
        if node is None:
            out.append(f"pending {who} asks {ask} of {where} (not placed yet)")
            continue
        in_bundle = {key: value for key, value in free.get(node, {}).items()
                     if (m := _PG_RESOURCE.match(key)) and m.group("pg") == pg_id and m.group("bundle") == str(bundle)
                     and m.group("res") != "bundle"}
        bundle_free = ", ".join(f"{_PG_RESOURCE.match(k).group('res')} {v:g}" for k, v in sorted(in_bundle.items()))
        out.append(f"pending {who} asks {ask} of {where} bundle {bundle} (node {ips.get(node, node[:8])} has "
                   f"{bundle_free or 'nothing'} of that bundle free; {_node_free_text(node, free, total)} of the node)")
    return out + starting
