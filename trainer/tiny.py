"""Tiny, self-made test artefacts: a char-level tokenizer, a random-init Llama and toy math datasets.

Nothing can be downloaded from a model hub here, so tests and CPU smoke runs use artefacts made by this
module and load them through the real paths (``AutoTokenizer.from_pretrained(dir)``,
``AutoModelForCausalLM.from_pretrained(dir)``, vLLM ``LLM(model=dir)``).

- :func:`make_tokenizer`: a character-level tokenizer (``tokenizers`` ``WordLevel`` model, ``Split("",
  "isolated")`` pre-tokenizer, ``Fuse`` decoder) with a chatml chat template; fewer than 128 tokens.
- :func:`make_model`: a random-init Llama whose head_dim (default 64) is one vLLM's CPU attention accepts.
- :func:`make_math_dataset`: toy prompts ("3+4=" -> "7", or copy a digit string) in json, jsonl or parquet.
- :func:`make_python_data`: a tiny-python task: products of two 3-digit numbers, which a tiny model can only
  answer by running ``<python>print(a*b)</python>`` and copying the output.
- :func:`make_search_data`: a tiny-search task (Search-R1's shape): a corpus JSONL whose passages hold
  the answers, and questions whose answers are only there ("code of kov?" -> the passage ``"kov"\nkov is
  47``), so a tiny model can learn to search and copy the answer.

Command line::

    python -m trainer.tiny model OUT_DIR [--hidden-size 256 --num-layers 2 --num-heads 4 --seed 0]
    python -m trainer.tiny dataset OUT_FILE [--n 256 --fmt jsonl --kind add --seed 0]
    python -m trainer.tiny search OUT_DIR [--n 128 --warmup 256 --distractors 0 --answer-digits 2 --seed 0]
    python -m trainer.tiny python OUT_DIR [--n 64 --warmup 512 --digits 3 --guess-digits 1 --direct-share 0 --seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import string
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from transformers import PreTrainedTokenizerFast

from trainer.files import replace_file

PAD, EOS, UNK, IM_START, IM_END = "<pad>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD, EOS, UNK, IM_START, IM_END)
PUNCTUATION = "\\{}^_/+-*=()[].,:;?!'\"<>|$%&#@~`"
# Everything the tokenizer knows besides the special tokens, in id order after them.
CHARACTERS = string.digits + string.ascii_letters + " \n" + PUNCTUATION

# chatml: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then the assistant header.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DatasetFormat = Literal["jsonl", "json", "parquet"]
DatasetKind = Literal["add", "copy"]
FORMATS: tuple[str, ...] = ("jsonl", "json", "parquet")
KINDS: tuple[str, ...] = ("add", "copy")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The char-level tokenizer in memory (see :func:`make_tokenizer`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    assert len(vocab) == len(SPECIAL_TOKENS) + len(CHARACTERS), "duplicate character in the vocabulary"
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        bos_token=None,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_tokenizer(out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Build the char-level chatml tokenizer, save it to ``out_dir`` (created) and return it.

    Special tokens: ``<pad>`` (pad), ``<eos>`` (eos), ``<unk>`` (unknown characters), ``<|im_start|>`` and
    ``<|im_end|>``; no bos. Padding is on the left. Reload with ``AutoTokenizer.from_pretrained(out_dir)``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save_pretrained(str(out))
    return tok


def make_model(
    out_dir: str | Path,
    hidden_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    seed: int = 0,
    max_position_embeddings: int = 512,
) -> Path:
    """Save a random-init Llama (safetensors) and the tokenizer of :func:`make_tokenizer` to ``out_dir``.

    ``hidden_size / num_heads`` is the head_dim; vLLM's CPU attention only accepts some values (64 is the
    default here). ``intermediate_size`` defaults to ``2 * hidden_size``. The weights depend only on the
    arguments (same seed, same weights). Returns ``out_dir`` as a :class:`Path`.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size < 1 or num_heads < 1 or num_layers < 1:
        raise ValueError(
            f"make_model: hidden_size, num_heads and num_layers must be >= 1, got "
            f"{hidden_size}, {num_heads}, {num_layers}"
        )
    if hidden_size % num_heads:
        raise ValueError(
            f"make_model: hidden_size {hidden_size} is not divisible by num_heads {num_heads}; "
            "expected hidden_size = num_heads * head_dim"
        )
    out = Path(out_dir)
    tok = make_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    # Seed a private generator state: same seed -> identical weights, whatever ran before.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.eos_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def teach(model_dir: str | Path, pairs: Sequence[tuple[str, str]], steps: int, *, lr: float = 3e-3, seed: int = 0,
          stop_below: float | None = None, device: str = "cpu") -> float:
    """Supervised steps that fit the model in ``model_dir`` to answer each prompt with its target, EOS not taught
    (the tool-call format a multi-turn test or bench needs of a random-init model before RL): one pair per step,
    in turn, seeded without touching the caller's random state; it stops early once a step's loss is below
    ``stop_below``. The model trains in float32 on ``device`` and is saved in place in its own dtype; returns the
    last step's loss."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    saved_dtype = AutoConfig.from_pretrained(model_dir).dtype or torch.float32  # bf16 for bench/gpu/model.py's
    if isinstance(saved_dtype, str):
        saved_dtype = getattr(torch, saved_dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    rows = [(tok(p, add_special_tokens=False).input_ids, tok(t, add_special_tokens=False).input_ids) for p, t in pairs]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = float("nan")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(steps):
            p, t = rows[step % len(rows)]
            out = model(input_ids=torch.tensor([p + t], device=device),
                        labels=torch.tensor([[-100] * len(p) + t], device=device)).loss
            opt.zero_grad()
            out.backward()
            opt.step()
            loss = out.item()
            if stop_below is not None and loss < stop_below:
                break
    model.to("cpu", dtype=saved_dtype)
    model.save_pretrained(model_dir)
    return loss


def math_records(
    n: int = 256,
    seed: int = 0,
    input_key: str = "message",
    label_key: str = "answer",
    kind: DatasetKind = "add",
    max_operand: int = 9,
    max_digits: int = 4,
) -> list[dict[str, Any]]:
    """``n`` toy records ``{input_key: [{"role": "user", "content": ...}], label_key: ...}``.

    ``kind="add"``: ``"3+4="`` -> ``"7"`` (operands 0..max_operand); ``kind="copy"``:
    ``"copy 4821="`` -> ``"4821"`` (a 1..max_digits digit string). Deterministic for a seed.
    Each record also has ``"solution"``: the answer as a math model writes it (``\\boxed{7}``), the
    target of the supervised warm-up (``trainer.train_sft --output_key solution``).
    """
    if max_digits < 1 or max_operand < 0:
        raise ValueError(f"max_digits {max_digits} / max_operand {max_operand}: expected >= 1 / >= 0")
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r}: expected one of {', '.join(KINDS)}")
    if n < 0:
        raise ValueError(f"dataset size n must be >= 0, got {n}")
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        if kind == "add":
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
            prompt, answer = f"{a}+{b}=", str(a + b)
        else:
            answer = "".join(rng.choice(string.digits) for _ in range(rng.randint(1, max_digits)))
            prompt = f"copy {answer}="
        records.append({input_key: [{"role": "user", "content": prompt}], label_key: answer,
                        "solution": f"\\boxed{{{answer}}}"})
    return records


def records_text(records: Sequence[dict[str, Any]], fmt: DatasetFormat = "jsonl") -> str:
    """``records`` as the text of a jsonl (one object a line) or json (a list) file."""
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return json.dumps(list(records), ensure_ascii=False, indent=1)


def write_records(path: str | Path, records: Sequence[dict[str, Any]], fmt: DatasetFormat = "jsonl") -> Path:
    """Write ``records`` to ``path`` as a json list, jsonl (one object a line) or parquet (needs pyarrow)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("jsonl", "json"):
        out.write_text(records_text(records, fmt), encoding="utf-8")
    elif fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError(
                f"writing {out} as parquet needs the 'pyarrow' package, which is not installed; "
                "install pyarrow or use fmt='jsonl' or 'json'"
            ) from e
        pq.write_table(pa.Table.from_pylist(list(records)), str(out))
    else:
        raise ValueError(f"unknown dataset format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return out


def make_math_dataset(
    path: str | Path,
    n: int = 256,
    seed: int = 0,
    fmt: DatasetFormat = "jsonl",
    input_key: str = "message",
    label_key: str = "answer",
    kind: DatasetKind = "add",
    max_operand: int = 9,
    max_digits: int = 4,
) -> Path:
    """Write :func:`math_records` to ``path`` in format ``fmt``; returns the path."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}: expected one of {', '.join(FORMATS)}")
    records = math_records(n=n, seed=seed, input_key=input_key, label_key=label_key, kind=kind,
                           max_operand=max_operand, max_digits=max_digits)
    return write_records(path, records, fmt)


SEARCH_INSTRUCTION = "search, then answer: code of {}?"


def search_records(n: int = 128, warmup: int = 256, distractors: int = 0, answer_digits: int = 2,
                   copy_digits: int | None = None, direct_share: float = 0.0, topk: int = 1, seed: int = 0
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(corpus, questions, warm-up records) of the tiny-search task; deterministic for its arguments.

    Each of ``n + warmup + distractors`` made-up entities (distinct 3-letter names) has a random code of
    ``answer_digits`` digits, told by one passage ``{"id": i, "contents": "\"kov\"\nkov is 47"}``
    (Search-R1's corpus format). Three disjoint sets of entities:

    - ``questions``, the RL prompts: ``{"question": [chat message "search, then answer: code of kov?"],
      "golden_answers": ["47"]}`` for ``n`` entities. No target response: their codes are in the corpus
      only, so without searching a model guesses (1 in 10**answer_digits).
    - ``warmup``, the supervised warm-up's records, about ``warmup`` OTHER entities: the same question
      and ``solution``, the search trajectory as a rollout makes it (``<search>kov</search>``, the
      information block with the entity's passage first and ``topk - 1`` other passages: BM25 finds only
      the entity's own passage for its name, so 1 by default, ``<answer>47</answer>``); for a
      ``direct_share`` of them a direct answer with a WRONG code instead. The answer copies the first
      ``copy_digits`` digits of the code (default: all) and guesses the others (random digits, right 1 in
      10 by chance): a warm-up that copies only part of the code gives a weak copying ability that the
      exact-match reward has to complete. The warm-up can teach the format and copying in general, never
      an RL question's code.
    - ``distractors``: passages about entities nobody asks about.
    """
    from trainer.rollout.multiturn import information_block

    copy_digits = answer_digits if copy_digits is None else copy_digits
    if (n < 1 or warmup < 0 or distractors < 0 or answer_digits < 1 or not 0 <= copy_digits <= answer_digits
            or not 0 <= direct_share <= 1 or topk < 1):
        raise ValueError(f"search data: n {n} >= 1, warmup {warmup} >= 0, distractors {distractors} >= 0, "
                         f"answer_digits {answer_digits} >= 1, 0 <= copy_digits {copy_digits} <= answer_digits, "
                         f"0 <= direct_share {direct_share} <= 1, topk {topk} >= 1 expected")
    total = n + warmup + distractors
    if total > 26**3 - 4:
        raise ValueError(f"search data: {total} entities; at most {26**3 - 4} distinct 3-letter names")
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < total:
        name = "".join(rng.choice(string.ascii_lowercase) for _ in range(3))
        if name not in seen and name not in ("the", "and", "for", "not"):
            seen.add(name)
            names.append(name)
    codes = ["".join(rng.choice(string.digits) for _ in range(answer_digits)) for _ in range(total)]
    corpus = [{"id": str(i), "contents": f'"{name}"\n{name} is {code}'} for i, (name, code) in
              enumerate(zip(names, codes, strict=True))]

    def question(i: int) -> dict[str, Any]:
        return {"question": [{"role": "user", "content": SEARCH_INSTRUCTION.format(names[i])}],
                "golden_answers": [codes[i]]}

    questions = [question(i) for i in range(n)]
    warm = []
    for i in range(n, n + warmup):
        name, code = names[i], codes[i]
        if rng.random() < direct_share:
            wrong = code
            while wrong == code:
                wrong = "".join(rng.choice(string.digits) for _ in range(answer_digits))
            solution = f"<answer>{wrong}</answer>"
        else:
            others = rng.sample([j for j in range(total) if j != i], min(topk - 1, total - 1))
            passages = [corpus[i]["contents"]] + [corpus[j]["contents"] for j in others]
            answer = code[:copy_digits] + "".join(rng.choice(string.digits) for _ in code[copy_digits:])
            solution = f"<search>{name}</search>{information_block(passages)}<answer>{answer}</answer>"
        warm.append({**question(i), "solution": solution})
    return corpus, questions, warm


PYTHON_INSTRUCTION = "what is {}*{}?"


def python_records(n: int = 64, warmup: int = 512, digits: int = 3, guess_digits: int = 1, direct_share: float = 0.0,
                   seed: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(questions, warm-up records) of the tiny-python task (a code interpreter's use, as ToRL / ReTool train it,
    at CPU size); deterministic for its arguments.

    Each record asks for the product of two random ``digits``-digit numbers, ``"what is 123*456?"``, which a tiny
    model cannot compute in its head; its gold answer is the product (``"56088"``). Two disjoint sets of pairs:

    - ``questions``, the RL prompts: ``{"question": [chat message], "golden_answers": ["56088"]}``, ``n`` pairs;
    - ``warmup``, the supervised warm-up's records about ``warmup`` OTHER pairs, each with ``solution``: the tool
      trajectory as a rollout makes it, ``<python>print(123*456)</python>`` then the sandbox's output as the python
      tool inserts it (``\n<output>\n56088\n</output>\n``) and ``<answer>5608X</answer>``, the output copied but
      its last ``guess_digits`` digits guessed (right 1 in 10 each by chance); for a ``direct_share`` of them a direct
      answer, a wrong number of the product's length, without the tool. The warm-up teaches the call, reading the
      output and the answer format, never an RL question's product: the RL questions start near chance
      (``(1 - direct_share) / 10**guess_digits``), and the exact-match reward has to teach copying the whole output,
      and calling the tool every time.
    """
    from trainer.tools.python import Python

    if n < 1 or warmup < 0 or not 1 <= digits <= 6 or guess_digits < 0 or not 0 <= direct_share <= 1:
        raise ValueError(f"python data: n {n} >= 1, warmup {warmup} >= 0, 1 <= digits {digits} <= 6, guess_digits "
                         f"{guess_digits} >= 0, 0 <= direct_share {direct_share} <= 1 expected")
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    if n + warmup > (hi - lo + 1) ** 2 // 2:
        raise ValueError(f"python data: {n + warmup} distinct pairs of {digits}-digit numbers asked; too many")
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    seen: set[tuple[int, int]] = set()
    while len(pairs) < n + warmup:
        pair = (rng.randint(lo, hi), rng.randint(lo, hi))
        if pair not in seen and pair[::-1] not in seen:
            seen.add(pair)
            pairs.append(pair)
    head, _, tail = Python.result_template.partition("{}")

    def question(a: int, b: int) -> dict[str, Any]:
        return {"question": [{"role": "user", "content": PYTHON_INSTRUCTION.format(a, b)}],
                "golden_answers": [str(a * b)]}

    questions = [question(a, b) for a, b in pairs[:n]]
    warm = []
    for a, b in pairs[n:]:
        product = str(a * b)
        if rng.random() < direct_share:
            wrong = product
            while wrong == product:
                wrong = str(rng.randint(10 ** (len(product) - 1), 10 ** len(product) - 1))
            solution = f"<answer>{wrong}</answer>"
        else:
            keep = max(len(product) - guess_digits, 0)
            answer = product[:keep] + "".join(rng.choice(string.digits) for _ in product[keep:])
            solution = f"<python>print({a}*{b})</python>{head}{product}{tail}<answer>{answer}</answer>"
        warm.append({**question(a, b), "solution": solution})
    return questions, warm


def make_python_data(out_dir: str | Path, **kwargs: Any) -> Path:
    """Write :func:`python_records` as ``out_dir/questions.jsonl`` and ``out_dir/warmup.jsonl`` (each replaced
    whole: :func:`trainer.files.replace_file`); returns ``out_dir``."""
    out = Path(out_dir)
    questions, warm = python_records(**kwargs)
    out.mkdir(parents=True, exist_ok=True)
    for name, records in (("questions.jsonl", questions), ("warmup.jsonl", warm)):
        replace_file(out / name, records_text(records, "jsonl"))
    return out


def make_search_data(out_dir: str | Path, **kwargs: Any) -> Path:
    """Write :func:`search_records` as ``out_dir/corpus.jsonl``, ``out_dir/questions.jsonl`` and
    ``out_dir/warmup.jsonl``; returns ``out_dir``. Files are written whole to a temporary name first and
    renamed."""
    out = Path(out_dir)
    corpus, questions, warm = search_records(**kwargs)
    out.mkdir(parents=True, exist_ok=True)
    for name, records in (("corpus.jsonl", corpus), ("questions.jsonl", questions), ("warmup.jsonl", warm)):
        replace_file(out / name, records_text(records, "jsonl"))
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Bad arguments: one line on stderr, exit status 2."""
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m trainer.tiny", description="Make tiny test models and toy datasets.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    m = sub.add_parser("model", help="random-init Llama + char-level tokenizer")
    m.add_argument("out_dir")
    m.add_argument("--hidden-size", type=int, default=256)
    m.add_argument("--num-layers", type=int, default=2)
    m.add_argument("--num-heads", type=int, default=4)
    m.add_argument("--intermediate-size", type=int, default=None)
    m.add_argument("--max-position-embeddings", type=int, default=512)
    m.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("dataset", help="toy arithmetic / copy prompts")
    d.add_argument("out_file")
    d.add_argument("--n", type=int, default=256)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--fmt", choices=FORMATS, default=None, help="default: from the extension, else jsonl")
    d.add_argument("--kind", choices=KINDS, default="add")
    d.add_argument("--max-operand", type=int, default=9, help="add: operands 0..N")
    d.add_argument("--max-digits", type=int, default=4, help="copy: strings of 1..N digits")
    d.add_argument("--input-key", default="message")
    d.add_argument("--label-key", default="answer")
    s = sub.add_parser("search", help="tiny-search task: corpus.jsonl, questions.jsonl and warmup.jsonl in OUT_DIR")
    s.add_argument("out_dir")
    s.add_argument("--n", type=int, default=128, help="questions")
    s.add_argument("--warmup", type=int, default=256,
                   help="entities of the warm-up's records (warmup.jsonl), none of them asked about in questions.jsonl")
    s.add_argument("--distractors", type=int, default=0, help="passages about entities nobody asks about")
    s.add_argument("--answer-digits", type=int, default=2)
    s.add_argument("--copy-digits", type=int, default=None,
                   help="digits of the code the warm-up's answers copy from the passage, the others guessed (default: all)")
    s.add_argument("--direct-share", type=float, default=0.0,
                   help="share of warm-up targets that answer (wrongly) without searching")
    s.add_argument("--topk", type=int, default=1,
                   help="passages in the warm-up's information blocks (BM25 finds only the entity's own for its name)")
    s.add_argument("--seed", type=int, default=0)
    y = sub.add_parser("python", help="tiny-python task: questions.jsonl and warmup.jsonl in OUT_DIR")
    y.add_argument("out_dir")
    y.add_argument("--n", type=int, default=64, help="questions")
    y.add_argument("--warmup", type=int, default=512, help="pairs of the warm-up's records, none of them asked about")
    y.add_argument("--digits", type=int, default=3, help="digits of each factor")
    y.add_argument("--guess-digits", type=int, default=1,
                   help="last digits of the output the warm-up's answers guess instead of copying")
    y.add_argument("--direct-share", type=float, default=0.0,
                   help="share of warm-up targets that answer (wrongly) without the tool")
    y.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (see the module docstring)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "python":
            out = make_python_data(args.out_dir, n=args.n, warmup=args.warmup, digits=args.digits,
                                   guess_digits=args.guess_digits, direct_share=args.direct_share, seed=args.seed)
        elif args.command == "search":
            out = make_search_data(args.out_dir, n=args.n, warmup=args.warmup, distractors=args.distractors,
                                   answer_digits=args.answer_digits, copy_digits=args.copy_digits, direct_share=args.direct_share,
                                   topk=args.topk, seed=args.seed)
        elif args.command == "model":
            out = make_model(
                args.out_dir,
                hidden_size=args.hidden_size,
                num_layers=args.num_layers,
                num_heads=args.num_heads,
                intermediate_size=args.intermediate_size,
                seed=args.seed,
                max_position_embeddings=args.max_position_embeddings,
            )
        else:
            fmt = args.fmt
            if fmt is None:
                ext = Path(args.out_file).suffix.lstrip(".").lower()
                fmt = ext if ext in FORMATS else "jsonl"
            out = make_math_dataset(
                args.out_file,
                n=args.n,
                seed=args.seed,
                fmt=fmt,
                input_key=args.input_key,
                label_key=args.label_key,
                kind=args.kind,
                max_operand=args.max_operand,
                max_digits=args.max_digits,
            )
    except (ValueError, ImportError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
