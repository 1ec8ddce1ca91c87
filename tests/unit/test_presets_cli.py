"""The presets side of the CLI that needs no cluster: listing, showing, and refusals before any contact."""

from __future__ import annotations

import json

from rlrun.cli import main


def test_presets_lists_the_six(capsys):
    assert main(["presets", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["algorithm"], p["hardware"]) for p in listed] == [
        ("0.5b-async", "rloo", "1 x 3 GPUs"), ("1.5b-grpo", "group_norm", "2 x 8 GPUs"), ("32b-rloo", "rloo", "2 x 8 GPUs"),
        ("32b-rloo-1node", "rloo", "1 x 4 GPUs"), ("7b-ppo", "gae", "2 x 8 GPUs"),
        ("qwen2-7b-ppo", "gae", "2 x 8 GPUs"), ("search-r1-ppo", "gae", "2 x 8 GPUs"), ("tiny-ppo", "gae", "1 CPU node"),
        ("tiny-python", "group_norm", "1 CPU node"), ("tiny-rloo", "rloo", "1 CPU node"), ("tiny-rloo-async", "rloo", "1 CPU node"),
        ("tiny-search", "group_norm", "1 CPU node")]


def test_presets_shows_the_file_and_the_resolved_command(capsys):
    assert main(["presets", "32b-rloo"]) == 0
    out = capsys.readouterr().out
    assert "# Hardware: 2 nodes x 8 GPUs" in out
    assert "python -m trainer.train_ppo_ray --actor_num_nodes 2 --actor_num_gpus_per_node 4" in out
    assert "train_steps_per_rollout=16" in out


def test_bad_overrides_are_refused_before_the_cluster_is_read(tmp_path, capsys):
    missing = str(tmp_path / "no-inventory")
    assert main(["-i", missing, "submit", "--preset", "32b-rloo", "--set", "train_batch_sise=64"]) == 1
    err = capsys.readouterr().err
    assert "--set train_batch_sise: not a trainer flag (did you mean train_batch_size?)" in err
    assert "no-inventory" not in err


def test_a_preset_and_a_command_together_are_refused(capsys):
    assert main(["submit", "--preset", "tiny-rloo", "--", "python", "-c", "1"]) == 1
    assert "give either --preset or a command after `--`, not both" in capsys.readouterr().err


def test_set_without_a_preset_is_refused(capsys):
    assert main(["submit", "--set", "bf16=true", "--", "python", "-c", "1"]) == 1
    assert "--set needs --preset NAME" in capsys.readouterr().err


def test_dry_run_prints_entrypoint_and_runtime_env_with_debug_and_submits_nothing(tmp_path, capsys):
    missing = str(tmp_path / "no-inventory")  # a dry run of a plain command needs no cluster at all
    assert main(["-i", missing, "submit", "--dry-run", "--debug", "--no-working-dir", "--", "python", "-c",
                 "print(1)"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["entrypoint: python -c 'print(1)'",
                                         'runtime_env: {"env_vars": {"RAY_DEBUG_POST_MORTEM": "1"}}']
    assert "dry run: nothing submitted" in captured.err
