"""How the policy writes a tool call and how the result is written back: the tag format and the JSON format.

- **tags** (``--tool_format tags``, Search-R1's): ``<search>query</search>``, ``<python>code</python>``: a turn
  stops at a tool's closing tag; the call is the body after the LAST opening tag of that tool in the turn (a
  nested or repeated opener is text before the call); the result goes in as the tool's ``result_template``
  (search: ``\\n\\n<information>...</information>\\n\\n``).
- **json** (``--tool_format json``, the ``<tool_call>`` format of Hermes / Qwen2.5 / Qwen3 chat templates):
  ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``; a turn stops at
  ``</tool_call>``; ``arguments`` may be an object or a JSON string of one. The result goes in as the model's
  own chat template renders a ``tool`` message after the assistant's turn, the template's generation prompt
  included (``<|im_end|>\\n<|im_start|>user\\n<tool_response>\\n...``): the template decides, rlrun only cuts
  the rendering around the result.

Both stop at ``</answer>`` too (the tasks here answer in ``<answer>``; EOS ends a turn anyway). A turn that
does not end with a closing tag (no call, an unclosed call cut by the token budget, EOS) ends the sample.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trainer.tools.base import Call, Tool

ANSWER_CLOSE = "</answer>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_A, _R = "\x1fRLRUN-ASSISTANT\x1f", "\x1fRLRUN-RESULT\x1f"  # markers no template writes itself


class TagFormat:
    """``<name>body</name>`` calls; results as each tool's ``result_template``."""

    kind = "tags"

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = {t.name: t for t in tools}
        self.stops = (*(t.close_tag for t in tools), ANSWER_CLOSE)

    def parse(self, turn_text: str) -> Call | None:
        """The call a turn ends with, or None (see the module docstring)."""
        text = turn_text.rstrip()
        for tool in self.tools.values():
            if text.endswith(tool.close_tag):
                body = text[: -len(tool.close_tag)]
                if tool.open_tag not in body:
                    return None
                return Call(tool.name, tool.from_tag(body.rsplit(tool.open_tag, 1)[1]))
        return None

    def wrap(self, call: Call) -> tuple[str, str]:
        """The text before and after the result text."""
        tool = self.tools.get(call.tool)
        template = tool.result_template if tool is not None else Tool.result_template
        head, _, tail = template.partition("{}")
        return head, tail


class JsonFormat:
    """``<tool_call>{"name", "arguments"}</tool_call>`` calls; results as the chat template renders them."""

    kind = "json"

    def __init__(self, tools: Sequence[Tool], tokenizer: Any) -> None:
        self.tools = {t.name: t for t in tools}
        self.stops = (CALL_CLOSE, ANSWER_CLOSE)
        self.head, self.tail = tool_message_wrapping(tokenizer)

    def parse(self, turn_text: str) -> Call | None:
        text = turn_text.rstrip()
        if not text.endswith(CALL_CLOSE):
            return None
        body = text[: -len(CALL_CLOSE)]
        if CALL_OPEN not in body:
            return None
        body = body.rsplit(CALL_OPEN, 1)[1].strip()
        names = ", ".join(self.tools)
        try:
            call = json.loads(body)
        except ValueError as e:
            return Call("", error=f"the tool call is not valid JSON ({e}); expected "
                                  '{"name": "<tool>", "arguments": {...}}')
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return Call("", error='the tool call has no "name"; expected {"name": "<tool>", "arguments": {...}}')
        name, args = call["name"], call.get("arguments", {})
        if name not in self.tools:
            return Call(name, error=f"unknown tool {name!r}; the tools are {names}")
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {self.tools[name].arg: args}
        if not isinstance(args, dict):
            return Call(name, error=f'"arguments" of {name} must be an object, got {type(args).__name__}')
        return Call(name, args)

    def wrap(self, call: Call) -> tuple[str, str]:
        return self.head, self.tail


def tool_message_wrapping(tokenizer: Any) -> tuple[str, str]:
    """What the tokenizer's chat template writes after an assistant's turn (which the policy ended with a
    call) up to a tool message's content, and from its end to the next assistant turn's start; ValueError when
    the template renders no ``tool`` message, or renders it by changing what came before."""
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _A}]
    try:
        before = tokenizer.apply_chat_template(chat, tokenize=False)
        after = tokenizer.apply_chat_template([*chat, {"role": "tool", "content": _R}], tokenize=False,
                                              add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - any template error is the same answer: it cannot
        raise ValueError(f"--tool_format json: the chat template cannot render a tool message: {e}") from None
    if not isinstance(before, str) or _A not in before or not after.startswith(before) or _R not in after:
        raise ValueError("--tool_format json: the model's chat template does not render a 'tool' message after an "
                         "assistant's turn as text appended to it; use --tool_format tags")
    head = before[before.index(_A) + len(_A):] + after[len(before):].split(_R)[0]
    return head, after[len(before):].split(_R, 1)[1]
