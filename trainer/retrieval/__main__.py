"""``python -m trainer.retrieval build|serve``: build an index once, serve it under gunicorn.

    python -m trainer.retrieval build --corpus CORPUS.jsonl --out INDEX_DIR [--embedding-model PATH]
    python -m trainer.retrieval serve --index INDEX_DIR --host ADDR --port PORT [--token-file FILE | --no-auth]
                                      [--workers N] [--threads N] [--max-queries 512] [--max-topk 50]

``build`` is idempotent (same corpus and settings: nothing to do, exit 0) and atomic.
``serve`` checks the index and the token in the master, loads the index there (memory-mapped,
numba kernels compiled once) and forks the workers, which share it. It runs under gunicorn
as the reward service does (trainer.services.serve: requests read whole in the event loop,
against head/body deadlines). Its flags are the tables BUILD_FLAGS and SERVE_FLAGS
(trainer.services.cli). Bad arguments print one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
from typing import NoReturn

from flask import Flask

from trainer.retrieval.app import RetrievalLimits, create_app
from trainer.retrieval.corpus import CorpusError
from trainer.retrieval.index import IndexError_, build_index, check_dense, load_index, read_meta
from trainer.services import cli
from trainer.services.cli import Flag, ServiceConfigError, positive
from trainer.services.serve import serve
from trainer.services.token import load_token_file

PROG = "python -m trainer.retrieval"
log = logging.getLogger("trainer.retrieval")

BUILD_FLAGS = (
    Flag("corpus", 'JSONL, one {"id": ..., "contents": ...} per line', required=True),
    Flag("out", "index directory to create or update", required=True),
    Flag("embedding-model", "local model directory (AutoModel.from_pretrained) for a dense faiss index"),
    Flag("query-prefix", "dense: text put before each query (e5: 'query: ')", default=""),
    Flag("passage-prefix", "dense: text put before each passage (e5: 'passage: ')", default=""),
    Flag("max-length", "dense: tokens per text (default 256)", default=256, type=positive(int)),
    Flag("force", "rebuild even when the index is up to date", switch=True),
)
SERVE_FLAGS = (
    Flag("index", "index directory made by build", required=True),
    cli.HOST,
    cli.PORT.but(default=8000, help="TCP port (default 8000, Search-R1's)"),
    cli.TOKEN_FILE.but(help="file (mode 0600) with the bearer token; without it only a loopback address is served"),
    cli.NO_AUTH.but(help="serve any address without a token (a cluster with authentication off; logs a warning)"),
    Flag("method", "retrieval method (default: the index's kind)", choices=("bm25", "dense")),
    cli.WORKERS,
    cli.THREADS.but(default=4, help="threads per worker (default 4)"),
    Flag("max-queries", "queries per request (default 512)", default=512, type=positive(int)),
    Flag("max-topk", "largest topk (default 50)", default=50, type=positive(int)),
    cli.MAX_CHARS.but(default=10_000, help="longest query in characters (default 10000)"),
    cli.MAX_BODY_BYTES.but(default=4 * 1024 * 1024, help="largest request body (default 4 MiB)"),
    cli.HEAD_TIMEOUT,
    cli.BODY_TIMEOUT,
    cli.KEEPALIVE,
    cli.LOG_LEVEL,
)


def fail(message: str) -> NoReturn:
    """Print ``message`` as one line on stderr and exit 2."""
    cli.fail(PROG, message)


def build_parser() -> argparse.ArgumentParser:
    """The CLI (the tables BUILD_FLAGS and SERVE_FLAGS); options accept --kebab-case and --snake_case."""
    parser_class = cli.one_line_parser(PROG)
    p = parser_class(prog=PROG, description="Retrieval service for Search-R1-style tool rollouts.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=parser_class, metavar="{build,serve}")
    cli.add_flags(sub.add_parser("build", help="index a JSONL corpus (idempotent)"), BUILD_FLAGS)
    cli.add_flags(sub.add_parser("serve", help="serve an index over HTTP under gunicorn"), SERVE_FLAGS)
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cmd_build(args: argparse.Namespace) -> None:
    try:
        result = build_index(args.corpus, args.out, args.embedding_model, query_prefix=args.query_prefix,
                             passage_prefix=args.passage_prefix, max_length=args.max_length,
                             force=args.force)  # fmt: skip
    except (CorpusError, IndexError_) as exc:
        fail(str(exc))
    meta = result.meta
    what = "built" if result.built else "up to date"
    print(f"{result.out}: {what} ({meta['kind']}, {meta['n_docs']} passages, corpus sha256 "
          f"{meta['corpus_sha256'][:12]})")  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> None:
    token = None
    if args.token_file:
        try:
            token = load_token_file(args.token_file)
        except ServiceConfigError as exc:
            fail(str(exc))
    elif not is_loopback(args.host) and not args.no_auth:
        fail(f"--host {args.host} is not a loopback address and no --token-file was given; "
             "give --token-file FILE (mode 0600) to serve other hosts, bind 127.0.0.1, "
             "or pass --no-auth to serve without authentication")  # fmt: skip
    try:
        meta = read_meta(args.index)
        kind = args.method or meta["kind"]
        if kind == "dense":
            # torch's OpenMP threads do not survive fork(): each worker loads the model itself
            check_dense(args.index, meta)
            index = None
        else:
            index = load_index(args.index, kind)
            index.warm_up()  # numba kernel loaded once here; the forked workers share it and the mmap
    except (IndexError_, FileNotFoundError) as exc:
        fail(str(exc))
    log.info("index %s: %s, %d passages", args.index, kind, meta["n_docs"])
    if token is None:
        log.warning("authentication is OFF (no --token-file): anyone who can reach %s:%d can use it",
                    args.host, args.port)  # fmt: skip
    limits = RetrievalLimits(args.max_queries, args.max_topk, args.max_chars, args.max_body_bytes)

    def load() -> Flask:
        if index is None:
            loaded = load_index(args.index, kind)
            loaded.warm_up()
            return create_app(loaded, token, limits)
        return create_app(index, token, limits)

    serve(args, proc_name="rlrun-retriever", load=load)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cli.setup_logging(getattr(args, "log_level", "info"))
    logging.getLogger("faiss").setLevel(logging.WARNING)
    if args.command == "build":
        cmd_build(args)
    else:
        cmd_serve(args)


if __name__ == "__main__":
    main()
