"""Run the reward service under gunicorn: ``python -m trainer.reward.server --port 5001 ...``.

The same command is the deployment command (gunicorn is driven programmatically
through its BaseApplication). The dataset and token are checked in the master
before any worker starts; each gunicorn worker then builds its own app and
VerifyPool. Bad arguments print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from typing import Any, NoReturn

from gunicorn.app.base import BaseApplication

from trainer import services
from trainer.reward.extract import DEFAULT_STRATEGIES, STRATEGIES, validate_strategies
from trainer.reward.forms import LENIENCIES, validate_leniencies
from trainer.reward.pool import default_processes
from trainer.reward.server.config import TOKEN_ENV, ConfigError, ServerConfig
from trainer.reward.server.dataset import DatasetError, DatasetIndex, load_dataset
from trainer.reward.server.worker import Limits, worker_class_path

PROG = "python -m trainer.reward.server"
log = logging.getLogger("trainer.reward.server")

_OneLineParser = services.one_line_parser(PROG)
_port = services.port
_positive = services.positive


def fail(message: str) -> NoReturn:
    """Print ``message`` as one line on stderr and exit 2."""
    services.fail(PROG, message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI. Options accept both --snake_case and --kebab-case spellings."""
    p = _OneLineParser(prog=PROG, description="Remote math reward service (OpenRLHF --remote_rm_url).")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=5001, help="TCP port (default 5001)")
    p.add_argument("--dataset", help="JSON array or JSONL file with prompts and reference answers")
    p.add_argument("--input_key", "--input-key", dest="input_key", default="input", help="prompt field")
    p.add_argument(
        "--label_key",
        "--label-key",
        dest="label_key",
        default="answer",
        help="answer field (default answer; 'label' is used when it is absent)",
    )
    p.add_argument(
        "--prompt-template",
        "--prompt_template",
        dest="prompt_template",
        default="none",
        help="how dataset prompts are rendered: chatml, none, or a string with {}",
    )
    auth = p.add_mutually_exclusive_group()
    auth.add_argument(
        "--token-file",
        "--token_file",
        dest="token_file",
        help=f"file (mode 0600) holding the bearer token; default: ${TOKEN_ENV}",
    )
    auth.add_argument(
        "--no-auth",
        "--no_auth",
        dest="no_auth",
        action="store_true",
        help="serve without authentication (logs a warning)",
    )
    p.add_argument("--workers", type=_positive(int), default=1, help="gunicorn worker processes (default 1)")
    p.add_argument(
        "--threads", type=_positive(int), default=8, help="threads per gunicorn worker (default 8)"
    )
    p.add_argument(
        "--verify-processes",
        "--verify_processes",
        dest="verify_processes",
        type=_positive(int),
        default=None,
        help=f"verifier processes per gunicorn worker (default: CPUs = {default_processes()})",
    )
    p.add_argument(
        "--max-verify-processes",
        "--max_verify_processes",
        dest="max_verify_processes",
        type=_positive(int),
        default=None,
        help="cap on verifier processes incl. ones stuck on slow items (default 4 * verify-processes + 4)",
    )
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=3.0,
        help="CPU seconds one item may use before it scores 0 as timeout (default 3); time spent "
        "waiting for a CPU on a busy machine does not count",
    )
    p.add_argument(
        "--wall-timeout",
        "--wall_timeout",
        dest="wall_timeout",
        type=_positive(float),
        default=None,
        help="wall-clock backstop per item: one that never got its CPU time is retried once in a fresh "
        "verifier, then scores timeout (default 10 * timeout + 30)",
    )
    p.add_argument(
        "--max-number-digits",
        "--max_number_digits",
        dest="max_digits",
        type=int,
        default=100_000,
        help="answers whose exact value has more digits (9^{9^{9}}) score 0 as too_complex; 0 disables",
    )
    p.add_argument("--max-items", "--max_items", dest="max_items", type=_positive(int), default=4096)
    p.add_argument(
        "--max-body-bytes",
        "--max_body_bytes",
        dest="max_body_bytes",
        type=_positive(int),
        default=16 * 1024 * 1024,
    )
    p.add_argument(
        "--max-chars",
        "--max_chars",
        dest="max_chars",
        type=_positive(int),
        default=200_000,
        help="longest accepted query/prompt/label string",
    )
    p.add_argument(
        "--extract",
        default=",".join(DEFAULT_STRATEGIES),
        help=f"answer extraction strategies in order (default {','.join(DEFAULT_STRATEGIES)}; "
        f"all: {','.join(STRATEGIES)}); leave out final_expression to score responses without "
        "a marked answer (boxed, <answer>, 'answer is', ####) as no_answer",
    )
    p.add_argument(
        "--lenient",
        default=",".join(LENIENCIES),
        help=f"leniencies of the comparison, comma-separated, or none (default {','.join(LENIENCIES)}): units "
        "drops a unit after the answer (2\\pi cm = 2\\pi), styled_letters reads \\mathcal{B} as B; leave one out "
        "for a dataset where the unit or the letter's style is part of the answer",
    )
    conn = p.add_argument_group("connections")
    conn.add_argument(
        "--head-timeout",
        "--head_timeout",
        dest="head_timeout",
        type=_positive(float),
        default=10.0,
        help="seconds a client has to send a request's line and headers (default 10); late ones get 408",
    )
    conn.add_argument(
        "--body-timeout",
        "--body_timeout",
        dest="body_timeout",
        type=_positive(float),
        default=60.0,
        help="seconds a client has to send a request body once its headers are in (default 60)",
    )
    conn.add_argument(
        "--keepalive",
        type=_positive(float),
        default=5.0,
        help="seconds an idle kept-alive connection stays open (default 5)",
    )
    conn.add_argument(
        "--max-connections",
        "--max_connections",
        dest="max_connections",
        type=_positive(int),
        default=1000,
        help="open connections per gunicorn worker, idle ones included (default 1000)",
    )
    conn.add_argument("--certfile", help="serve HTTPS with this PEM certificate (chain)")
    conn.add_argument("--keyfile", help="private key of --certfile (PEM, mode 0600)")
    p.add_argument(
        "--memory-limit-mb",
        "--memory_limit_mb",
        dest="memory_limit_mb",
        type=_positive(int),
        default=1024,
        help="address-space limit per verifier process",
    )
    p.add_argument(
        "--log-level",
        "--log_level",
        dest="log_level",
        default="info",
        choices=["debug", "info", "warning", "error"],
    )
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig for parsed CLI arguments (raises ConfigError / ValueError on bad values)."""
    return ServerConfig(
        auth=not args.no_auth,
        token_file=args.token_file,
        dataset=args.dataset,
        input_key=args.input_key,
        label_key=args.label_key,
        prompt_template=args.prompt_template,
        strategies=validate_strategies([s.strip() for s in args.extract.split(",") if s.strip()]),
        lenient=validate_leniencies(args.lenient.split(",")),
        timeout=args.timeout,
        wall_timeout=args.wall_timeout,
        verify_processes=args.verify_processes,
        max_verify_processes=args.max_verify_processes,
        max_digits=args.max_digits,
        max_body_bytes=args.max_body_bytes,
        max_items=args.max_items,
        max_chars=args.max_chars,
        memory_limit_mb=args.memory_limit_mb,
    )


class RewardServer(BaseApplication):
    """gunicorn, configured in code; each worker calls load() after the fork."""

    def __init__(
        self, config: ServerConfig, dataset: DatasetIndex | None, options: dict[str, Any], limits: Limits
    ) -> None:
        self._config = config
        self._dataset = dataset
        self._options = options
        self.worker_limits = limits  # read by ReadFirstWorker in each worker
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            self.cfg.set(key, value)
        if "control_socket_disable" in self.cfg.settings:  # gunicorn >= 24: no ~/.gunicorn control socket
            self.cfg.set("control_socket_disable", True)

    def load(self) -> Any:
        from trainer.reward.server.app import create_app

        return create_app(self._config, dataset=self._dataset)


def _close_pool(_server: Any, worker: Any) -> None:
    """gunicorn worker_exit hook: stop this worker's verifier processes."""
    from trainer.reward.server.app import EXTENSION

    app = getattr(worker, "wsgi", None)
    state = getattr(app, "extensions", {}).get(EXTENSION) if app is not None else None
    if state is not None:
        state.pool.close()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, check token and dataset, then run gunicorn (blocks)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = config_from_args(args)
        config.resolve_token()  # fail now, in the master, not in every worker
        dataset = None
        if config.dataset:
            if not os.path.isfile(config.dataset):
                fail(f"--dataset {config.dataset}: no such file")
            dataset = load_dataset(config.dataset, config.input_key, config.label_key, config.prompt_template)
            log.info("dataset %s: %d prompts with reference answers", config.dataset, len(dataset))
    except (ConfigError, DatasetError, ValueError) as exc:
        fail(str(exc))
    if bool(args.certfile) != bool(args.keyfile):
        fail("--certfile and --keyfile go together; give both to serve HTTPS, neither for HTTP")
    for flag, path in (("--certfile", args.certfile), ("--keyfile", args.keyfile)):
        if path and not os.path.isfile(path):
            fail(f"{flag} {path}: no such file")
    host = f"[{args.host}]" if ":" in args.host and not args.host.startswith("[") else args.host
    limits = Limits(args.head_timeout, args.body_timeout, args.keepalive, args.max_body_bytes)
    options = {
        "bind": f"{host}:{args.port}",
        "workers": args.workers,
        "threads": args.threads,
        "worker_class": worker_class_path(),
        "worker_connections": args.max_connections,
        "timeout": 120,
        "graceful_timeout": 30,
        "keepalive": max(1, math.ceil(args.keepalive)),  # gunicorn wants whole seconds; the worker uses limits
        "accesslog": None,
        "errorlog": "-",
        "loglevel": args.log_level,
        "preload_app": False,
        "proc_name": "rlrun-reward",
        "worker_exit": _close_pool,
    }
    if args.certfile:
        options.update(certfile=args.certfile, keyfile=args.keyfile)
    RewardServer(config, dataset, options, limits).run()


if __name__ == "__main__":
    main()
