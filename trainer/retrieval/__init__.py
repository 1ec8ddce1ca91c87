"""Retrieval for Search-R1-style tool rollouts: a BM25 (bm25s) or dense (faiss) index over a JSONL
corpus, served over HTTP, and the client the trainer calls.

Where it runs: the service (``serve``) on every node of group retrievers under gunicorn, outside Ray
(roles/retriever deploys it); ``build`` where the index is made; the client inside the Ray job (tool
rollouts). Its scaffolding (flags, token, Flask app, gunicorn, HTTP client) is ``trainer.services``.

* ``python -m trainer.retrieval build --corpus C.jsonl --out DIR [--embedding-model PATH]``
* ``python -m trainer.retrieval serve --index DIR --port 8000 [--token-file F]``
* ``trainer.retrieval.client.RetrievalClient(url).retrieve(queries, topk)``

Torch-free at import: torch, transformers and faiss are loaded only for a dense index.
"""
