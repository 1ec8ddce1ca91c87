"""BM25 over the corpus with ``bm25s`` (sparse matrix of precomputed scores, numba top-k).

The corpus is tokenized by ``bm25s.tokenize`` (lower case, ``\\w\\w+`` words, English stop
words, no stemmer); queries are tokenized here by the same rule straight to the index's
token ids (a regex and one dict look-up per word: about 10x faster than going through
``bm25s.tokenize`` per request). ``tests/unit/test_retrieval_index.py`` checks both agree.
Parameters default to pyserini's (k1 0.9, b 0.4), the BM25 Search-R1 uses.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

# bm25s runs a JAX top-k at import when JAX is installed (the GPU images have it), and JAX then takes 75 % of a
# GPU's memory for itself: on a GPU node the retrieval service held 61 GB of an H100 beside the training job
# (seen on the device, 2026-11-26). The service computes on CPUs only.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import bm25s  # noqa: E402 (after the JAX settings above)
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

from trainer.retrieval._topk import topk_batch
from trainer.retrieval.corpus import CorpusError

__all__ = ["K1", "B", "TOKEN_PATTERN", "Bm25Index", "build_bm25"]

K1 = 0.9
B = 0.4
METHOD = "lucene"
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on import

_SPLIT = re.compile(TOKEN_PATTERN).findall
_STOPWORDS = frozenset(STOPWORDS_EN)


def build_bm25(texts: list[str], out_dir: Path, k1: float = K1, b: float = B) -> dict[str, object]:
    """Index ``texts`` into ``out_dir``; returns the parameters to record in meta.json."""
    tokens = bm25s.tokenize(texts, lower=True, token_pattern=TOKEN_PATTERN, stopwords=list(STOPWORDS_EN),
                            show_progress=False)  # fmt: skip
    if not tokens.vocab:
        raise CorpusError(f"no passage of the corpus has a word BM25 can index (all {len(texts)} are English "
                          "stop words, single characters or punctuation); expected passages of text")  # fmt: skip
    retriever = bm25s.BM25(k1=k1, b=b, method=METHOD, backend="numba" if bm25s.NUMBA_AVAILABLE else "numpy")
    retriever.index(tokens, show_progress=False)
    retriever.save(str(out_dir))
    return {"k1": k1, "b": b, "method": METHOD, "vocab": len(tokens.vocab), "stopwords": "en", "stemmer": None}


class Bm25Index:
    """A saved BM25 index, memory-mapped read-only (processes that load it share the pages)."""

    def __init__(self, index_dir: Path):
        # numba (installed with vLLM on every node) runs the top-k kernel; plain numpy otherwise
        self.backend = "numba" if bm25s.NUMBA_AVAILABLE else "numpy"
        self.retriever = bm25s.BM25.load(str(index_dir), mmap=True, load_corpus=False,
                                         override_params={"backend": self.backend})  # fmt: skip
        self.vocab: dict[str, int] = self.retriever.vocab_dict
        self.n_docs = int(self.retriever.scores["num_docs"])
        self._known = self.retriever.unique_token_ids_set
        scores = self.retriever.scores
        self._data, self._indices, self._indptr = scores["data"], scores["indices"], scores["indptr"]

    def token_ids(self, query: str) -> list[int]:
        """The query's words that the corpus has, as token ids (stop words and unknown words dropped)."""
        vocab, known = self.vocab, self._known
        ids = []
        for word in _SPLIT(query.lower()):
            if word in _STOPWORDS:
                continue
            tid = vocab.get(word)
            if tid is not None and tid in known:
                ids.append(tid)
        return ids

    def search(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        """Per query, up to ``topk`` (doc index, score) pairs, best first.

        Only passages that contain a query word are returned: a query with no known word
        gets an empty list, one whose words occur in fewer than ``topk`` passages a shorter one.
        """
        ids = [self.token_ids(q) for q in queries]
        return topk_batch(ids, self._data, self._indices, self._indptr, self.n_docs, min(topk, self.n_docs))

    def search_with_bm25s(self, queries: list[str], topk: int) -> list[list[tuple[int, float]]]:
        """The same search through ``bm25s.BM25.retrieve`` (the bench's baseline and the tests' reference)."""
        k = min(topk, self.n_docs)
        ids = [self.token_ids(q) for q in queries]
        live = [i for i, q in enumerate(ids) if q]
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        if not live:
            return out
        docs, scores = self.retriever.retrieve([ids[i] for i in live], k=k, n_threads=0, show_progress=False)
        docs, scores = np.asarray(docs).tolist(), np.asarray(scores, dtype=np.float64).tolist()
        for row, i in enumerate(live):
            out[i] = [(d, s) for d, s in zip(docs[row], scores[row], strict=True) if s > 0.0]
        return out

    def warm_up(self) -> None:
        """Load (or, first time after install, compile) the numba kernel now, not on the first request."""
        if len(self._indptr) > 1:
            topk_batch([[0]], self._data, self._indices, self._indptr, self.n_docs, 1)
