"""The services beside Ray: the reward service's settings on its hosts, and the retrieval service's (which
hosts run one, what each serves, one port for all)."""

from __future__ import annotations

from pathlib import Path

from rlrun.checks import vocabulary as V
from rlrun.checks.problems import NOTHING, Recorder
from rlrun.checks.shapes import path_problem, whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN, InventoryView


def check_reward(r: Recorder, host: str) -> None:
    for var in N.reward_workers:
        value = r.user_value(host, var)
        if value not in (UNKNOWN, None) and (not whole(value) or int(value) < 1):
            r.add(host, var, value, "must be a whole number, 1 or more")
    timeout = r.user_value(host, N.reward_timeout)
    if timeout not in (UNKNOWN, None) and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                           or timeout <= 0):
        r.add(host, N.reward_timeout, timeout, "must be a number of seconds > 0")
    extract = r.user_value(host, N.reward_extract)
    if extract not in (UNKNOWN, None):
        known = V.reward_strategies()  # the service's, as the role lists them (checked against trainer/reward)
        raw = r.raw(host)[N.reward_extract]
        if not isinstance(extract, list):
            r.add(host, N.reward_extract, raw, f"must be a list such as [{', '.join(known[:2])}] (null: the "
                  f"service's default order) of {', '.join(known)}")
        else:
            wrong = [s for s in extract if s not in known]
            if not extract or wrong:
                r.add(host, N.reward_extract, raw, "must be null (the service's default order) or a non-empty list "
                      "of " + ", ".join(known) + (f": {', '.join(map(str, wrong))} is not one" if wrong else ""))


def retriever_hosts(view: InventoryView, nodes: list[str]) -> list[str]:
    """roles/cluster's cluster__retriever_hosts: group retrievers; without it, every Ray node once one of them
    names a corpus or an index."""
    g = view.groups
    if "retrievers" in g:
        return list(g["retrievers"])
    serving = [h for h in nodes if N.retriever_corpus in view.raw(h) or N.retriever_index in view.raw(h)]
    return list(nodes) if serving else []


def check_retriever(r: Recorder, host: str) -> None:
    raw = r.raw(host)
    corpus, index = raw.get(N.retriever_corpus), raw.get(N.retriever_index)
    if bool(corpus) == bool(index):
        if corpus:
            r.add(host, N.retriever_corpus, corpus, "and retriever__index_dir are both set: set one, the corpus to "
                  "index on each node or the prebuilt index")
        else:
            r.add(host, "group retrievers", NOTHING, "holds this host, but neither retriever__corpus (a JSONL corpus "
                  "on the controller) nor retriever__index_dir (a prebuilt index on the node) is set: the service "
                  "has nothing to serve", where=(r.view.hosts_file, None))
    if corpus and not raw.get("retriever__corpus_command"):
        value = r.value(host, N.retriever_corpus)
        if isinstance(value, str) and not path_problem(value) and not Path(value).is_file():
            r.add(host, N.retriever_corpus, corpus, "does not exist on this machine (the controller, which copies it "
                  "to each retriever host): expected a JSONL file, one passage per line "
                  '({"id": ..., "contents": ...}), or retriever__corpus_command to make it')


def check_retriever_ports(r: Recorder, retrievers: list[str]) -> None:
    """One retrieval port for every retriever: the job's URL (http://{node_ip}:PORT/retrieve) names one."""
    ports = {h: r.value(h, N.retriever_port) for h in retrievers}
    ports = {h: p for h, p in ports.items() if whole(p)}
    if len({int(p) for p in ports.values()}) > 1:
        first = sorted(ports)[0]
        for host in sorted(ports):
            if int(ports[host]) != int(ports[first]):
                r.add(host, N.retriever_port, ports[host], f"differs from {first}'s ({int(ports[first])}): every "
                      "retrieval service needs the same port, since a job's URL (http://{node_ip}:PORT/retrieve) "
                      "names one")
