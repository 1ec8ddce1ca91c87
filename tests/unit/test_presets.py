"""Presets: loading, --set overrides, the entrypoint, user directories, and bad presets / overrides."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlrun import presets as P
from rlrun import trainer_command as T
from rlrun.errors import RlrunError
from trainer.config.cli import parse_args

SIX = ["0.5b-async", "1.5b-grpo", "32b-rloo", "32b-rloo-1node", "7b-ppo", "qwen2-7b-ppo", "search-r1-ppo", "tiny-ppo", "tiny-python",
       "tiny-rloo", "tiny-rloo-async", "tiny-search"]
CONTEXT = {"workdir": "/w", "reward_url": "http://10.0.0.5:5001/get_reward",
           "retriever_url": "http://{node_ip}:8000/retrieve"}
SEED_004 = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "004_2df873a0264a0e23.txt"
# The seed's job section (its lines 103-178: the variables and the `ray job submit`), kept here so that the test
# runs in every clone; where the seeds are beside the project it must still be the seed's text, verbatim.
SEED_004_JOB = Path(__file__).resolve().parents[1] / "data" / "seed004_job.txt"


def build(name: str, *sets: str, context=CONTEXT):
    return P.build_config(P.load_preset(name, P.preset_dirs()), P.parse_sets(sets), context)


def test_the_six_presets_are_built_in_with_their_hardware():
    found = {p.name: p for p in P.load_all(P.preset_dirs())}
    assert sorted(found) == SIX
    assert all(p.builtin and p.description for p in found.values())
    assert {n: str(p.hardware) for n, p in found.items()} == {
        "0.5b-async": "1 x 3 GPUs", "tiny-rloo-async": "1 CPU node",
        "1.5b-grpo": "2 x 8 GPUs", "32b-rloo": "2 x 8 GPUs", "32b-rloo-1node": "1 x 4 GPUs", "7b-ppo": "2 x 8 GPUs",
        "qwen2-7b-ppo": "2 x 8 GPUs", "search-r1-ppo": "2 x 8 GPUs", "tiny-ppo": "1 CPU node", "tiny-rloo": "1 CPU node", "tiny-search": "1 CPU node",
        "tiny-python": "1 CPU node"}


@pytest.mark.parametrize("name", SIX)
def test_each_preset_is_headed_by_hardware_and_batch_arithmetic(name):
    text = (P.BUILTIN_DIR / f"{name}.yaml").read_text()
    header = text.split("\ndescription:")[0]
    assert "# Hardware:" in header and "# Batch arithmetic" in header
    cfg = build(name)
    # the header's first arithmetic line states the samples per rollout the trainer derives
    assert f"= {cfg.rollout_samples} samples per rollout" in header


@pytest.mark.parametrize("name", SIX)
def test_the_entrypoint_reproduces_the_config_through_the_trainers_parser(name):
    preset = P.load_preset(name, P.preset_dirs())
    cfg = P.build_config(preset, {}, CONTEXT)
    command = T.entrypoint(cfg, preset.values)
    assert command[:3] == ["python", "-m", "trainer.train_ppo_ray"]
    assert parse_args(command[3:]).to_dict() == cfg.to_dict()


def test_32b_rloo_is_the_seed_004_job_flag_for_flag():
    """Every flag of the seed's job appears with the seed's value (paths and the reward URL aside)."""
    text = SEED_004_JOB.read_text(encoding="utf-8")
    if SEED_004.exists():
        assert text in SEED_004.read_text(encoding="utf-8"), f"{SEED_004_JOB} is no longer an excerpt of {SEED_004}"
    variables = {m.group(1): m.group(2).strip('"') for m in re.finditer(r'^([A-Z_]+)=("[^"]*"|\S+)', text, re.M)}
    block = text.split("-- python3 -m openrlhf.cli.train_ppo_ray", 1)[1].split("```", 1)[0]
    argv = shlex.split(block.replace("\\\n", " "))
    seed = parse_args([re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], a) for a in argv])
    ours = build("32b-rloo")
    differs = {k for k, v in seed.to_dict().items() if ours.to_dict()[k] != v}
    assert differs == {"remote_rm_url"}, differs
    assert seed.remote_rm_url == ("http://127.0.0.1:5001/get_reward",)


def test_placeholders_expand_to_workdir_and_the_inventorys_reward_services():
    cfg = build("tiny-rloo", context={"workdir": "/home/u/proj",
                                      "reward_url": "http://a:5001/get_reward,http://b:5001/get_reward"})
    assert cfg.pretrain == "/home/u/proj/build/tiny/model-h128"
    assert cfg.remote_rm_url == ("http://a:5001/get_reward", "http://b:5001/get_reward")


def test_set_overrides_are_typed_and_reported_as_differences():
    preset = P.load_preset("32b-rloo", P.preset_dirs())
    sets = P.parse_sets(["train_batch_size=256", "actor_learning_rate=1e-6", "bf16=false", "dual_clip=none",
                         "zero_stage=3", "reward_clip_range=-5,5"])
    assert sets == {"train_batch_size": 256, "actor_learning_rate": 1e-6, "bf16": False, "dual_clip": None,
                    "zero_stage": 3, "reward_clip_range": (-5.0, 5.0)}
    cfg = P.build_config(preset, sets, CONTEXT)
    assert (cfg.train_batch_size, cfg.bf16, cfg.train_steps_per_rollout) == (256, False, 8)
    assert cfg.reward_clip_range == (-5.0, 5.0)
    assert P.differences(preset, sets) == [("train_batch_size", 128, 256), ("actor_learning_rate", 5e-7, 1e-6),
                                           ("bf16", True, False), ("reward_clip_range", (-10.0, 10.0), (-5.0, 5.0))]
    args = T.flag_args(cfg)
    assert args[args.index("--reward_clip_range"):][:3] == ["--reward_clip_range", "-5.0", "5.0"]
    assert T.config_from_argv(args) == cfg  # the command line reads back as the same job


def test_user_presets_come_from_the_env_and_the_option_and_shadow_built_ins(tmp_path, monkeypatch):
    env_dir, opt_dir = tmp_path / "env", tmp_path / "opt"
    env_dir.mkdir()
    opt_dir.mkdir()
    tiny = (P.BUILTIN_DIR / "tiny-rloo.yaml").read_text()
    (env_dir / "my-job.yaml").write_text(tiny.replace("num_episodes: 16", "num_episodes: 2"))
    (opt_dir / "tiny-rloo.yaml").write_text(tiny.replace("rollout_batch_size: 16", "rollout_batch_size: 32"))
    monkeypatch.setenv("RLRUN_PRESETS_DIR", str(env_dir))
    dirs = P.preset_dirs([opt_dir])
    assert P.load_preset("my-job", dirs).values["num_episodes"] == 2
    shadow = P.load_preset("tiny-rloo", dirs)
    assert shadow.path == opt_dir / "tiny-rloo.yaml" and not shadow.builtin
    assert P.build_config(shadow, {}, CONTEXT).max_rollouts_per_episode == 4


def test_tiny_artifacts_are_made_when_missing(tmp_path):
    preset = P.load_preset("tiny-rloo", P.preset_dirs())
    context = {"workdir": str(tmp_path), "reward_url": "http://x/get_reward"}
    todo = P.missing_artifacts(preset, context)
    model, data = tmp_path / "build/tiny/model-h128", tmp_path / "build/tiny/copy1-128.jsonl"
    assert [p for p, _ in todo] == [model, data]
    P.make_artifacts(todo[1:], log=lambda _: None)  # the data set (the model is made by the integration test)
    lines = (tmp_path / "build/tiny/copy1-128.jsonl").read_text().splitlines()
    assert len(lines) == 128 and '"answer"' in lines[0] and '"solution": "\\\\boxed{' in lines[0]
    assert [p for p, _ in P.missing_artifacts(preset, context)] == [model]


def test_a_trainer_command_after_the_double_dash_is_validated_as_the_trainer_would():
    argv = T.trainer_argv(["python", "-m", "trainer.train_ppo_ray", "--pretrain", "m", "--prompt_data", "d",
                           "--reward_fn", "math_verify", "--advantage_estimator", "rloo",
                           "--n_samples_per_prompt", "2", "--rollout_batch_size", "8", "--train_batch_size", "16",
                           "--micro_train_batch_size", "2", "--actor_num_gpus_per_node", "1",
                           "--ref_num_gpus_per_node", "1", "--print-config"])
    cfg = T.config_from_argv(argv)
    assert (cfg.rollout_samples, cfg.grad_accum_steps) == (16, 8)
    assert T.trainer_argv(["python", "-c", "print(1)"]) is None
    with pytest.raises(P.PresetError, match=r"unknown flag --train_batchsize \(did you mean --train_batch_size"):
        T.config_from_argv([*argv, "--train_batchsize", "3"])
    with pytest.raises(P.PresetError, match=r"16 samples per rollout must be divisible by --train_batch_size 12"):
        T.config_from_argv([*argv, "--train_batch_size", "12"])
    with pytest.raises(P.PresetError, match=r"argument --rollout_batch_size: invalid int value: 'x'"):
        T.config_from_argv([*argv, "--rollout_batch_size", "x"])


# --- bad overrides: each is refused with a message naming what was wrong and what was expected -------------
BAD_SETS = [
    (["trian_batch_size=3"], r"--set trian_batch_size: not a trainer flag \(did you mean train_batch_size\?\)"),
    (["rollout_samples=3"], r"--set rollout_samples is derived by the trainer from other flags"),
    (["train_batch_size"], r"--set 'train_batch_size': expected KEY=VALUE"),
    (["train_batch_size=abc"], r"--set train_batch_size=abc: expected an integer"),
    (["bf16=maybe"], r"--set bf16=maybe: expected a boolean switch"),
    (["actor_learning_rate=fast"], r"--set actor_learning_rate=fast: expected a number"),
]
BAD_JOBS = [
    (["advantage_estimator=ppo"], r"--advantage_estimator 'ppo': expected one of gae, reinforce, rloo, "
                                  r"reinforce_baseline, group_norm, dr_grpo"),
    (["value_clip=none"], r"--value_clip None is only used with --advantage_estimator gae \(a critic\); rloo has "
                          r"no critic \(drop the flag\)"),
    (["train_batch_size=100"], r"256 \* --n_samples_per_prompt 8 = 2048 samples per rollout must be divisible by "
                               r"--train_batch_size 100 \(2048 % 100 = 48\)"),
    (["micro_train_batch_size=3"], r"--train_batch_size 128 must be divisible by --micro_train_batch_size 3 \* "
                                   r"actor world size 8 .* = 24 \(128 % 24 = 8\)"),
    (["vllm_num_engines=3"], r"--vllm_num_engines 3 \* --vllm_tensor_parallel_size 4 = 12 vLLM GPUs to equal the "
                             r"actor world size 8"),
    (["colocate_all_models=false"], r"--vllm_enable_sleep only applies with --colocate_all_models"),
    (["vllm_gpu_memory_utilization=1.5"], r"--vllm_gpu_memory_utilization 1.5: must be > 0 and <= 1"),
    (["n_samples_per_prompt=1", "train_batch_size=64"], r"--advantage_estimator rloo requires --n_samples_per_prompt > 1"),
    (["reward_fn=math_verify"], r"both given: exactly one reward source is allowed"),
    (["remote_rm_url=ftp://x/get_reward"], r"--remote_rm_url ftp://x/get_reward: expected an http:// or https:// URL"),
    (["max_samples=10"], r"--max_samples 10 < --rollout_batch_size 256: an episode would hold no complete rollout"),
    (["ref_num_gpus_per_node=8"], r"requires the ref placement to equal the actor's: --ref_num_nodes 2 x "
                                  r"--ref_num_gpus_per_node 8 != --actor_num_nodes 2 x --actor_num_gpus_per_node 4"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_SETS, ids=[s[0] for s, _ in BAD_SETS])
def test_bad_set_is_refused_naming_it(sets, message):
    with pytest.raises(P.PresetError, match=message) as err:
        P.parse_sets(sets)
    assert str(err.value).startswith("bad --set:")


@pytest.mark.parametrize(("sets", "message"), BAD_JOBS, ids=[s[0] for s, _ in BAD_JOBS])
def test_override_making_an_invalid_job_is_refused_with_the_trainers_arithmetic(sets, message):
    with pytest.raises(P.PresetError, match=message) as err:
        build("32b-rloo", *sets)
    assert str(err.value).startswith(f"preset 32b-rloo with --set {sets[0].split('=')[0]}")


def test_all_problems_of_several_overrides_are_reported_together():
    with pytest.raises(P.PresetError) as err:
        P.parse_sets(["nope=1", "train_batch_size=x", "bf16=2"])
    assert len(err.value.problems) == 3


# --- bad preset files ---------------------------------------------------------------------------------------
GOOD = (P.BUILTIN_DIR / "tiny-rloo.yaml").read_text()
BAD_FILES = [
    (GOOD + "flags:\n  bf16: true\n", r"unknown key 'flags': a preset has description, hardware, make, base, config"),
    (GOOD.replace("  num_episodes: 16", "  num_epsiodes: 16"),
     r"config: num_epsiodes: not a trainer flag \(did you mean num_episodes\?\)"),
    (GOOD.replace("  max_samples: 128", "  max_samples: [128"), r"not valid YAML"),
    (GOOD.replace("accelerator: cpu", "accelerator: tpu"), r"hardware.accelerator 'tpu': expected gpu or cpu"),
    (GOOD.replace("hardware: {accelerator: cpu, nodes: 1, gpus_per_node: 0}", "hardware: 8"),
     r"hardware: expected \{accelerator: gpu\|cpu, nodes: N, gpus_per_node: G\}"),
    (GOOD.replace('"{workdir}/build/tiny/rloo"', '"{home}/out"'), r"save_path: unknown placeholder \{home\}"),
    (GOOD.replace("[model, --hidden-size, \"128\"]", "[download, Qwen/Qwen2.5-7B]"), r"make: \{workdir\}/build/tiny/model-h128: expected "
                                                             r"\[model\|dataset\|search\|python, ARGS...\]"),
    (GOOD.replace("  train_batch_size: 32", "  train_batch_size: big"),
     r"config: train_batch_size: 'big': expected an integer"),
    (GOOD.replace("  train_batch_size: 32", "  grad_accum_steps: 2"), r"config: grad_accum_steps is derived"),
    (GOOD.replace("description: tiny", "descr: tiny"), r"description: expected one line of text"),
    ("- just\n- a list\n", r"expected a mapping with keys description, hardware, make, base, config, got list"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES, ids=range(len(BAD_FILES)))
def test_bad_preset_file_is_refused_naming_file_and_problem(tmp_path, text, message):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(P.PresetError, match=message) as err:
        P.load_preset("bad", P.preset_dirs([tmp_path]))
    assert str(err.value).startswith(f"preset {tmp_path / 'bad.yaml'}:")


def test_unknown_preset_names_the_closest_and_all_presets():
    with pytest.raises(RlrunError, match=r"no preset 'tiny-rlo' \(did you mean tiny-rloo\?\); presets: 0.5b-async, "
                                         r"1.5b-grpo, 32b-rloo, 32b-rloo-1node, 7b-ppo, qwen2-7b-ppo, search-r1-ppo, "
                                         r"tiny-ppo, tiny-python, tiny-rloo, tiny-rloo-async, tiny-search"):
        P.load_preset("tiny-rlo", P.preset_dirs())


def test_a_missing_presets_dir_is_named(tmp_path):
    with pytest.raises(RlrunError, match=f"presets directory {tmp_path / 'nope'} does not exist"):
        P.preset_dirs([tmp_path / "nope"])


def test_reward_placeholder_without_reward_servers_says_what_to_do():
    with pytest.raises(P.PresetError, match=r"\{reward_url\} has no value here \(the inventory has no reward_servers "
                                            r"group: --set remote_rm_url=URL or --set reward_fn=NAME\)"):
        build("tiny-rloo", context={"workdir": "/w", "reward_url": ""})
    cfg = build("tiny-rloo", "remote_rm_url=", "reward_fn=math_verify", context={"workdir": "/w"})
    assert cfg.reward_fn == "math_verify" and cfg.remote_rm_url == ()


def test_preset_7b_ppo_carries_seed_000s_numbers():
    from tests.unit.test_openrlhf_flags import SEED_000

    cfg = P.build_config(P.load_preset("7b-ppo", P.preset_dirs()), {}, {"workdir": "/w", "reward_url": "http://r/x"})
    verl = {k.lstrip("+"): v for k, _, v in (arg.partition("=") for arg in SEED_000)}
    gpus = int(verl["trainer.n_gpus_per_node"]) * 2  # N_NODES=2
    assert (cfg.actor_world_size, cfg.critic_world_size) == (gpus, gpus)
    # run length: verl's total_training_steps counts rollout steps, as --max_steps does
    assert cfg.max_steps == int(verl["trainer.total_training_steps"]) == 1005
    assert cfg.num_episodes == int(verl["trainer.total_epochs"])
    assert cfg.max_train_steps == 1005 * cfg.train_steps_per_rollout == 2010
    # batches (verl's are global)
    assert cfg.rollout_batch_size == int(verl["data.train_batch_size"])
    assert cfg.train_batch_size == int(verl["actor_rollout_ref.actor.ppo_mini_batch_size"])
    assert cfg.micro_train_batch_size == int(verl["actor_rollout_ref.actor.ppo_micro_batch_size"]) // gpus
    assert cfg.critic_micro_train_batch_size == int(verl["critic.ppo_micro_batch_size"]) // gpus == 1
    assert cfg.critic_grad_accum_steps == 256 // (1 * 16)
    # the critic's schedule: its own LR and warm-up, no critic-only steps first
    assert cfg.critic_learning_rate == float(verl["critic.optim.lr"])
    assert cfg.critic_lr_warmup_ratio == float(verl["critic.optim.lr_warmup_steps_ratio"])
    assert cfg.lr_warmup_ratio == float(verl["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"])
    assert cfg.lr_scheduler == "constant_with_warmup"  # verl: constant after the warm-up
    assert max(cfg.freezing_actor_steps, 0) == int(verl["trainer.critic_warmup"])
    assert cfg.actor_learning_rate == float(verl["actor_rollout_ref.actor.optim.lr"])
    assert cfg.init_kl_coef == float(verl["algorithm.kl_ctrl.kl_coef"])
    assert (cfg.prompt_max_len, cfg.generate_max_len) == (int(verl["data.max_prompt_length"]),
                                                          int(verl["data.max_response_length"]))
    assert cfg.save_steps == int(verl["trainer.save_freq"])


@pytest.mark.parametrize("inventory", ["inventory", "examples/inventories/seed-2node"])
def test_the_inventories_make_the_tiny_search_data_the_preset_makes(inventory):
    """The retrieval service's corpus and the preset's questions and warm-up come from one
    `python -m trainer.tiny search` run, whichever runs first (`rlrun up` or the submit): the same arguments.
    (The embedded inventory once made them without the preset's --direct-share, so a cluster's job warmed up
    on other data than a direct run.)"""
    import yaml

    make = P.load_preset("tiny-search", P.preset_dirs()).make
    (preset_args,) = [args for path, args in make.items() if path.endswith("/build/tiny/search-copy1")]
    vars_file = Path(__file__).resolve().parents[2] / inventory / "group_vars" / "all" / "retriever.yml"
    command = yaml.safe_load(vars_file.read_text())["retriever__corpus_command"]
    assert command[1:4] == ["-m", "trainer.tiny", "search"]
    assert command[5:] == list(preset_args[1:])


# --- variants (base: NAME) ------------------------------------------------------------------------------
def test_the_one_node_32b_variant_is_the_seed_job_with_only_its_own_changes():
    seed, variant = (P.load_preset(n, P.preset_dirs()) for n in ("32b-rloo", "32b-rloo-1node"))
    assert variant.base == "32b-rloo"
    changed = {k: v for k, v in variant.values.items() if seed.values.get(k) != v}
    assert changed == {"actor_num_nodes": 1, "ref_num_nodes": 1, "vllm_num_engines": 1, "adam_offload_ratio": 0.6,
                       "vllm_gpu_memory_utilization": 0.3}
    assert set(seed.values) <= set(variant.values)
    cfg = build("32b-rloo-1node")
    assert (cfg.actor_world_size, cfg.vllm_total_gpus, cfg.adam_offload, cfg.zero_stage) == (4, 4, True, 3)


def _variant_dir(tmp_path, base_text: str, variant_text: str):
    (tmp_path / "base.yaml").write_text(base_text)
    (tmp_path / "var.yaml").write_text(variant_text)
    return tmp_path


BASE = ("description: b\nhardware: {accelerator: cpu, nodes: 1}\nmake:\n  '{workdir}/m': [model]\n"
        "config:\n  pretrain: '{workdir}/m'\n  prompt_data: /d\n  reward_fn: math_verify\n  seed: 3\n")


def test_a_variant_lays_its_config_over_its_base_and_keeps_its_make(tmp_path):
    d = _variant_dir(tmp_path, BASE, "description: v\nhardware: {accelerator: cpu, nodes: 1}\nbase: base\n"
                                     "config:\n  seed: 9\n")
    v = P.load_file(d / "var.yaml")
    assert v.values == {"pretrain": "{workdir}/m", "prompt_data": "/d", "reward_fn": "math_verify", "seed": 9}
    assert v.make == {"{workdir}/m": ("model",)} and v.description == "v"
    assert P.load_file(d / "base.yaml").values["seed"] == 3  # the base itself is unchanged


@pytest.mark.parametrize(("base_line", "message"), [
    ("base: nowhere", "base: no preset 'nowhere' in "),
    ("base: var", "base: var: a variant chain that comes back to itself (var -> var)"),
    ("base: [a]", "base: ['a']: expected the name of a preset in "),
])
def test_a_bad_base_is_refused_naming_it(tmp_path, base_line, message):
    d = _variant_dir(tmp_path, BASE, f"description: v\nhardware: {{accelerator: cpu, nodes: 1}}\n{base_line}\n"
                                     "config: {}\n")
    with pytest.raises(P.PresetError) as err:
        P.load_file(d / "var.yaml")
    assert message in str(err.value)


def test_a_base_with_a_problem_is_named_through_the_variant(tmp_path):
    d = _variant_dir(tmp_path, BASE.replace("seed: 3", "sede: 3"),
                     "description: v\nhardware: {accelerator: cpu, nodes: 1}\nbase: base\nconfig: {}\n")
    with pytest.raises(P.PresetError, match=r"base base: config: sede: not a trainer flag \(did you mean seed\?\)"):
        P.load_file(d / "var.yaml")
