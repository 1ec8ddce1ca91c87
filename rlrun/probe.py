"""The probe job: look at the nodes of a live cluster before a trainer job is submitted.

``run_probe`` submits this file's own source as a small Ray job (``python -c SOURCE REQUEST``, no
working dir, no resources: it runs where the trainer's driver will, on the head) through the Jobs
API with the cluster token. The job runs one zero-CPU task pinned to each alive node that reports
which paths (and Hugging Face cache entries) are missing there and whether the job's retrieval service
(``--retriever_url`` with that node's address) answers there and, for the DeepSpeed ops the job loads
(``cpu_adam`` with ``--adam_offload``), whether each is built there or could be (the node's own
``python -m trainer.deepspeed_ops --check``, which builds nothing); it checks the head-only paths and the
reward services' ``/health_check`` from the head, and prints one ``@probe {json}`` line. The job is
deleted afterwards. Sending the source (rather than importing rlrun on the nodes) keeps the probe
right even when the nodes run an older rlrun.

Only the standard library and Ray are used inside the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

PROBE_TAG = "@probe"
PROBE_JOB_PREFIX = "rlrun-probe-"  # `rlrun list` leaves these out (unless --all)


def _look(paths: list[str], hub_ids: list[str], retriever_url: str | None = None, ops: list[str] | None = None,
          ops_env: dict[str, str] | None = None) -> tuple[str, list[str], str | None, dict[str, dict]]:
    """On one node: (its IP, the paths and hub ids missing there, the health of the job's retrieval service on
    this node: its URL with the node's own address for {node_ip}, None without one; where each of ``ops``
    stands there: see _ops)."""
    import ray  # inside the probe job only (this runs on a node); rlrun's own commands never import Ray here

    hub_cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    missing = [p for p in paths if not os.path.exists(os.path.expanduser(p))]
    missing += [h for h in hub_ids if not os.path.isdir(os.path.join(hub_cache, "models--" + h.replace("/", "--")))]
    ip = ray.util.get_node_ip_address()
    searched = _health(retriever_url.replace("{node_ip}", ip)) if retriever_url else None
    return ip, missing, searched, _ops(ops or [], ops_env)


def _ops(ops: list[str], env: dict[str, str] | None = None, timeout: float = 45.0) -> dict[str, dict]:
    """Op name -> the node's ``trainer.deepspeed_ops --check`` line for it (state installed / cached / missing,
    buildable, why), run with the Python and environment a job's workers get here (the node's, with ``env``: the
    job's own values of the variables that decide it); on a node where that cannot run, {"state": "unknown",
    "why": ...} for each op."""
    if not ops:
        return {}
    try:
        done = subprocess.run([sys.executable, "-m", "trainer.deepspeed_ops", "--check", *ops], capture_output=True,
                              text=True, timeout=timeout, cwd="/", check=False,
                              env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"`python -m trainer.deepspeed_ops --check` did not run ({type(exc).__name__}: {exc})"
        return {op: {"op": op, "state": "unknown", "why": why} for op in ops}
    found = {}
    for line in done.stdout.splitlines():
        with contextlib.suppress(ValueError, TypeError, KeyError):
            line_found = json.loads(line)
            found[line_found["op"]] = line_found
    if done.returncode != 0 or set(found) != set(ops):
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = f"`python -m trainer.deepspeed_ops --check` exited {done.returncode}: {last[-300:]}"
        return {op: found.get(op) or {"op": op, "state": "unknown", "why": why} for op in ops}
    return found


def _health(url: str, timeout: float = 5.0) -> str:
    """'ok' when the service behind `url` (.../get_reward) answers /health_check with 200, else why not."""
    cafile = os.environ.get("RLRUN_REWARD_CA_FILE")  # rlrun nodes export it with cluster__reward_tls
    context = ssl.create_default_context(cafile=cafile) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url.rsplit("/", 1)[0] + "/health_check", timeout=timeout,
                                    context=context) as resp:
            return "ok" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"unreachable ({type(exc).__name__}: {getattr(exc, 'reason', exc)})"


def main(argv: list[str]) -> int:
    """Inside the probe job: argv[1] is the request (see ``jobcheck.probe_request``)."""
    import ray  # inside the probe job only, as in _look
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    req = json.loads(argv[1])
    ray.init(log_to_driver=False)
    look = ray.remote(num_cpus=0)(_look)
    refs = [look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
            .remote(req["paths"], req["hub_ids"], req.get("retriever_url"), req.get("ops"), req.get("ops_env"))
            for n in ray.nodes() if n["Alive"]]
    missing: dict[str, list[str]] = {}
    retriever: dict[str, str] = {}
    ops: dict[str, dict[str, dict]] = {}
    for ip, gone, searched, op_states in ray.get(refs, timeout=req.get("timeout", 60)):
        for item in gone:
            missing.setdefault(item, []).append(ip)
        if searched is not None:
            retriever[ip] = searched
        if op_states:
            ops[ip] = op_states
    head = ray.util.get_node_ip_address()
    for path in req["head_paths"]:
        if not os.path.exists(os.path.expanduser(path)):
            missing.setdefault(path, []).append(head)
    reward = {url: _health(url) for url in req["reward_urls"]}
    print(PROBE_TAG, json.dumps({"missing": missing, "reward": reward, "head": head, "retriever": retriever,
                                 "ops": ops}), flush=True)
    return 0


def parse_probe_log(text: str) -> dict | None:
    for line in text.splitlines():
        if line.startswith(PROBE_TAG + " "):
            return json.loads(line[len(PROBE_TAG) + 1:])
    return None


def run_probe(jobs, request: dict, timeout: float = 120.0) -> dict:
    """Submit the probe job, wait for it, return its findings; the job is deleted afterwards."""
    source = Path(__file__).read_text(encoding="utf-8")
    request = {**request, "timeout": timeout / 2}
    job_id, status, logs = run_short_job(jobs, ["python", "-c", source, json.dumps(request)], {}, "probe", timeout)
    found = parse_probe_log(logs) if status == "SUCCEEDED" else None
    if found is None:
        # Not at the top: this file's source runs on the head as the probe job, where rlrun may not be importable
        # (only the standard library and Ray are used there).
        from rlrun.errors import RlrunError

        tail = "\n".join(logs.strip().splitlines()[-15:])
        raise RlrunError(f"the probe job {job_id} ended {status} without findings; its log ends:\n{tail}\n"
                         "(skip the cluster checks with --no-check)")
    return found


def run_short_job(jobs, entrypoint: list[str], runtime_env: dict, what: str, timeout: float = 120.0
                  ) -> tuple[str, str, str]:
    """Run a short look-around job (``rlrun list`` hides it) to its end: (job id, final status, log); the job is
    deleted afterwards. Past ``timeout`` it is stopped and the error names ``what`` it was for."""
    from rlrun.errors import RlrunError  # as in run_probe

    kind = "" if what == "probe" else f"{what}-"
    job_id = f"{PROBE_JOB_PREFIX}{kind}{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    jobs.submit(entrypoint, runtime_env, job_id, metadata={"rlrun": what})
    deadline = time.monotonic() + timeout
    status = jobs.status(job_id)
    while status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        if time.monotonic() > deadline:
            jobs.stop(job_id)
            raise RlrunError(f"the {what} job {job_id} did not finish within {timeout:.0f} s (is the cluster busy "
                             "or a node unresponsive?); skip the cluster checks with --no-check")
        time.sleep(0.5)
        status = jobs.status(job_id)
    logs = jobs.logs(job_id)
    with contextlib.suppress(Exception):  # a leftover look-around job is harmless
        jobs.client.delete_job(job_id)
    return job_id, status, logs


if __name__ == "__main__":
    sys.exit(main(sys.argv))
