"""The tool plug-in interface of multi-turn rollouts: what a tool is, and what one call is.

A tool is a :class:`Tool`: a ``name`` (``--tools NAME``; the tag ``<NAME>...</NAME>`` in the tag format, the
function name in the JSON format), the name of its one argument in the tag format (``arg``: the tag's body),
a JSON-schema of its arguments for the JSON format (``parameters``), how its result is wrapped in the tag
format (``result_template``), a per-call ``timeout`` and its batch method :meth:`Tool.call_batch`.

The rules every tool gets from the dispatcher (:class:`trainer.tools.toolbox.Toolbox`), not from itself:

- a call's error or timeout reaches the model as the result text (``error: ...``); it never ends the step. Only
  a :class:`trainer.deadlines.Fault` does (the job's infrastructure is broken, not the call: a service that
  refuses the job's token, an outage past its deadline, a node that cannot sandbox); it ends the job with
  one line, as the reward service's does;
- a tool that only implements :meth:`Tool.call_one` gets each call run in a worker thread and abandoned at
  ``timeout`` seconds; a tool that batches (:meth:`Tool.call_batch`) bounds its own time (the Python
  sandbox kills each run at its wall time; the HTTP tools have their clients' timeouts and retries);
- the result is cut to ``--tool_max_result_tokens`` tokens, the sample's inserted tokens to
  ``--tool_max_sample_tokens``, and both to what is left of ``--generate_max_len``; the inserted tokens are
  no actions (masked from the loss with ``--state_masking``);
- at most ``--max_turns`` calls per sample, and ``--tool_max_calls NAME=N`` of one tool.

A plug-in of your own: a module with a factory ``make(settings) -> Tool`` (``settings``: the job's tool
flags as a dict, :func:`trainer.tools.registry.settings`), named in ``--tools package.module:make``; the module
must be importable in the engines' processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


class ToolError(Exception):
    """A call failed in a way the model should read (bad arguments, the tool's own error): the message is the
    result text after ``error: ``."""


@dataclass(frozen=True)
class Call:
    """One tool call the policy wrote: the tool's name and its arguments; or, when the call could not be
    read (invalid JSON, an unknown tool), ``error``: what the model reads back instead of a result."""

    tool: str
    args: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


class Tool:
    """A tool (see the module docstring). Subclasses set ``name`` and implement :meth:`call_one` or
    :meth:`call_batch`; one instance serves every call of an engine's rollouts (from one thread at a time)."""

    name: str = ""
    #: The argument the tag format's body is (``<python>CODE</python>`` -> ``{"code": CODE}``).
    arg: ClassVar[str] = "input"
    #: What the tool does, for the JSON format's tool list in the prompt.
    description: ClassVar[str] = ""
    #: The result as the tag format inserts it; ``{}`` is the result text.
    result_template: ClassVar[str] = "\n<result>\n{}\n</result>\n"
    #: Seconds a call may take (the dispatcher's guard for :meth:`call_one`; None: the tool bounds its time).
    timeout: float | None = 30.0

    @property
    def open_tag(self) -> str:
        return f"<{self.name}>"

    @property
    def close_tag(self) -> str:
        return f"</{self.name}>"

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments (the JSON format's tool list): one string, ``arg``."""
        return {"type": "object", "properties": {self.arg: {"type": "string"}}, "required": [self.arg]}

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function description chat templates take in ``tools=``."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}

    def from_tag(self, body: str) -> dict[str, Any]:
        """The arguments of a tag-format call whose body is ``body`` (stripped)."""
        return {self.arg: body.strip()}

    def call_one(self, args: Mapping[str, Any]) -> str:
        """One call's result text; raise :class:`ToolError` (or any exception) for an error the model reads."""
        raise NotImplementedError(f"tool {self.name!r} implements neither call_one nor call_batch")

    def call_batch(self, batch: Sequence[Mapping[str, Any]]) -> list[str | BaseException]:
        """One result text, or the exception a call raised, per call of ``batch`` (the calls of every sample
        whose turn ended meanwhile). Overridden by tools that batch; the default runs :meth:`call_one` per
        call (under the dispatcher's per-call ``timeout``)."""
        raise NotImplementedError  # the dispatcher runs call_one itself when this is not overridden

    def batches(self) -> bool:
        """Whether this tool overrides :meth:`call_batch`."""
        return type(self).call_batch is not Tool.call_batch

    def close(self) -> None:
        """Release what the tool holds (clients, pools); the engine's shutdown calls it."""


def check_name(name: str) -> str | None:
    """Why ``name`` cannot be a tool's name (it is a tag and a function name), or None."""
    if not name or not all(c.isalnum() or c == "_" for c in name) or name[0].isdigit():
        return f"tool name {name!r}: expected letters, digits and '_' (not first a digit); it is also its tag"
    return None
