"""The tools by name, and the job's toolbox built from its flags.

:data:`BUILTIN` maps ``--tools`` names to factories ``settings -> Tool``; any other name of the form
``package.module:factory`` is a plug-in (imported in the engine's process). ``settings`` is the job's tool
flags as a plain dict (:func:`settings`: every flag of the config's "multi-turn tool rollouts" group): what
the driver sends each engine, which builds its toolbox once (:func:`build_toolbox`) and keeps it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from trainer.config.schema import DEFAULT_REJOIN_STEPS
from trainer.tools.base import Tool, check_name
from trainer.tools.formats import JsonFormat, TagFormat
from trainer.tools.toolbox import Toolbox

Factory = Callable[[Mapping[str, Any]], Tool]


def _search(s: Mapping[str, Any]) -> Tool:
    from trainer.tools.search import Search

    return Search.from_settings(s)


def _python(s: Mapping[str, Any]) -> Tool:
    from trainer.tools.python import Python

    return Python.from_settings(s)


def _http(s: Mapping[str, Any]) -> Tool:
    from trainer.tools.http import Http

    return Http.from_settings(s)


BUILTIN: dict[str, Factory] = {"search": _search, "python": _python, "http": _http}


def is_plugin(name: str) -> bool:
    return ":" in name


def load_plugin(name: str) -> Factory:
    module, _, attr = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--tools {name}: cannot load the plug-in factory ({e})") from None
    if not callable(factory):
        raise ValueError(f"--tools {name}: {attr} is not callable")
    return factory


def settings(cfg: Any) -> dict[str, Any]:
    """The job's tool flags (the config's tool group) as a plain, picklable dict; ``tools`` resolved."""
    from trainer.config.fields import flag_specs
    from trainer.config.schema import R

    out = {spec.name: getattr(cfg, spec.name) for spec in flag_specs(type(cfg)) if spec.meta.group == R}
    out["tools"] = tuple(cfg.tool_names)
    return out


def search_settings(url: str, topk: int = 3, max_turns: int = 1, timeout: float = 10.0, retries: int = 3,
                    outage_timeout: float = 0.0) -> dict[str, Any]:
    """The settings of the search tool alone (Search-R1's flags), as :func:`settings` gives them."""
    return {"tools": ("search",), "tool_format": "tags", "max_turns": max_turns, "retriever_url": url,
            "retriever_topk": topk, "retriever_timeout": timeout, "retriever_retries": retries,
            "retriever_outage_timeout": outage_timeout}


def build_tools(s: Mapping[str, Any]) -> list[Tool]:
    tools = []
    for name in s["tools"]:
        factory = load_plugin(name) if is_plugin(name) else BUILTIN[name]
        tool = factory(s)
        if not isinstance(tool, Tool):
            raise ValueError(f"--tools {name}: the factory returned a {type(tool).__name__}, not a trainer.tools.Tool")
        problem = check_name(tool.name)
        if problem:
            raise ValueError(f"--tools {name}: {problem}")
        tools.append(tool)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"--tools: two tools share a name ({', '.join(names)}): each name is a tag")
    return tools


def schemas(s: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tools' OpenAI-style schemas (the JSON format's prompts); building a tool starts nothing."""
    return [tool.schema() for tool in build_tools(s)]


def build_toolbox(s: Mapping[str, Any], tokenizer: Any = None, tools: list[Tool] | None = None) -> Toolbox:
    """The toolbox ``s`` describes (``tools``: already built ones, e.g. in tests)."""
    tools = build_tools(s) if tools is None else tools
    fmt = JsonFormat(tools, tokenizer) if s.get("tool_format", "tags") == "json" else TagFormat(tools)
    return Toolbox(tools, fmt, max_calls=s["max_turns"], tool_max_calls=parse_max_calls(s.get("tool_max_calls", ())),
                   max_result_tokens=s.get("tool_max_result_tokens"), max_sample_tokens=s.get("tool_max_sample_tokens"),
                   rejoin_steps=s.get("tool_rejoin_steps", DEFAULT_REJOIN_STEPS))


def parse_max_calls(items: Any) -> dict[str, int]:
    """``("python=4", "search=2")`` -> ``{"python": 4, "search": 2}`` (checked by the config's rules)."""
    out = {}
    for item in items or ():
        name, _, n = item.partition("=")
        out[name.strip()] = int(n)
    return out
