"""rlrun reads the cluster's address and token from the inventory, or says clearly why not."""


import subprocess

import pytest
import yaml

from rlrun.errors import RlrunError
from rlrun.inventory import load_cluster
from tests.conftest import BIN, PROJECT, write_inventory


def test_embedded_inventory_describes_the_one_machine_cluster():
    cluster = load_cluster(PROJECT / "inventory")
    assert cluster.head == "localhost"
    assert cluster.dashboard_url == "http://127.0.0.2:8101"
    assert cluster.auth_enabled
    assert cluster.token_store == PROJECT / "inventory" / ".secrets" / "local-ray.token"
    assert cluster.nodes == ["localhost"]
    assert cluster.reward_urls == ["http://127.0.0.2:5001/get_reward"]


def test_ports_and_names_come_from_the_inventory(tmp_path):
    inv = write_inventory(tmp_path, "alpha", "127.0.0.9", 9300)
    cluster = load_cluster(inv)
    assert cluster.name == "alpha"
    assert cluster.dashboard_url == "http://127.0.0.9:9301"
    assert cluster.token_store == inv / ".secrets" / "alpha-ray.token"
    assert cluster.reward_urls == ["http://127.0.0.9:9350/get_reward"]


def test_token_read_from_the_controllers_token_file(tmp_path):
    inv = write_inventory(tmp_path, "beta", "127.0.0.9", 9300)
    (inv / ".secrets").mkdir()
    (inv / ".secrets" / "beta-ray.token").write_text("ab" * 32 + "\n")
    assert load_cluster(inv).token == "ab" * 32


def test_explicit_token_wins(tmp_path):
    inv = write_inventory(tmp_path, "gamma", "127.0.0.9", 9300, group_vars={"cluster__token": "cd" * 32})
    assert load_cluster(inv).token == "cd" * 32


def test_missing_token_file_says_to_provision(tmp_path):
    inv = write_inventory(tmp_path, "delta", "127.0.0.9", 9300)
    with pytest.raises(RlrunError, match=r"no cluster token at .*delta-ray.token.*rlrun up"):
        _ = load_cluster(inv).token


def test_auth_off_needs_no_token(tmp_path):
    inv = write_inventory(tmp_path, "eps", "127.0.0.9", 9300, group_vars={"cluster__auth_enabled": False})
    assert load_cluster(inv).token is None


def test_the_reward_service_has_its_own_token(tmp_path):
    inv = write_inventory(tmp_path, "eta", "127.0.0.9", 9300)
    (inv / ".secrets").mkdir()
    (inv / ".secrets" / "eta-ray.token").write_text("ab" * 32 + "\n")
    (inv / ".secrets" / "eta-reward.token").write_text("ef" * 32 + "\n")
    cluster = load_cluster(inv)
    assert cluster.reward_token_store == inv / ".secrets" / "eta-reward.token"
    assert (cluster.token, cluster.reward_token) == ("ab" * 32, "ef" * 32)
    assert cluster.reward_ca is None and cluster.reward_urls == ["http://127.0.0.9:9350/get_reward"]


def test_reward_token_from_a_vault_and_tls(tmp_path):
    inv = write_inventory(tmp_path, "theta", "127.0.0.9", 9300,
                          group_vars={"cluster__reward_token": "12" * 32, "cluster__reward_tls": True})
    cluster = load_cluster(inv)
    assert cluster.reward_token == "12" * 32
    assert cluster.reward_urls == ["https://127.0.0.9:9350/get_reward"]
    assert cluster.reward_ca == inv / ".secrets" / "theta-reward-tls" / "ca.crt"


def test_missing_reward_token_says_to_provision(tmp_path):
    inv = write_inventory(tmp_path, "iota", "127.0.0.9", 9300)
    with pytest.raises(RlrunError, match=r"no reward token at .*iota-reward.token.*rlrun up"):
        _ = load_cluster(inv).reward_token


def test_missing_inventory_is_named(tmp_path):
    with pytest.raises(RlrunError, match=r"inventory .*nope does not exist"):
        load_cluster(tmp_path / "nope")


def test_two_heads_refused(tmp_path):
    inv = write_inventory(tmp_path, "zeta", "127.0.0.9", 9300, heads=["a", "b"])
    with pytest.raises(RlrunError, match=r"ray_head must hold exactly one host, found \['a', 'b'\]"):
        load_cluster(inv)


def test_seed_example_inventory_is_not_loaded_by_default():
    # The two-node example lives outside inventory/: `-i inventory` never sees gpu005.
    hosts = yaml.safe_load((PROJECT / "inventory" / "hosts.yml").read_text())
    assert "gpu005" not in str(hosts)
    seed = load_cluster(PROJECT / "examples" / "inventories" / "seed-2node")
    assert seed.head == "gpu005" and seed.nodes == ["gpu004", "gpu005"]
    assert seed.dashboard_url.endswith(":8101")
    assert len(seed.reward_urls) == 1 and seed.reward_urls[0].endswith(":5001/get_reward")


@pytest.mark.parametrize(("var", "value", "line"), [
    ("cluster__token", "", "cluster__token = '': is empty: with authentication on, the cluster needs a token"),
    ("cluster__token", None, "cluster__token = null: is empty: with authentication on, the cluster needs a token"),
    ("cluster__token", "   ", "cluster__token = '   ': is empty"),
    ("cluster__token", "changeme", "cluster__token: is 8 characters: use at least 32"),
    ("cluster__reward_token", "", "cluster__reward_token = '': is empty: with authentication on, the reward service "
                                  "needs a token"),
])
def test_a_token_the_inventory_sets_wrong_is_one_line_naming_it(tmp_path, var, value, line):
    # It used to reach an `assert` (an empty explicit token is no token and no store): "unexpected AssertionError".
    inv = write_inventory(tmp_path, "theta", "127.0.0.9", 9300, group_vars={var: value})
    with pytest.raises(RlrunError) as err:
        load_cluster(inv)
    message = str(err.value)
    assert message.startswith(f"inventory {inv}: {line}") and "\n" not in message, message
    assert "changeme" not in message  # a token, even a bad one, is never shown


def test_every_command_that_reads_the_inventory_names_an_empty_token(tmp_path):
    inv = write_inventory(tmp_path, "iota", "127.0.0.9", 9300, group_vars={"cluster__token": ""})
    for argv in (["status"], ["list"], ["logs", "rlrun-x"], ["stop", "rlrun-x"]):
        proc = subprocess.run([str(BIN / "rlrun"), "-i", str(inv), "--timeout", "1", *argv], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1, (argv, proc.stderr)
        assert proc.stderr.splitlines() == [
            f"error: inventory {inv}: cluster__token = '': is empty: with authentication on, the cluster needs a "
            "token; leave cluster__token unset to generate one, or set it from a vault (`rlrun validate` names the "
            "file and line)"], (argv, proc.stderr)
