"""Prompt data for the trainer: records from a local file, rendered prompts, a resumable sampler.

Semantics follow OpenRLHF's ``PromptDataset`` / ``preprocess_data`` for the flags ``--input_key``,
``--label_key``, ``--apply_chat_template``, ``--input_template`` and ``--max_samples``:

- With ``apply_chat_template`` the value under ``input_key`` (a list of ``{"role", "content"}`` messages,
  or a plain string, wrapped as one user message) is rendered by
  ``tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)``; ``input_template``
  is then not applied (OpenRLHF ignores it; ``TrainerConfig`` rejects the combination).
- Without it the value must be a string; ``input_template.format(value)`` is applied when given (so a
  literal brace in the template is written ``{{`` / ``}}``, as in OpenRLHF).
- ``max_samples`` keeps the first ``max_samples`` records of the file, in file order, before any filtering.

Differences, each counted in :class:`DataStats`:

- A record without ``input_key`` (or with ``null`` there) is skipped and counted (``missing_input``); when
  *every* record lacks it, that is an error naming the key and the keys the first record has (a wrong
  ``--input_key``, not a few bad records).
- A missing or ``null`` label gives ``label=None`` (``missing_label``); numbers become text the way the
  reward does (``trainer.reward.label_to_str``); a list of labels (several acceptable answers, as
  Search-R1's ``golden_answers``) stays a list. ``require_labels=True`` makes a missing label an error.
- A prompt longer than ``prompt_max_len`` tokens (``add_special_tokens=False``, as the rollout tokenizes
  it) is dropped and counted (``too_long``) instead of being truncated.

Only local files are read (no dataset hub here): ``.jsonl`` (one object a line; blank lines skipped),
``.json`` (a list of objects; a ``.json`` file holding JSON lines is read as jsonl, as HF ``datasets``
does) and ``.parquet`` (needs ``pyarrow``, imported only then).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FORMATS: tuple[str, ...] = ("jsonl", "json", "parquet")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet"}


class DataError(ValueError):
    """The prompt data (file or records) is not what the trainer expects; the message says what and where."""


# --------------------------------------------------------------------------------------------- loading
def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise DataError(f"{path}: unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
        return fmt
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise DataError(
            f"{path}: cannot tell the format from the extension {path.suffix or '(none)'!r}: expected "
            f"{', '.join(_EXTENSIONS)} (or pass the format explicitly)"
        )
    return found


def _parse_jsonl(path: Path, text: str) -> list[dict[str, Any]]:
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path} line {lineno}: invalid JSON ({e.msg} at column {e.colno}): expected one JSON "
                "object per line"
            ) from None
        if not isinstance(obj, dict):
            raise DataError(f"{path} line {lineno}: expected a JSON object, got {type(obj).__name__}")
        records.append(obj)
    return records


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError(
            f"{path}: reading parquet needs the 'pyarrow' package, which is not installed; install pyarrow "
            "or convert the data to .jsonl"
        ) from e
    try:
        return pq.read_table(str(path)).to_pylist()
    except Exception as e:  # pyarrow raises its own error types
        raise DataError(f"{path}: not a readable parquet file ({e})") from e


def load_records(path: str | Path, fmt: str | None = None) -> list[dict[str, Any]]:
    """Read every record of a local ``.jsonl``, ``.json`` or ``.parquet`` file, in file order.

    ``fmt`` (one of :data:`FORMATS`) overrides the extension. Raises :class:`FileNotFoundError` for a
    missing file, :class:`DataError` naming the file (and line, for jsonl) for malformed content, and
    :class:`ImportError` for parquet without pyarrow.
    """
    p = Path(path)
    if not p.is_file():
        hint = "" if p.suffix else " (dataset hub names are not supported: pass a local file)"
        raise FileNotFoundError(f"prompt data {p}: no such file{hint}")
    kind = _format_of(p, fmt)
    if kind == "parquet":
        return _read_parquet(p)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}): expected {kind}") from None
    if kind == "jsonl":
        return _parse_jsonl(p, text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data" and fmt is None:  # JSON lines in a .json file, as HF datasets accepts
            return _parse_jsonl(p, text)
        raise DataError(
            f"{p}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}): expected a list of records"
        ) from None
    if not isinstance(data, list):
        raise DataError(f"{p}: expected a JSON list of records (objects), got {type(data).__name__}")
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise DataError(f"{p} record {i}: expected a JSON object, got {type(rec).__name__}")
    return data


# ----------------------------------------------------------------------------------------------- prompts
@dataclass(frozen=True)
class Prompt:
    """One prompt ready for generation: rendered ``text``, reward ``label``, ``index`` of its record."""

    text: str
    label: str | list[str] | None  # a list: several acceptable answers (QA rewards take the best)
    index: int  # position of the record in the file (stable under filtering)


@dataclass(frozen=True)
class DataStats:
    """What happened to the records; ``loaded == kept + missing_input + too_long``."""

    records: int  # records in the file
    loaded: int  # after --max_samples (the first max_samples records)
    kept: int
    missing_input: int = 0
    too_long: int = 0
    missing_label: int = 0  # among the kept prompts
    max_prompt_tokens: int = 0  # longest kept prompt (0 when lengths were not measured)

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for logging / metrics)."""
        return asdict(self)


def _label_text(value: Any, index: int, label_key: str) -> str | list[str]:
    """The label as text; a list (several acceptable answers, e.g. Search-R1's golden_answers) stays a
    list of texts, non-empty."""
    from trainer.reward.math import label_to_str

    try:
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("an empty list of answers; expected at least one")
            return [label_to_str(v) for v in value]
        return label_to_str(value)
    except (TypeError, ValueError) as e:
        raise DataError(f"record {index}: label {label_key!r} = {value!r}: {e}") from None


def _chat(value: Any, index: int, input_key: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    ok = isinstance(value, list) and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value)
    if not ok:
        raise DataError(
            f"record {index}: {input_key!r} is {type(value).__name__} {str(value)[:80]!r}: expected a string "
            "or a list of {'role': ..., 'content': ...} messages"
        )
    return [dict(m) for m in value]


def render_prompt(
    value: Any,
    *,
    index: int = 0,
    input_key: str = "input",
    apply_chat_template: bool = False,
    input_template: str | None = None,
    tokenizer: Any = None,
    chat_tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text of one record's ``input_key`` value (OpenRLHF's ``preprocess_data``); ``chat_tools``: the
    tools' schemas for the chat template (``--tool_format json``: the template writes them where it wants)."""
    if apply_chat_template:
        if tokenizer is None:
            raise DataError("apply_chat_template needs a tokenizer")
        extra = {"tools": chat_tools} if chat_tools else {}
        return tokenizer.apply_chat_template(
            _chat(value, index, input_key), tokenize=False, add_generation_prompt=True, **extra
        )
    if not isinstance(value, str):
        what = "a list (chat messages? pass apply_chat_template)" if isinstance(value, list) else "not a string"
        raise DataError(f"record {index}: {input_key!r} is {what}: expected a string, got {type(value).__name__}")
    if input_template is None:
        return value
    try:
        return input_template.format(value)
    except (IndexError, KeyError, ValueError) as e:
        raise DataError(
            f"input_template {input_template!r}: str.format failed ({type(e).__name__}: {e}); expected "
            "exactly one '{}' for the prompt, with literal braces written '{{' and '}}'"
        ) from None


def build_prompts(
    records: Sequence[Mapping[str, Any]],
    *,
    input_key: str = "input",
    label_key: str | None = None,
    apply_chat_template: bool = False,
    input_template: str | None = None,
    max_samples: int | None = None,
    prompt_max_len: int | None = None,
    tokenizer: Any = None,
    require_labels: bool = False,
    source: str = "prompt data",
    chat_tools: list[dict[str, Any]] | None = None,
) -> tuple[list[Prompt], DataStats]:
    """Render ``records`` into :class:`Prompt` s and count what was dropped (see the module docstring).

    ``tokenizer`` is needed for ``apply_chat_template`` and for ``prompt_max_len`` (lengths are measured
    with ``add_special_tokens=False``). ``source`` names the data in error messages.
    """
    if max_samples is not None and max_samples < 0:
        raise DataError(f"max_samples {max_samples}: expected >= 0")
    if prompt_max_len is not None and tokenizer is None:
        raise DataError("prompt_max_len needs a tokenizer to measure prompt lengths")
    selected = list(records[: max_samples if max_samples is not None else len(records)])
    texts: list[str] = []
    labels: list[str | list[str] | None] = []
    indices: list[int] = []
    missing_input = missing_label = 0
    for i, rec in enumerate(selected):
        value = rec.get(input_key)
        if value is None:
            missing_input += 1
            continue
        texts.append(
            render_prompt(
                value, index=i, input_key=input_key, apply_chat_template=apply_chat_template,
                input_template=input_template, tokenizer=tokenizer, chat_tools=chat_tools,
            )
        )  # fmt: skip
        raw_label = rec.get(label_key) if label_key is not None else None
        if raw_label is None:
            if require_labels:
                raise DataError(
                    f"{source} record {i}: no label {label_key!r} (keys: {', '.join(map(str, rec)) or 'none'}); "
                    "the reward needs a label for every prompt"
                )
            missing_label += 1
            labels.append(None)
        else:
            labels.append(_label_text(raw_label, i, str(label_key)))
        indices.append(i)
    if selected and missing_input == len(selected):
        keys = ", ".join(repr(k) for k in selected[0]) or "none"
        raise DataError(
            f"{source}: no record has input_key {input_key!r} (record 0 has keys: {keys}); "
            "expected --input_key to name the prompt field"
        )
    lengths: list[int] | None = None
    if prompt_max_len is not None and texts:
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    prompts: list[Prompt] = []
    too_long = dropped_labels = longest = 0
    for j, (text, label, index) in enumerate(zip(texts, labels, indices, strict=True)):
        if lengths is not None and prompt_max_len is not None:
            if lengths[j] > prompt_max_len:
                too_long += 1
                dropped_labels += label is None
                continue
            longest = max(longest, lengths[j])
        prompts.append(Prompt(text=text, label=label, index=index))
    stats = DataStats(
        records=len(records), loaded=len(selected), kept=len(prompts), missing_input=missing_input,
        too_long=too_long, missing_label=missing_label - dropped_labels, max_prompt_tokens=longest,
    )  # fmt: skip
    if missing_input or too_long:
        logger.warning(
            "%s: kept %d of %d prompts (%d without %r, %d longer than %s tokens)",
            source, stats.kept, stats.loaded, missing_input, input_key, too_long, prompt_max_len,
        )  # fmt: skip
    return prompts, stats


def load_prompts(
    path: str | Path,
    *,
    fmt: str | None = None,
    **kwargs: Any,
) -> tuple[list[Prompt], DataStats]:
    """:func:`load_records` then :func:`build_prompts` (keyword arguments as there)."""
    return build_prompts(load_records(path, fmt), source=str(path), **kwargs)


def prompts_from_config(
    cfg: Any, tokenizer: Any = None, *, require_labels: bool = False
) -> tuple[list[Prompt], DataStats]:
    """Prompts for a ``TrainerConfig`` (any object with its data attributes).

    Reads ``prompt_data``, ``input_key``, ``label_key``, ``apply_chat_template``, ``input_template``,
    ``max_samples`` and ``prompt_max_len``; the tokenizer defaults to ``AutoTokenizer`` of ``pretrain``.
    Returns ``(prompts, stats)``.
    """
    if not cfg.prompt_data:
        raise DataError("prompt_data is not set: expected the path of a .jsonl, .json or .parquet file")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.pretrain)
    return load_prompts(
        cfg.prompt_data, input_key=cfg.input_key, label_key=cfg.label_key,
        apply_chat_template=cfg.apply_chat_template, input_template=cfg.input_template,
        max_samples=cfg.max_samples, prompt_max_len=cfg.prompt_max_len, tokenizer=tokenizer,
        require_labels=require_labels, chat_tools=chat_tools(cfg),
    )  # fmt: skip


def chat_tools(cfg: Any) -> list[dict[str, Any]] | None:
    """The tools' schemas the chat template puts in the prompts with ``--tool_format json`` (else None)."""
    if getattr(cfg, "tool_format", "tags") != "json" or not getattr(cfg, "multi_turn", False):
        return None
    from trainer.tools.registry import schemas, settings

    return schemas(settings(cfg))


# ----------------------------------------------------------------------------------------------- sampler
def fingerprint(prompts: Sequence[Prompt]) -> str:
    """A short hash of the prompts (text, label, index): tells a resumed run it got the same data."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.index, p.text, p.label]).encode())
    return h.hexdigest()[:16]


class PromptSampler:
    """Batches of prompts, each episode in its own seeded shuffled order; resumable exactly.

    Episode ``e`` visits the prompts in the order ``torch.randperm(n, generator seeded with seed + e)`` -
    the order of OpenRLHF's ``DistributedSampler(shuffle=True, seed=seed)`` with ``set_epoch(e)`` on one
    replica - cut into batches of ``batch_size`` (the last partial batch dropped when ``drop_last``).

    :meth:`next_batch` returns the next batch, moving on to the next episode after the last one;
    iterating yields the rest of the current episode. :meth:`state_dict` records ``(episode, position)``
    (position = batches already taken in that episode) after what has been taken, so a sampler restored
    with :meth:`load_state_dict` returns the same next batch as the uninterrupted one.
    """

    def __init__(
        self, prompts: Sequence[Prompt], batch_size: int, seed: int = 0, drop_last: bool = True, shuffle: bool = True
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: expected >= 1")
        n = len(prompts)
        self.batches_per_episode = n // batch_size if drop_last else -(-n // batch_size)
        if self.batches_per_episode == 0:
            raise ValueError(
                f"{n} prompts make no batch of {batch_size}"
                + (" (drop_last): expected at least batch_size prompts" if n else ": expected prompts")
            )
        self.prompts = list(prompts)
        self.batch_size, self.seed, self.drop_last, self.shuffle = batch_size, seed, drop_last, shuffle
        self.episode = 0
        self.position = 0
        self._fingerprint = fingerprint(self.prompts)
        self._order: list[int] | None = None
        self._order_episode = -1

    def order(self, episode: int) -> list[int]:
        """Indices into ``prompts`` in the order episode ``episode`` visits them."""
        if episode != self._order_episode or self._order is None:
            n = len(self.prompts)
            if self.shuffle:
                import torch

                g = torch.Generator()
                g.manual_seed(self.seed + episode)
                self._order = torch.randperm(n, generator=g).tolist()
            else:
                self._order = list(range(n))
            self._order_episode = episode
        return self._order

    def next_batch(self) -> list[Prompt]:
        """The next batch; advances the state (and the episode after its last batch)."""
        start = self.position * self.batch_size
        idx = self.order(self.episode)[start : start + self.batch_size]
        self.position += 1
        if self.position == self.batches_per_episode:
            self.episode, self.position = self.episode + 1, 0
        return [self.prompts[i] for i in idx]

    def __iter__(self) -> Iterator[list[Prompt]]:
        """The remaining batches of the current episode."""
        episode = self.episode
        while self.episode == episode:
            yield self.next_batch()

    def __len__(self) -> int:
        """Batches per episode."""
        return self.batches_per_episode

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands, plus what it was built from (checked on load). JSON-serialisable."""
        return {
            "episode": self.episode, "position": self.position, "seed": self.seed,
            "batch_size": self.batch_size, "drop_last": self.drop_last, "shuffle": self.shuffle,
            "num_prompts": len(self.prompts), "fingerprint": self._fingerprint,
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state["episode"], state["position"]``; the rest of ``state`` must match this sampler."""
        mine = self.state_dict()
        problems = [
            f"{k} {state.get(k)!r} (this sampler: {mine[k]!r})"
            for k in ("seed", "batch_size", "drop_last", "shuffle", "num_prompts", "fingerprint")
            if k in state and state[k] != mine[k]
        ]
        if problems:
            raise ValueError(
                "sampler state is from different data or settings: " + "; ".join(problems)
                + ": the resumed run would not continue the same sequence of batches"
            )
        episode, position = int(state["episode"]), int(state["position"])
        if episode < 0 or not 0 <= position < self.batches_per_episode:
            raise ValueError(
                f"sampler state episode {episode}, position {position}: expected episode >= 0 and "
                f"0 <= position < {self.batches_per_episode} (batches per episode)"
            )
        self.episode, self.position = episode, position
