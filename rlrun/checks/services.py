"""The services beside Ray: the reward service's settings on its hosts, and the retrieval service's (which
hosts run one, what each serves, one port for all)."""

from __future__ import annotations

from pathlib import Path

from rlrun.checks.problems import NOTHING, Recorder
from rlrun.checks.shapes import path_problem, whole
from rlrun.checks.vocabulary import N
from rlrun.inventory_view import UNKNOWN, InventoryView
from trainer.reward.extract import STRATEGIES, validate_strategies
from trainer.reward.forms import LENIENCIES, UnknownNames, validate_leniencies
from trainer.reward.server.dataset import TEMPLATE_EXPECTED, known_template


def check_reward(r: Recorder, host: str) -> None:
    """The reward service's settings. What the service accepts is the service's own rule (trainer/reward: its
    extraction strategies, leniencies, prompt templates); these checks only say it in the inventory's words."""
    for var in N.reward_workers:
        value = r.user_value(host, var)
        if value not in (UNKNOWN, None) and (not whole(value) or int(value) < 1):
            r.add(host, var, value, "must be a whole number, 1 or more")
    timeout = r.user_value(host, N.reward_timeout)
    if timeout not in (UNKNOWN, None) and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                           or timeout <= 0):
        r.add(host, N.reward_timeout, timeout, "must be a number of seconds > 0")
    if r.value(host, N.reward_auth) is True and r.value(host, N.auth_enabled) is False:
        r.add(host, N.reward_auth, True, f"needs {N.auth_enabled} (the cluster's token: the reward service's own "
              f"token is installed beside it), which is false: set {N.auth_enabled}: true, or {N.reward_auth}: "
              "false for a service without a token")
    template = r.user_value(host, N.reward_prompt_template)
    if template is not UNKNOWN and not known_template(template):
        r.add(host, N.reward_prompt_template, r.raw(host)[N.reward_prompt_template], f"must be {TEMPLATE_EXPECTED}")
    _names(r, host, N.reward_extract, STRATEGIES, validate_strategies, "must be null (the "
           "service's default order) or a non-empty list of {known}", "[{first}] (null: the service's default "
           "order) of {known}")
    _names(r, host, N.reward_lenient, LENIENCIES, lambda names: validate_leniencies(names or ["none"]),
           "must be null (the service's default: all of {known}) or a list of {known} (empty for none)",
           "[{first}] (null: all of them; empty: none) of {known}")


def _names(r: Recorder, host: str, var: str, known, rule, expected: str, example: str) -> None:
    """A list of names from the service's closed list (`known`), checked by the service's own `rule`."""
    value = r.user_value(host, var)
    if value in (UNKNOWN, None):
        return
    raw, listed = r.raw(host)[var], ", ".join(known)
    if not isinstance(value, list):
        r.add(host, var, raw, "must be a list such as " + example.format(first=", ".join(list(known)[:2]),
                                                                         known=listed))
        return
    try:
        rule(value)
    except UnknownNames as exc:
        r.add(host, var, raw, expected.format(known=listed)
              + (f": {', '.join(map(str, exc.unknown))} is not one" if exc.unknown else ""))


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
