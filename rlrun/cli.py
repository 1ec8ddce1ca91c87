"""rlrun: provision a Ray RL cluster from an Ansible inventory and run jobs on it.

Thin over the SDKs it wraps: ansible-runner for up / down / check, Ray's Jobs
API for submit / list / status / logs / stop. Every failure is one line on
stderr and a non-zero exit; every wait on the cluster has a timeout.

This module is the dispatcher: the global options, the command groups of
rlrun/commands/ (cluster, submit, jobs, presets, plot, slurm), and the turning
of every failure into that one line.
"""

from __future__ import annotations

import os
import sys

import click

from rlrun.commands import cluster, jobs, plot, presets, slurm, submit
from rlrun.commands.context import DEFAULT_TIMEOUT, Amount, Context, not_empty
from rlrun.commands.output import err_console, say
from rlrun.errors import RlrunError, command_error


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-i", "--inventory", envvar="RLRUN_INVENTORY", type=click.Path(), callback=not_empty,
              help="Ansible inventory of the cluster (default: $RLRUN_INVENTORY, ./inventory, else the embedded one).")
@click.option("--vault-password-file", envvar="ANSIBLE_VAULT_PASSWORD_FILE",
              type=click.Path(exists=True, dir_okay=False),
              help="Vault password file, when the inventory's token is vaulted.")
@click.option("--timeout", type=Amount("a time in seconds", minimum=0.1), envvar="RLRUN_TIMEOUT",
              default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds to wait for each answer from the cluster ($RLRUN_TIMEOUT).")
@click.version_option(package_name="rlrun")
@click.pass_context
def cli(ctx, inventory, vault_password_file, timeout):
    """Stand up a Ray RL-training cluster from an inventory and run jobs on it.

    Shell completion (bash): eval "$(_RLRUN_COMPLETE=bash_source rlrun)"; zsh: zsh_source; fish: fish_source.
    """
    ctx.obj = Context(inventory, vault_password_file, timeout)


for command in (*cluster.COMMANDS, submit.submit, *jobs.COMMANDS, presets.presets, plot.plot, slurm.slurm):
    cli.add_command(command)


def _usage_error(exc: click.UsageError) -> str:
    """A usage error (a bad option, value or command) as one line, with where to read the command's options."""
    command = exc.ctx.command_path if exc.ctx else "rlrun"
    return f"{' '.join(exc.format_message().split())} ({command} --help lists the options)"


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure is one line on stderr and a non-zero exit (RLRUN_TRACEBACK=1 shows where)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        cli.main(args=argv, prog_name="rlrun", standalone_mode=False)
    except RlrunError as exc:
        err_console.print(f"error: {exc}", style="red", highlight=False, markup=False, soft_wrap=True)
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        say("interrupted")
        return 130
    except click.UsageError as exc:
        err_console.print(f"error: {_usage_error(exc)}", style="red", highlight=False, markup=False, soft_wrap=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # noqa: BLE001 - the CLI's promise: no traceback, one line
        if os.environ.get("RLRUN_TRACEBACK"):
            raise
        err_console.print(f"error: {command_error(exc)}", style="red", highlight=False, markup=False, soft_wrap=True)
        return 1
    return 0


def run() -> None:
    """Console-script wrapper."""
    sys.exit(main())


if __name__ == "__main__":
    run()
