"""`rlrun presets [NAME]`: the named trainer jobs, listed, or one shown with its resolved command."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from rlrun import presets as P
from rlrun.commands.context import complete_presets, pass_ctx, presets_dir_option
from rlrun.commands.output import echo, emit_json, json_option, table
from rlrun.errors import RlrunError
from rlrun.trainer_command import entrypoint
from trainer.config import TrainerConfig
from trainer.config.fields import derived_names


@click.command()
@click.argument("name", required=False, shell_complete=complete_presets)
@presets_dir_option
@json_option
@pass_ctx
def presets(obj, name, presets_dir, as_json):
    """List the presets, or show one: its file, the resolved trainer command and derived sizes."""
    dirs = P.preset_dirs(presets_dir)
    if not name:
        found = P.load_all(dirs)
        if as_json:
            emit_json([{"name": p.name, "description": p.description, "hardware": str(p.hardware),
                        "algorithm": p.values.get("advantage_estimator", "gae"),
                        "path": str(p.path), "builtin": p.builtin} for p in found])
            return
        table("presets (rlrun presets NAME shows one; rlrun submit --preset NAME runs it)",
              ("preset", "algorithm", "hardware", "description", "from"),
              [(p.name, str(p.values.get("advantage_estimator", "gae")), str(p.hardware), p.description,
                "built-in" if p.builtin else str(p.path.parent)) for p in found])
        return
    preset = P.load_preset(name, dirs)
    try:
        reward = ",".join(obj.cluster.reward_urls) or None
        retriever = P.retriever_context(obj.cluster)["retriever_url"]
    except RlrunError:
        reward = retriever = None
    context = {"workdir": str(Path.cwd().resolve()), "reward_url": reward or "http://REWARD-SERVICE/get_reward",
               "retriever_url": retriever or "http://{node_ip}:RETRIEVER-PORT/retrieve"}
    cfg = P.build_config(preset, {}, context)
    if as_json:
        emit_json({"name": preset.name, "path": str(preset.path), "values": preset.values,
                   "config": cfg.to_dict(redact=True)}, default=list)
        return
    echo(f"# {preset.path}")
    echo(preset.text.rstrip())
    echo(f"\n# resolved ({{workdir}} = {context['workdir']}, {{reward_url}} = {context['reward_url']}):")
    echo(shlex.join(entrypoint(cfg, preset.values)))
    derived = {k: v for k, v in cfg.to_dict().items() if k not in preset.values and k in derived_names(TrainerConfig)}
    echo("# derived: " + ", ".join(f"{k}={v}" for k, v in derived.items()))
