"""Run the reward service under gunicorn: ``python -m trainer.reward.server --port 5001 ...``.

The same command is the deployment command (gunicorn is driven in code: trainer.services.serve).
Its flags are the table FLAGS (trainer.services.cli). The dataset and token are checked in the
master before any worker starts; each gunicorn worker then builds its own app and VerifyPool.
Bad arguments print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any, NoReturn

from trainer.reward.extract import DEFAULT_STRATEGIES, STRATEGIES, validate_strategies
from trainer.reward.forms import LENIENCIES, validate_leniencies
from trainer.reward.pool import default_processes
from trainer.reward.server.app import EXTENSION, create_app
from trainer.reward.server.config import TOKEN_ENV, ServerConfig, ServiceConfigError
from trainer.reward.server.dataset import DatasetError, load_dataset
from trainer.services import cli
from trainer.services.cli import Flag, positive
from trainer.services.serve import serve

PROG = "python -m trainer.reward.server"
log = logging.getLogger("trainer.reward.server")

_CONNECTIONS = "connections"
FLAGS = (
    cli.HOST,
    cli.PORT.but(default=5001, help="TCP port (default 5001)"),
    Flag("dataset", "JSON array or JSONL file with prompts and reference answers"),
    Flag("input-key", "prompt field", default="input"),
    Flag("label-key", "answer field (default answer; 'label' is used when it is absent)", default="answer"),
    Flag("prompt-template", "how dataset prompts are rendered: chatml, none, or a string with {}", default="none"),
    cli.TOKEN_FILE.but(help=f"file (mode 0600) holding the bearer token; default: ${TOKEN_ENV}"),
    cli.NO_AUTH,
    cli.WORKERS,
    cli.THREADS,
    Flag("verify-processes", f"verifier processes per gunicorn worker (default: CPUs = {default_processes()})",
         type=positive(int)),
    Flag("max-verify-processes", "cap on verifier processes incl. ones stuck on slow items "
         "(default 4 * verify-processes + 4)", type=positive(int)),
    Flag("timeout", "CPU seconds one item may use before it scores 0 as timeout (default 3); time spent waiting "
         "for a CPU on a busy machine does not count", default=3.0, type=positive(float)),
    Flag("wall-timeout", "wall-clock backstop per item: one that never got its CPU time is retried once in a fresh "
         "verifier, then scores timeout (default 10 * timeout + 30)", type=positive(float)),
    Flag("max-number-digits", "answers whose exact value has more digits (9^{9^{9}}) score 0 as too_complex; "
         "0 disables", default=100_000, type=int, dest="max_digits"),
    Flag("max-items", "items per request (default 4096)", default=4096, type=positive(int)),
    cli.MAX_BODY_BYTES.but(default=16 * 1024 * 1024, help="largest request body in bytes (default 16 MiB)"),
    cli.MAX_CHARS.but(default=200_000, help="longest accepted query/prompt/label string (default 200000)"),
    Flag("extract", f"answer extraction strategies in order (default {','.join(DEFAULT_STRATEGIES)}; all: "
         f"{','.join(STRATEGIES)}); leave out final_expression to score responses without a marked answer (boxed, "
         "<answer>, 'answer is', ####) as no_answer", default=",".join(DEFAULT_STRATEGIES)),
    Flag("lenient", f"leniencies of the comparison, comma-separated, or none (default {','.join(LENIENCIES)}): "
         "units drops a unit after the answer (2\\pi cm = 2\\pi), styled_letters reads \\mathcal{B} as B; leave one "
         "out for a dataset where the unit or the letter's style is part of the answer", default=",".join(LENIENCIES)),
    cli.HEAD_TIMEOUT.but(group=_CONNECTIONS),
    cli.BODY_TIMEOUT.but(group=_CONNECTIONS),
    cli.KEEPALIVE.but(group=_CONNECTIONS),
    Flag("max-connections", "open connections per gunicorn worker, idle ones included (default 1000)",
         default=1000, type=positive(int), group=_CONNECTIONS),
    Flag("certfile", "serve HTTPS with this PEM certificate (chain)", group=_CONNECTIONS),
    Flag("keyfile", "private key of --certfile (PEM, mode 0600)", group=_CONNECTIONS),
    Flag("memory-limit-mb", "address-space limit per verifier process in MiB (default 1024)", default=1024,
         type=positive(int)),
    cli.LOG_LEVEL,
)


def fail(message: str) -> NoReturn:
    """Print ``message`` as one line on stderr and exit 2."""
    cli.fail(PROG, message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI (the table FLAGS). Options accept both --snake_case and --kebab-case spellings."""
    parser = cli.one_line_parser(PROG)(prog=PROG, description="Remote math reward service (OpenRLHF --remote_rm_url).")
    return cli.add_flags(parser, FLAGS)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig for parsed CLI arguments (raises ServiceConfigError / ValueError on bad values).

    A flag whose dest names a ServerConfig field sets that field; --no-auth, --extract and --lenient are
    translated.
    """
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)
             if f.name in vars(args) and f.name != "lenient"}
    strategies = validate_strategies([s.strip() for s in args.extract.split(",") if s.strip()])
    return ServerConfig(auth=not args.no_auth, strategies=strategies, lenient=validate_leniencies(args.lenient.split(",")),
                        **given)


def _close_pool(_server: Any, worker: Any) -> None:
    """gunicorn worker_exit hook: stop this worker's verifier processes."""
    app = getattr(worker, "wsgi", None)
    state = getattr(app, "extensions", {}).get(EXTENSION) if app is not None else None
    if state is not None:
        state.pool.close()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, check token and dataset, then run gunicorn (blocks)."""
    args = build_parser().parse_args(argv)
    cli.setup_logging(args.log_level)
    try:
        config = config_from_args(args)
        config.resolve_token()  # fail now, in the master, not in every worker
        dataset = None
        if config.dataset:
            if not os.path.isfile(config.dataset):
                fail(f"--dataset {config.dataset}: no such file")
            dataset = load_dataset(config.dataset, config.input_key, config.label_key, config.prompt_template)
            log.info("dataset %s: %d prompts with reference answers", config.dataset, len(dataset))
    except (ServiceConfigError, DatasetError, ValueError) as exc:
        fail(str(exc))
    if bool(args.certfile) != bool(args.keyfile):
        fail("--certfile and --keyfile go together; give both to serve HTTPS, neither for HTTP")
    for flag, path in (("--certfile", args.certfile), ("--keyfile", args.keyfile)):
        if path and not os.path.isfile(path):
            fail(f"{flag} {path}: no such file")
    options: dict[str, Any] = {"worker_connections": args.max_connections, "worker_exit": _close_pool}
    if args.certfile:
        options.update(certfile=args.certfile, keyfile=args.keyfile)
    serve(args, proc_name="rlrun-reward", load=lambda: create_app(config, dataset=dataset), **options)


if __name__ == "__main__":
    main()
