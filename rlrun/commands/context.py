"""What every command shares: the inventory and cluster it works on (:class:`Context`), and the options
more than one command takes, defined once."""

from __future__ import annotations

import math
import os
from pathlib import Path

import click

from rlrun import presets
from rlrun.errors import RlrunError
from rlrun.inventory import Cluster, default_inventory, load_cluster
from rlrun.jobs import Jobs

DEFAULT_TIMEOUT = 30.0


class Context:
    """The global options (-i, --vault-password-file, --timeout); the cluster is loaded on first use."""

    def __init__(self, inventory: str | None, vault_password_file: str | None, timeout: float):
        self.inventory_arg = inventory
        self.vault_password_file = vault_password_file
        self.timeout = timeout
        self._cluster: Cluster | None = None

    @property
    def inventory(self) -> Path:
        if self.inventory_arg is None and os.environ.get("RLRUN_INVENTORY") == "":
            raise RlrunError("RLRUN_INVENTORY is set but empty: give the inventory's path (or unset it to use "
                             "./inventory)")
        return Path(self.inventory_arg) if self.inventory_arg else default_inventory()

    @property
    def inv_flag(self) -> str:
        """` -i INV` for the commands rlrun suggests, when one was given."""
        return f" -i {self.inventory_arg}" if self.inventory_arg else ""

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = load_cluster(self.inventory, self.vault_password_file)
        return self._cluster

    def jobs(self, timeout: float | None = None) -> Jobs:
        """The cluster's Jobs API, each answer awaited at most ``timeout`` seconds (default: --timeout)."""
        return Jobs(self.cluster, timeout=self.timeout if timeout is None else timeout)


pass_ctx = click.make_pass_decorator(Context)


def not_empty(ctx, param, value):
    """A path option given as an empty string (an unset shell variable) is refused, not taken as 'default'."""
    if value is not None and not str(value).strip():
        raise click.BadParameter("is empty (an unset shell variable?): give the inventory's path")
    return value


def complete_presets(ctx, param, incomplete: str) -> list[str]:
    """Shell completion of preset names (built-in and $RLRUN_PRESETS_DIR)."""
    try:
        return [p.name for p in presets.load_all(presets.preset_dirs(())) if p.name.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion must never print a traceback into the shell
        return []


class Amount(click.ParamType):
    """A count or amount of a resource (CPUs, GPUs, nodes, seconds): a finite number, at least ``minimum``.

    click's FloatRange lets NaN and infinity through and its error names the range in Python's words; this
    says what the option is for. ``kind`` int refuses fractions."""

    def __init__(self, what: str, kind: type = float, minimum: float = 0) -> None:
        self.what, self.kind, self.minimum = what, kind, minimum
        self.name = f"{'integer' if kind is int else 'number'} >= {minimum:g}"

    def convert(self, value, param, ctx):
        if isinstance(value, self.kind) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = self.kind(str(value).strip())
            except ValueError:
                number = None
        if number is None or (isinstance(number, float) and not math.isfinite(number)) or number < self.minimum:
            article = "an integer" if self.kind is int else "a number"
            self.fail(f"{value!r} is not {self.what}: expected {article} >= {self.minimum:g}", param, ctx)
        return number

    def get_metavar(self, param, ctx=None) -> str:
        return "INTEGER" if self.kind is int else "FLOAT"


def max_time_option(default: int):
    """--max-time: how long a playbook may take."""
    return click.option("--max-time", type=Amount("a time in seconds", minimum=1), default=default,
                        show_default=True, help="Seconds the whole playbook may take before rlrun stops it.")


verbose_option = click.option("-v", "--verbose", is_flag=True, help="Show Ansible's own output.")

presets_dir_option = click.option(
    "--presets-dir", multiple=True, type=click.Path(file_okay=False),
    help="Extra directory of NAME.yaml presets (also $RLRUN_PRESETS_DIR; repeatable).")
