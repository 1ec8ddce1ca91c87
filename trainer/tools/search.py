"""The search tool: Search-R1's ``<search>query</search>`` against the retrieval service
(:class:`trainer.rollout.multiturn.SearchTool`'s client: one batched request for every query of a batch, timeouts,
retries, an outage waited out up to --retriever_outage_timeout), its passages inserted as Search-R1 writes them
(``\\n\\n<information>Doc 1(Title: ...) ...</information>\\n\\n``).

The retrieval service is the cluster's own: a refused token or an outage past its deadline ends the job with one
line (a :class:`trainer.deadlines.Fault`, as the reward service's), it never reaches the model as a result (the
policy would learn that searching fails). An empty query gets no passages without a request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from trainer.rollout.multiturn import INFO_CLOSE, INFO_OPEN, SearchTool, format_passages
from trainer.tools.base import Tool


class Search(Tool):
    name = "search"
    arg: ClassVar[str] = "query"
    description: ClassVar[str] = "Search the corpus; the best passages come back."
    result_template: ClassVar[str] = f"\n\n{INFO_OPEN}{{}}{INFO_CLOSE}\n\n"
    timeout = None  # the client's timeouts, retries and outage deadline bound it

    def __init__(self, search: SearchTool | Any) -> None:
        """``search``: a :class:`SearchTool`, or any callable ``queries -> passages per query``."""
        self.search = search

    @classmethod
    def from_settings(cls, s: Mapping[str, Any]) -> Search:
        return cls(SearchTool(s["retriever_url"], s["retriever_topk"], timeout=s["retriever_timeout"],
                              retries=s["retriever_retries"], outage_timeout=s["retriever_outage_timeout"]))

    def call_batch(self, batch: Sequence[Mapping[str, Any]]) -> list[str | BaseException]:
        found = self.search([str(args.get(self.arg, "")) for args in batch])
        if len(found) != len(batch):
            raise RuntimeError(f"the search tool answered {len(found)} results for {len(batch)} queries")
        return [format_passages(passages) for passages in found]
