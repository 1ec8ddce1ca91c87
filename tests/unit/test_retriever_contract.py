"""The retrieval service's part of the cluster contract, as rlrun reads it (roles/cluster): which hosts run
one (group retrievers; without it every Ray node once a corpus or an index is named), their URLs, the URL a
job uses (its own node's: `{node_ip}` kept for the trainer), the `{retriever_url}` preset placeholder and its
refusals, rlrun status's health line, and rlrun slurm's refusal."""

import pytest
import yaml

from rlrun import presets as P
from rlrun.dashboard import cluster_problems
from rlrun.errors import RlrunError
from rlrun.inventory import load_cluster
from tests.conftest import write_inventory


def _with_retrievers(inv, hosts):
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    data["all"]["children"]["retrievers"] = {"hosts": {h: None for h in hosts}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(data))
    return inv


def _worker(address):
    return {"w1": {"ansible_connection": "local", "cluster__node_address": address}}


def test_no_group_and_no_corpus_means_no_retrieval_service(tmp_path):
    cluster = load_cluster(write_inventory(tmp_path, "r0", "127.0.0.9", 9300))
    assert cluster.retriever_hosts == [] and cluster.retriever_urls == {} and cluster.retriever_job_url is None


def test_the_group_names_the_hosts_and_each_gets_its_own_url(tmp_path):
    inv = write_inventory(tmp_path, "r1", "127.0.0.9", 9300, workers=_worker("127.0.0.11"),
                          group_vars={"cluster__retriever_port": 9360})
    cluster = load_cluster(_with_retrievers(inv, ["localhost", "w1"]))
    assert cluster.retriever_hosts == ["localhost", "w1"]
    assert cluster.retriever_urls == {"localhost": "http://127.0.0.9:9360/retrieve",
                                      "w1": "http://127.0.0.11:9360/retrieve"}
    assert cluster.retriever_job_url == "http://{node_ip}:9360/retrieve"


def test_without_the_group_a_corpus_puts_one_on_every_ray_node_on_the_seeds_port(tmp_path):
    inv = write_inventory(tmp_path, "r2", "127.0.0.9", 9300, workers=_worker("127.0.0.11"),
                          group_vars={"retriever__corpus": "/data/corpus.jsonl"})
    cluster = load_cluster(inv)
    assert cluster.retriever_hosts == ["localhost", "w1"]
    assert cluster.retriever_job_url == "http://{node_ip}:8000/retrieve"


def test_an_empty_group_turns_the_default_off(tmp_path):
    inv = write_inventory(tmp_path, "r3", "127.0.0.9", 9300, group_vars={"retriever__corpus": "/data/c.jsonl"})
    assert load_cluster(_with_retrievers(inv, [])).retriever_hosts == []


def test_retriever_url_expands_to_the_own_nodes_service_and_keeps_node_ip_for_the_trainer(tmp_path):
    inv = write_inventory(tmp_path, "r4", "127.0.0.9", 9300, group_vars={"cluster__retriever_port": 9360})
    context = {"workdir": "/w", **P.retriever_context(load_cluster(_with_retrievers(inv, ["localhost"])))}
    out = P.expand({"retriever_url": "{retriever_url}", "x": "http://{node_ip}:1/retrieve"}, context)
    assert out == {"retriever_url": "http://{node_ip}:9360/retrieve", "x": "http://{node_ip}:1/retrieve"}


def test_retriever_url_without_retrievers_is_refused_naming_the_group(tmp_path):
    context = {"workdir": "/w", **P.retriever_context(load_cluster(write_inventory(tmp_path, "r5", "127.0.0.9",
                                                                                   9300)))}
    with pytest.raises(P.PresetError, match=r"\{retriever_url\} has no value here \(the inventory has no "
                                            r"retrievers group"):
        P.expand({"retriever_url": "{retriever_url}"}, context)


def test_retriever_url_is_refused_when_a_ray_node_has_no_service(tmp_path):
    inv = write_inventory(tmp_path, "r6", "127.0.0.9", 9300, workers=_worker("127.0.0.11"))
    context = {"workdir": "/w", **P.retriever_context(load_cluster(_with_retrievers(inv, ["localhost"])))}
    with pytest.raises(P.PresetError, match=r"the retrievers group lacks the Ray node w1: a job calls the retrieval "
                                            r"service of its own node"):
        P.expand({"retriever_url": "{retriever_url}"}, context)


def test_an_unknown_placeholder_is_still_refused():
    with pytest.raises(P.PresetError, match=r"unknown placeholder \{node\}.*\{retriever_url\}"):
        P.expand({"retriever_url": "http://{node}:1/retrieve"}, {"workdir": "/w"})


def test_status_counts_a_retrieval_service_that_does_not_answer(tmp_path):
    cluster = load_cluster(write_inventory(tmp_path, "r7", "127.0.0.9", 9300))
    cluster.nodes = []
    problems = cluster_problems(cluster, [], {}, {"http://127.0.0.9:8000/retrieve": "unreachable (ConnectionError)",
                                                  "http://127.0.0.11:8000/retrieve": "ok"})
    assert problems == ["retrieval service http://127.0.0.9:8000/retrieve: unreachable (ConnectionError)"]


def test_rlrun_slurm_refuses_a_job_that_needs_the_retrieval_service(tmp_path):
    from rlrun.commands.slurm import _refuse_retriever

    preset = P.Preset(name="p", path=tmp_path / "p.yaml", description="d", hardware=None, make={},
                      values={"prompt_data": "{workdir}/x", "remote_rm_url": "{retriever_url}"})
    with pytest.raises(RlrunError, match=r"remote_rm_url uses \{retriever_url\}.*rlrun slurm does not start retrieval "
                                         r"services yet.*--set remote_rm_url=URL"):
        _refuse_retriever(preset, {})
    _refuse_retriever(preset, {"remote_rm_url": "http://10.0.0.5:8000/retrieve"})  # its own service: no refusal


def test_rlrun_slurm_renders_an_inventory_with_retrievers_for_a_job_without_them(tmp_path):
    from rlrun.slurm.spec import evaluate

    inv = write_inventory(tmp_path, "r8", "127.0.0.9", 9300, group_vars={"retriever__corpus": "/data/c.jsonl"})
    assert evaluate(inv).cluster_name == "r8"


def test_the_pre_submit_check_refuses_a_node_whose_retrieval_service_does_not_answer():
    from rlrun.jobcheck import ClusterView, NodeView, check, probe_request

    preset = P.load_preset("tiny-rloo", P.preset_dirs())
    cfg = P.build_config(preset, {}, {"workdir": "/w", "reward_url": "http://10.0.0.5:5001/get_reward"})
    object.__setattr__(cfg, "retriever_url", "http://{node_ip}:8000/retrieve")  # the trainer's flag (issue 20)
    assert probe_request(cfg, None)["retriever_url"] == "http://{node_ip}:8000/retrieve"
    nodes = (NodeView("10.0.0.5", 64, 0, is_head=True), NodeView("10.0.0.4", 64, 0))
    view = ClusterView(nodes, {"http://10.0.0.5:5001/get_reward": "ok"}, "the head", {},
                       {"10.0.0.5": "ok", "10.0.0.4": "unreachable (URLError: refused)"})
    report = check(cfg, view)
    assert [p for p in report.problems if "retrieval" in p] == [
        "retrieval service http://10.0.0.4:8000/retrieve (node 10.0.0.4): unreachable (URLError: refused); the "
        "job's rollouts on that node would fail their searches (`rlrun status` shows the inventory's retrieval "
        "services)"]
    assert "retrieval service http://10.0.0.5:8000/retrieve: ok (asked on its node)" in report.lines
