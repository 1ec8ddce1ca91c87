"""Build and load a retrieval index directory.

An index directory holds::

    meta.json            format, kind (bm25 | dense), n_docs, corpus path and sha256, parameters
    docs.jsonl           the passages, one compact {"id", "contents"} object per line
    docs.offsets.npy     byte offset of each line (n_docs + 1), so a passage is one slice of a mmap
    bm25/                the bm25s index (always)
    dense/faiss.index    the faiss index (kind dense: built with --embedding-model)

:func:`build_index` is idempotent and atomic: when ``out`` already holds an index of the
same corpus (sha256) with the same settings it does nothing; otherwise it builds into a
temporary sibling directory and renames it into place, so a reader never sees a half-written
index and a failed build leaves the old one as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.files import replace_dir
from trainer.retrieval.bm25 import Bm25Index, build_bm25
from trainer.retrieval.corpus import CorpusError, file_sha256, read_corpus

__all__ = ["FORMAT", "BuildResult", "Index", "IndexError_", "build_index", "check_dense", "load_index", "read_meta"]

FORMAT = 1
META = "meta.json"
DOCS = "docs.jsonl"
OFFSETS = "docs.offsets.npy"
KINDS = ("bm25", "dense")


class IndexError_(ValueError):  # noqa: N801 - IndexError is a builtin with another meaning
    """An index directory is missing, foreign, or of another format; the message says what to do."""


@dataclass(frozen=True)
class BuildResult:
    out: Path
    built: bool  # False: the index was already up to date
    meta: dict[str, Any]


def read_meta(index_dir: str | Path) -> dict[str, Any]:
    """meta.json of an index directory (IndexError_ when it is not one this code can load)."""
    index_dir = Path(index_dir)
    path = index_dir / META
    if not index_dir.is_dir():
        raise IndexError_(f"--index {index_dir}: no such directory; build it with "
                          f"python -m trainer.retrieval build --corpus CORPUS.jsonl --out {index_dir}")  # fmt: skip
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexError_(f"--index {index_dir}: no {META}; not a retrieval index (build one with "
                          "python -m trainer.retrieval build)") from None  # fmt: skip
    except (OSError, ValueError) as exc:
        raise IndexError_(f"--index {index_dir}: unreadable {META}: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("kind") not in KINDS:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise IndexError_(f"--index {index_dir}: index format {got!r}, expected {FORMAT}; rebuild it")
    return meta


def _wanted(sha: str, embedding: dict[str, Any] | None) -> dict[str, Any]:
    return {"format": FORMAT, "corpus_sha256": sha, "dense": embedding}


def _same(meta: dict[str, Any], wanted: dict[str, Any]) -> bool:
    dense = meta.get("dense")
    have_dense = None if dense is None else {k: dense.get(k) for k in ("model_sha256", "passage_prefix",
                                                                       "query_prefix", "max_length")}  # fmt: skip
    return (meta.get("format") == wanted["format"] and meta.get("corpus_sha256") == wanted["corpus_sha256"]
            and have_dense == wanted["dense"])  # fmt: skip


def build_index(
    corpus: str | Path,
    out: str | Path,
    embedding_model: str | Path | None = None,
    *,
    query_prefix: str = "",
    passage_prefix: str = "",
    max_length: int = 256,
    force: bool = False,
) -> BuildResult:
    """Build the index of ``corpus`` into ``out`` unless it is already there (see the module doc)."""
    corpus, out = Path(corpus), Path(out)
    if not corpus.is_file():
        raise CorpusError(f"--corpus {corpus}: no such file")
    if out.exists() and not out.is_dir():
        raise IndexError_(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / META).is_file():
        raise IndexError_(f"--out {out} is a non-empty directory that is not a retrieval index (no {META}); "
                          "give an empty or new directory")  # fmt: skip
    dense_key = None
    if embedding_model is not None:
        from trainer.retrieval.dense import model_fingerprint

        model = Path(embedding_model)
        if not (model / "config.json").is_file():
            raise IndexError_(f"--embedding-model {model}: no config.json there; expected a local model "
                              "directory that AutoModel.from_pretrained can load")  # fmt: skip
        dense_key = {"model_sha256": model_fingerprint(model), "passage_prefix": passage_prefix,
                     "query_prefix": query_prefix, "max_length": max_length}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(out):
        sha = file_sha256(corpus)
        wanted = _wanted(sha, dense_key)
        if not force and (out / META).is_file():
            with contextlib.suppress(IndexError_):
                meta = read_meta(out)
                if _same(meta, wanted):
                    return BuildResult(out, False, meta)
        passages = read_corpus(corpus)
        tmp = out.parent / f".{out.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            started = time.monotonic()
            _write_docs(tmp, passages)
            texts = [p.contents for p in passages]
            meta: dict[str, Any] = {
                "format": FORMAT,
                "kind": "bm25" if embedding_model is None else "dense",
                "n_docs": len(passages),
                "corpus": str(corpus.resolve()),
                "corpus_sha256": sha,
                "bm25": build_bm25(texts, tmp / "bm25"),
                "dense": None,
            }
            if embedding_model is not None:
                from trainer.retrieval.dense import build_dense

                dense = build_dense([p.contents for p in passages], tmp / "dense", embedding_model,
                                    passage_prefix=passage_prefix, max_length=max_length)  # fmt: skip
                meta["dense"] = {**dense, "passage_prefix": passage_prefix, "query_prefix": query_prefix}
            meta["build_seconds"] = round(time.monotonic() - started, 3)
            (tmp / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return BuildResult(out, True, meta)


@contextlib.contextmanager
def _build_lock(out: Path):  # type: ignore[no-untyped-def]
    """One build of ``out`` at a time (a sibling lock file; flock is released when the process dies)."""
    lock = out.parent / f".{out.name}.lock"
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_docs(out: Path, passages: list[Any]) -> None:
    offsets = np.zeros(len(passages) + 1, dtype=np.int64)
    pos = 0
    with open(out / DOCS, "wb") as fh:
        for i, p in enumerate(passages):
            line = json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False).encode("utf-8") + b"\n"
            fh.write(line)
            pos += len(line)
            offsets[i + 1] = pos
    np.save(out / OFFSETS, offsets)


class Index:
    """A loaded index: ``search`` returns (doc index, score) pairs, ``document_json`` the passage's JSON."""

    def __init__(self, index_dir: str | Path, method: str | None = None):
        self.dir = Path(index_dir)
        self.meta = read_meta(self.dir)
        self.kind = method or self.meta["kind"]
        if self.kind not in KINDS:
            raise IndexError_(f"retrieval method {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "dense" and not self.meta.get("dense"):
            raise IndexError_(f"--index {self.dir} has no dense index (it was built without --embedding-model)")
        self.n_docs = int(self.meta["n_docs"])
        self._offsets = np.load(self.dir / OFFSETS, mmap_mode="r")
        with open(self.dir / DOCS, "rb") as fh:
            self._docs = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if self.n_docs else b""
        if len(self._offsets) != self.n_docs + 1 or int(self._offsets[-1]) != len(self._docs):
            raise IndexError_(f"--index {self.dir}: {DOCS} does not match {OFFSETS}; rebuild the index")
        if self.kind == "dense":
            from trainer.retrieval.dense import DenseIndex

            self.engine: Any = DenseIndex(self.dir / "dense", self.meta["dense"])
        else:
            self.engine = Bm25Index(self.dir / "bm25")
        if self.engine.n_docs != self.n_docs:
            raise IndexError_(f"--index {self.dir}: the {self.kind} index has {self.engine.n_docs} passages, "
                              f"{META} says {self.n_docs}; rebuild the index")  # fmt: skip

    def search(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        return self.engine.search(queries, topk)

    def document_json(self, i: int) -> bytes:
        """The passage ``i`` as the JSON object bytes stored at build time."""
        return self._docs[int(self._offsets[i]) : int(self._offsets[i + 1]) - 1]

    def document(self, i: int) -> dict[str, Any]:
        return json.loads(self.document_json(i))

    def warm_up(self) -> None:
        self.engine.warm_up()


def check_dense(index_dir: str | Path, meta: dict[str, Any]) -> None:
    """Raise IndexError_ unless the dense index and its embedding model are there (without loading them)."""
    dense = meta.get("dense")
    if not dense:
        raise IndexError_(f"--index {index_dir} has no dense index (it was built without --embedding-model)")
    if not (Path(index_dir) / "dense" / "faiss.index").is_file():
        raise IndexError_(f"--index {index_dir}: dense/faiss.index is missing; rebuild the index")
    if not (Path(dense["model"]) / "config.json").is_file():
        raise IndexError_(f"the dense index {index_dir} was built with the embedding model {dense['model']}, "
                          "which is not on this node; copy the model there or rebuild the index")  # fmt: skip


def load_index(index_dir: str | Path, method: str | None = None) -> Index:
    return Index(index_dir, method)
