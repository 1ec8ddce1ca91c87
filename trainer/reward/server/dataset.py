"""Reference answers looked up by prompt, from a JSON / JSONL dataset file.

The lookup key is the prompt exactly as the trainer sends it, so chat-message
prompts are rendered with the same template the trainer used:

* ``chatml``: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, then
  ``<|im_start|>assistant\\n`` (a plain-string prompt is one user message);
* ``none``: the field is used as is (it must be a string);
* any other string containing ``{}``: a format for plain-string prompts, e.g.
  ``"Question: {}\\nAnswer:"``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from trainer.reward.math import label_to_str

__all__ = ["PROMPT_TEMPLATES", "DatasetError", "DatasetIndex", "known_template", "load_dataset", "render_prompt"]

#: The named prompt templates (--prompt-template); any other template is a string containing ``{}``.
PROMPT_TEMPLATES = ("chatml", "none")
#: What --prompt-template (the inventory's reward_server__prompt_template) may be.
TEMPLATE_EXPECTED = "chatml, none or a string containing {}"


def known_template(template: object) -> bool:
    """Whether ``template`` is a prompt template :func:`render_prompt` renders."""
    return isinstance(template, str) and (template in PROMPT_TEMPLATES or "{}" in template)

log = logging.getLogger(__name__)

FALLBACK_LABEL_KEY = "label"


class DatasetError(ValueError):
    """The dataset file cannot be used; the message names the file, record and problem."""


def render_prompt(value: Any, template: str) -> str:
    """Render a record's input field into the prompt text the trainer sends.

    Raises ValueError (with what was expected) for values the template cannot render.
    """
    if template == "none":
        if not isinstance(value, str):
            raise ValueError(
                f"is a {_kind(value)}; --prompt-template none needs a string (use chatml for messages)"
            )
        return value
    if template == "chatml":
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"is a {_kind(value)}; chatml needs a string or a non-empty list of messages")
        parts = []
        for i, msg in enumerate(messages):
            if not (
                isinstance(msg, dict)
                and isinstance(msg.get("role"), str)
                and isinstance(msg.get("content"), str)
            ):
                raise ValueError(f"message {i} is not an object with string 'role' and 'content'")
            parts.append(f"<|im_start|>{msg['role']}\n{msg['content']}<|im_end|>\n")
        parts.append("<|im_start|>assistant\n")
        return "".join(parts)
    if "{}" in template:
        if not isinstance(value, str):
            raise ValueError(f"is a {_kind(value)}; a '{{}}' prompt template needs a string")
        return template.replace("{}", value)
    raise ValueError(f"unknown prompt template {template!r}; expected {TEMPLATE_EXPECTED}")


def _kind(value: Any) -> str:
    return {dict: "JSON object", list: "JSON array", str: "string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


class DatasetIndex:
    """Prompt -> reference answer, with a whitespace-tolerant second lookup."""

    def __init__(self, labels: dict[str, str], source: str = "<memory>") -> None:
        self._labels = labels
        self._stripped = {prompt.strip(): label for prompt, label in labels.items()}
        self.source = source

    def __len__(self) -> int:
        return len(self._labels)

    def lookup(self, prompt: str) -> str | None:
        """Reference answer for ``prompt`` (exact match, then whitespace-stripped), or None."""
        label = self._labels.get(prompt)
        if label is None:
            label = self._stripped.get(prompt.strip())
        return label


def _records(path: str) -> Iterator[tuple[str, Any]]:
    """(where, record) pairs: a JSON array of records, or JSON Lines."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise DatasetError(f"--dataset {path}: no such file") from None
    except OSError as exc:
        raise DatasetError(f"--dataset {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DatasetError(f"--dataset {path}: not UTF-8 text") from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"--dataset {path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
        for i, record in enumerate(data):
            yield f"record {i}", record
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {lineno}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"--dataset {path}: line {lineno} is not valid JSON ({exc.msg}); "
                "expected a JSON array of records or one JSON object per line"
            ) from None


def load_dataset(
    path: str, input_key: str, label_key: str = "answer", template: str = "none"
) -> DatasetIndex:
    """Load ``path`` into a DatasetIndex keyed by the rendered ``input_key`` field.

    The label is ``record[label_key]``, or ``record["label"]`` when that key is absent.
    Records whose label is null are skipped; duplicate prompts keep the first label.
    """
    labels: dict[str, str] = {}
    skipped = conflicts = 0
    for where, record in _records(path):
        if not isinstance(record, dict):
            raise DatasetError(f"--dataset {path}: {where} is a {_kind(record)}; expected a JSON object")
        if input_key not in record:
            keys = ", ".join(sorted(map(str, record))[:10])
            raise DatasetError(
                f"--dataset {path}: {where} has no {input_key!r} field (--input_key); it has: {keys}"
            )
        key = label_key if label_key in record else FALLBACK_LABEL_KEY
        if key not in record:
            raise DatasetError(
                f"--dataset {path}: {where} has neither {label_key!r} (--label_key) nor {FALLBACK_LABEL_KEY!r}"
            )
        if record[key] is None:
            skipped += 1
            continue
        try:
            prompt = render_prompt(record[input_key], template)
        except ValueError as exc:
            raise DatasetError(f"--dataset {path}: {where}: field {input_key!r} {exc}") from None
        try:
            label = label_to_str(record[key])
        except (TypeError, ValueError) as exc:
            raise DatasetError(f"--dataset {path}: {where}: field {key!r}: {exc}") from None
        if prompt in labels:
            conflicts += labels[prompt] != label
            continue
        labels[prompt] = label
    if not labels:
        raise DatasetError(
            f"--dataset {path}: no usable records (need {input_key!r} and {label_key!r} fields)"
        )
    if skipped or conflicts:
        log.warning(
            "dataset %s: skipped %d records with a null label; %d duplicate prompts had different labels "
            "(first kept)",
            path,
            skipped,
            conflicts,
        )
    return DatasetIndex(labels, source=path)
