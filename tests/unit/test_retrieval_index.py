"""trainer.retrieval: corpus checks, index build (idempotent, atomic), BM25 and dense search, the request parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bm25s
import pytest

from trainer.retrieval.app import RetrievalLimits, parse_request, render_result
from trainer.retrieval.bm25 import TOKEN_PATTERN, Bm25Index
from trainer.retrieval.client import RetrievalClient, RetrievalError, token_from_env
from trainer.retrieval.corpus import CorpusError, read_corpus
from trainer.retrieval.index import IndexError_, build_index, load_index
from trainer.services.app import RequestError

ROOT = Path(__file__).resolve().parents[2]
PASSAGES = [
    {"id": "paris", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "berlin", "contents": '"Berlin"\nBerlin is the capital of Germany, on the Spree.'},
    {"id": "cat", "contents": '"Cat"\nThe cat is a small carnivorous mammal with whiskers.'},
    {"contents": '"Lima"\nLima is the capital of Peru; its old town is on the Rimac.'},
    {"id": 7, "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
]


def write_corpus(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", PASSAGES)


@pytest.fixture(scope="module")
def index_dir(corpus: Path) -> Path:
    out = corpus.parent / "index"
    result = build_index(corpus, out)
    assert result.built and result.meta["n_docs"] == len(PASSAGES)
    return out


# ---------------------------------------------------------------- corpus


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "x", "contents": "a" ', "not JSON"),
        ('["a", "b"]', "a JSON list, not an object"),
        ('{"id": "x", "text": "no contents"}', '"contents" is missing'),
        ('{"id": "x", "contents": ""}', "expected a non-empty string"),
        ('{"id": "x", "contents": 12}', '"contents" is 12'),
        ('{"id": ["x"], "contents": "a b"}', '"id" is ["x"]'),
        ('{"id": "paris", "contents": "dup"}', "id 'paris' is already used on line 1"),
    ],
)
def test_bad_corpus_line_is_named_with_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = write_corpus(tmp_path / "c.jsonl", PASSAGES[:2])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n" + line + "\n")  # a blank line 3 (skipped), the bad one on line 4
    with pytest.raises(CorpusError) as err:
        read_corpus(path)
    assert f"{path}:4:" in str(err.value)
    assert message in str(err.value)


def test_corpus_ids_default_to_line_numbers_and_bad_bytes_are_named(tmp_path: Path) -> None:
    passages = read_corpus(write_corpus(tmp_path / "c.jsonl", PASSAGES))
    assert [p.id for p in passages] == ["paris", "berlin", "cat", "4", "7"]
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"contents": "ok"}\n{"contents": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=rf"{bad}:2: not UTF-8"):
        read_corpus(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(CorpusError, match="no passages"):
        read_corpus(empty)


# ---------------------------------------------------------------- build


def test_build_is_idempotent(corpus: Path, index_dir: Path) -> None:
    stamps = {p.name: p.stat().st_mtime_ns for p in index_dir.iterdir()}
    again = build_index(corpus, index_dir)
    assert not again.built
    assert {p.name: p.stat().st_mtime_ns for p in index_dir.iterdir()} == stamps


def test_changed_corpus_rebuilds_and_failed_build_keeps_the_old_index(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.jsonl", PASSAGES[:3])
    out = tmp_path / "idx"
    build_index(corpus, out)
    assert load_index(out).search(["Shakespeare"], 3) == [[]]
    write_corpus(corpus, PASSAGES)
    result = build_index(corpus, out)
    assert result.built and result.meta["n_docs"] == 5
    index = load_index(out)
    assert index.document(index.search(["Shakespeare"], 3)[0][0][0])["id"] == "7"
    with open(corpus, "a") as fh:
        fh.write("not json\n")
    with pytest.raises(CorpusError, match=rf"{corpus}:6:"):
        build_index(corpus, out)
    assert load_index(out).n_docs == 5  # the old index, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == [".idx.lock", "c.jsonl", "idx"]  # no temp dirs left


def test_build_refuses_a_directory_that_is_not_an_index(tmp_path: Path, corpus: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(IndexError_, match="not a retrieval index"):
        build_index(corpus, tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"
    with pytest.raises(IndexError_, match="no such directory"):
        load_index(tmp_path / "missing")


# ---------------------------------------------------------------- BM25 search


def test_query_tokens_match_bm25s_tokenizer(index_dir: Path) -> None:
    index = Bm25Index(index_dir / "bm25")
    text = "The CAPITAL of France's largest-city, Berlin's Spree & whiskers; a b 42 Über"
    ours = index.token_ids(text)
    ref = bm25s.tokenize([text], token_pattern=TOKEN_PATTERN, stopwords="en", return_ids=False,
                         show_progress=False)[0]  # fmt: skip
    assert ours == [index.vocab[w] for w in ref if w in index.vocab]
    assert len(ours) >= 5


def test_bm25_ranks_the_passage_with_the_query_words_first(index_dir: Path) -> None:
    index = load_index(index_dir)
    hits = index.search(["capital of Peru", "who wrote Hamlet", "the of and", "capital"], 10)
    assert index.document(hits[0][0][0])["contents"].startswith('"Lima"')
    assert index.document(hits[1][0][0])["id"] == "7"
    assert hits[2] == []  # only stop words: nothing matches
    assert len(hits[3]) == 3  # three passages say "capital"; topk 10 > n_docs is clamped, zero scores dropped
    scores = [s for _, s in hits[3]]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0


def test_corpus_edge_cases_from_other_projects_issues(tmp_path: Path) -> None:
    """bm25s #127: a word in two of five passages scored 0 for one of them; haystack #11619 / bm25s #60:
    a corpus without any indexable word crashed at index or query time."""
    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "q.jsonl", [{"contents": w} for w in
                             ("foo", "dog", "baz", "quick god", "quick fox")]), out)  # fmt: skip
    hits = load_index(out).search(["quick", "fox quick", "a"], 5)
    assert [d for d, _ in hits[0]] == [3, 4] and hits[0][0][1] == hits[0][1][1] > 0
    assert [d for d, _ in hits[1]] == [4, 3] and hits[1][0][1] > hits[1][1][1]
    assert hits[2] == []
    stop = write_corpus(tmp_path / "stop.jsonl", [{"contents": "the of"}, {"contents": "a b c , ."}])
    with pytest.raises(CorpusError, match="no passage of the corpus has a word BM25 can index"):
        build_index(stop, tmp_path / "stop-idx")
    assert not (tmp_path / "stop-idx").exists()


# ---------------------------------------------------------------- dense (tiny self-made model)


def test_dense_index_over_a_tiny_local_model(tmp_path: Path, corpus: Path) -> None:
    from trainer.tiny import make_model

    model = make_model(tmp_path / "model", hidden_size=64, num_layers=1, num_heads=1)
    out = tmp_path / "dense"
    result = build_index(corpus, out, model)
    assert result.built and result.meta["kind"] == "dense" and result.meta["dense"]["dim"] == 64
    assert not build_index(corpus, out, model).built
    index = load_index(out)
    assert index.kind == "dense"
    hits = index.search([PASSAGES[2]["contents"], PASSAGES[4]["contents"]], 2)
    assert [index.document(row[0][0])["id"] for row in hits] == ["cat", "7"]
    assert hits[0][0][1] == pytest.approx(1.0, abs=1e-4)  # same text, same normalised embedding
    assert load_index(out, "bm25").kind == "bm25"  # a dense index carries the BM25 one too
    make_model(tmp_path / "model", hidden_size=64, num_layers=1, num_heads=1, seed=1)  # other weights
    assert build_index(corpus, out, model).built


# ---------------------------------------------------------------- request parsing and rendering

LIMITS = RetrievalLimits(max_queries=4, max_topk=5, max_chars=50)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not JSON"),
        (b"null", "a JSON NoneType"),
        (b'{"queries": "capital of peru"}', "'queries' is a str; expected a list"),
        (b'{"topk": 3}', "'queries' is missing"),
        (b'{"queries": []}', "'queries' has 0 items"),
        (b'{"queries": ["a", "b", "c", "d", "e"]}', "'queries' has 5 items; expected 1 to 4"),
        (b'{"queries": ["a", 3]}', "queries[1] is a int"),
        (b'{"queries": ["a", null]}', "queries[1] is a NoneType"),
        (b'{"queries": ["a", "  "]}', "queries[1] is empty"),
        (json.dumps({"queries": ["x" * 51]}).encode(), "queries[0] has 51 characters"),
        (b'{"queries": ["a"], "topk": 0}', "'topk' is 0; expected 1 to 5"),
        (b'{"queries": ["a"], "topk": 6}', "'topk' is 6"),
        (b'{"queries": ["a"], "topk": "3"}', "'topk' is \"3\""),
        (b'{"queries": ["a"], "topk": 2.5}', "'topk' is 2.5"),
        (b'{"queries": ["a"], "topk": true}', "'topk' is true"),
        (b'{"queries": ["a"], "return_scores": "yes"}', "'return_scores' is \"yes\""),
        (b'{"queries": ["a"], "query": "b"}', "unknown field(s) 'query'"),
        (b"\xff\xfe\x00", "not"),
        (b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
        (b'{"queries": ["a\\ud800"], "topk": 1e999}', "'topk' is Infinity"),
    ],
)
def test_bad_requests_are_named(body: bytes, message: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_request(body, LIMITS)
    assert err.value.status == 400
    assert message in err.value.message


def test_request_defaults_and_rendering(index_dir: Path) -> None:
    assert parse_request(b'{"queries": ["a"]}', LIMITS) == (["a"], 3, False)
    assert parse_request(b'{"queries": ["a"], "topk": null, "return_scores": true}', LIMITS) == (["a"], 3, True)
    index = load_index(index_dir)
    hits = index.search(["capital of Peru", "zzz"], 2)
    with_scores = json.loads(render_result(index, hits, True))["result"]
    assert with_scores[0][0]["document"] == {"id": "4", "contents": PASSAGES[3]["contents"]}
    assert with_scores[0][0]["score"] == pytest.approx(hits[0][0][1], rel=1e-5)
    assert with_scores[1] == []
    plain = json.loads(render_result(index, hits, False))["result"]
    assert plain[0] == [item["document"] for item in with_scores[0]]


# ---------------------------------------------------------------- CLI argument errors (no server starts)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer.retrieval", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_cli_errors_are_one_line_exit_2(tmp_path: Path, index_dir: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"contents": "fine"}\n{"contents": \n')
    cases = [
        (("build", "--corpus", str(bad), "--out", str(tmp_path / "i")), f"{bad}:2: not JSON"),
        (("serve", "--index", str(index_dir), "--host", "0.0.0.0"), "--host 0.0.0.0 is not a loopback address"),
        (("serve", "--index", str(tmp_path / "nope")), "no such directory"),
        (("serve", "--index", str(index_dir), "--port", "70000"), "expected a TCP port 1-65535"),
        (("serve", "--index", str(index_dir), "--workers", "0"), "must be > 0"),
        (("serve", "--index", str(index_dir), "--token-file", str(bad)), "accessible by group/others"),
        (("serve", "--index", str(index_dir), "--token-file", str(bad), "--no-auth"), "not allowed with argument"),
    ]
    for args, message in cases:
        proc = _cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "i").exists()
    ok = _cli("build", "--corpus", str(index_dir.parent / "corpus.jsonl"), "--out", str(index_dir))
    assert ok.returncode == 0 and "up to date" in ok.stdout


# ---------------------------------------------------------------- client (no server)


def test_client_token_sources_and_url_checks(tmp_path: Path) -> None:
    token_file = tmp_path / "tok"
    token_file.write_text("from-file\n")
    assert token_from_env({"RLRUN_RETRIEVER_TOKEN": "t1", "RLRUN_RETRIEVER_TOKEN_FILE": str(token_file)}) == "t1"
    assert token_from_env({"RLRUN_RETRIEVER_TOKEN_FILE": str(token_file)}) == "from-file"
    assert token_from_env({}) is None
    with pytest.raises(RetrievalError, match="cannot read the retriever token file"):
        token_from_env({"RLRUN_RETRIEVER_TOKEN_FILE": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="placeholder"):
        RetrievalClient("http://{node_ip}:8000/retrieve")
    with pytest.raises(ValueError, match="http://"):
        RetrievalClient("127.0.0.1:8000/retrieve")
    client = RetrievalClient("http://127.0.0.1:9/retrieve", token="x", timeout=0.5, retries=1, backoff=0.01)
    assert client.headers["Authorization"] == "Bearer x"
    with pytest.raises(RetrievalError, match="failed after 2 attempts: connection refused"):
        client.retrieve(["a"], 3)
    assert client.max_queries == 512 and client._limits is None  # asked again once the service is up
    assert client.retrieve(["", "  "], 3) == [[], []]  # blank queries need no service


def test_topk_kernel_agrees_with_bm25s_retrieve(tmp_path: Path) -> None:
    """Rare and frequent words (both kernel paths), numba and the numpy fallback, against bm25s itself."""
    import numpy as np

    from trainer.retrieval import _topk

    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    p = 1.0 / np.arange(1, 301)
    rows = [{"contents": " ".join(rng.choice(words, size=30, p=p / p.sum()))} for _ in range(400)]
    out = tmp_path / "idx"
    build_index(write_corpus(tmp_path / "c.jsonl", rows), out)
    engine = load_index(out).engine
    queries = [" ".join(rng.choice(words, size=int(rng.integers(1, 5)))) for _ in range(200)]
    ref = engine.search_with_bm25s(queries, 5)
    args = (engine._data, engine._indices, engine._indptr, engine.n_docs, 5)
    ids = [engine.token_ids(q) for q in queries]
    for got in (engine.search(queries, 5), _numpy_topk(_topk, ids, *args)):
        assert [[round(s, 4) for _, s in row] for row in got] == [[round(s, 4) for _, s in row] for row in ref]
        for row_got, row_ref in zip(got, ref, strict=True):  # same passages wherever scores are not tied
            scores = [s for _, s in row_ref]  # (the 5th may tie with a 6th that bm25s left out)
            untied = [d for d, s in row_ref if scores.count(s) == 1 and (len(scores) < 5 or s > scores[-1])]
            assert {d for d, _ in row_got} >= set(untied)
    assert any(len(r) == 5 for r in ref) and any(len(q) == 1 for q in ids)


def _numpy_topk(module, ids, *args):  # type: ignore[no-untyped-def]
    saved = module.HAVE_NUMBA
    module.HAVE_NUMBA = False
    try:
        return module.topk_batch(ids, *args)
    finally:
        module.HAVE_NUMBA = saved


def test_the_bm25_service_keeps_jax_off_the_gpus(tmp_path):
    """bm25s runs a JAX top-k when it is imported and JAX is installed; JAX then preallocates 75 % of a GPU (an
    H100 lost 61 GB to the retrieval service). A stand-in ``jax`` records the platform it was started under."""
    fake = tmp_path / "jax"
    fake.mkdir()
    record = tmp_path / "platform.txt"
    (fake / "__init__.py").write_text("from . import lax\n")
    (fake / "lax.py").write_text(
        "import os\n"
        "def top_k(x, k):\n"
        f"    open({str(record)!r}, 'w').write(os.environ.get('JAX_PLATFORMS', '(unset)') + ' ' +\n"
        "                                    os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', '(unset)'))\n"
        "    return x[:k], list(range(k))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_PYTHON_CLIENT_PREALLOCATE")}
    env["PYTHONPATH"] = f"{tmp_path}:{Path(__file__).resolve().parents[2]}"
    done = subprocess.run([sys.executable, "-c", "import trainer.retrieval.bm25"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert record.read_text() == "cpu false"
