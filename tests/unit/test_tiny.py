"""trainer.tiny: the self-made tokenizer, model and toy datasets load through the real loading paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer import tiny

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.make_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_heads=1, seed=0)


@pytest.fixture(scope="module")
def tok(model_dir: Path):
    return AutoTokenizer.from_pretrained(str(model_dir))


def test_tokenizer_saved_and_reloaded(tmp_path: Path) -> None:
    made = tiny.make_tokenizer(tmp_path / "tok")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(loaded) == len(made) < 128
    assert loaded.pad_token == "<pad>" and loaded.eos_token == "<eos>" and loaded.unk_token == "<unk>"
    assert loaded.padding_side == "left"
    assert loaded.pad_token_id != loaded.eos_token_id
    assert {"<|im_start|>", "<|im_end|>"} <= set(loaded.all_special_tokens)


@pytest.mark.parametrize(
    "text",
    ["3+4=7", "the answer is  \\boxed{1/2}", "x^2_{i} = (a*b)-[c]; ok? yes! 'q' \"r\" <s>|t $5 %", "a\nb\n\n c"],
)
def test_round_trip(tok, text: str) -> None:
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, nothing added
    assert tok.decode(ids) == text


def test_special_tokens_are_single_ids(tok) -> None:
    ids = tok("<|im_start|>user\nhi<|im_end|><eos>")["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert ids[-2] == tok.convert_tokens_to_ids("<|im_end|>")
    assert ids[-1] == tok.eos_token_id
    assert len(ids) == 1 + 4 + 1 + 2 + 1 + 1
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_unknown_character_is_unk(tok) -> None:
    ids = tok("aé")["input_ids"]
    assert ids == [tok.convert_tokens_to_ids("a"), tok.unk_token_id]


def test_chat_template_is_chatml(tok) -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "3+4="}]
    with_prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert with_prompt == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    )
    without = tok.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert without == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n"


def test_left_padding(tok) -> None:
    batch = tok(["1+1=", "10+10="], padding=True)
    assert batch["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert batch["attention_mask"][0] == [0, 0, 1, 1, 1, 1]


def test_model_loads_and_forward(model_dir: Path, tok) -> None:
    assert (model_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.vocab_size == len(tok)
    assert (cfg.pad_token_id, cfg.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert cfg.bos_token_id is not None
    assert cfg.tie_word_embeddings is False
    assert cfg.hidden_size // cfg.num_attention_heads == 64
    ids = torch.tensor([tok("3+4=")["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, 4, len(tok))
    assert torch.isfinite(logits).all()


def test_default_head_dim_is_vllm_cpu_friendly(tmp_path: Path) -> None:
    out = tiny.make_model(tmp_path / "m", num_layers=1)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    assert cfg["architectures"] == ["LlamaForCausalLM"]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_weights_deterministic_per_seed(tmp_path: Path, model_dir: Path) -> None:
    torch.manual_seed(1234)  # the global RNG state must not matter
    same = tiny.make_model(tmp_path / "same", hidden_size=64, num_heads=1, seed=0)
    other = tiny.make_model(tmp_path / "other", hidden_size=64, num_heads=1, seed=1)
    a, b, c = _weights(model_dir), _weights(same), _weights(other)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_bad_head_split_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not divisible by num_heads 3"):
        tiny.make_model(tmp_path / "m", hidden_size=64, num_heads=3)


def _read(path: Path, fmt: str) -> list[dict]:
    if fmt == "jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if fmt == "json":
        return json.loads(path.read_text())
    import pyarrow.parquet as pq

    return pq.read_table(str(path)).to_pylist()


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet"])
def test_dataset_formats_round_trip(tmp_path: Path, fmt: str) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    path = tiny.make_math_dataset(tmp_path / f"d.{fmt}", n=20, seed=3, fmt=fmt)
    assert _read(path, fmt) == tiny.math_records(n=20, seed=3)


def test_parquet_without_pyarrow_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="needs the 'pyarrow' package"):
        tiny.make_math_dataset(tmp_path / "d.parquet", n=2, fmt="parquet")


def test_add_records_are_correct_and_deterministic() -> None:
    recs = tiny.math_records(n=50, seed=7)
    assert recs == tiny.math_records(n=50, seed=7)
    assert recs != tiny.math_records(n=50, seed=8)
    for r in recs:
        (msg,) = r["message"]
        assert msg["role"] == "user"
        a, b = msg["content"].rstrip("=").split("+")
        assert len(a) == len(b) == 1
        assert r["answer"] == str(int(a) + int(b))


def test_copy_records_and_custom_keys() -> None:
    recs = tiny.math_records(n=30, seed=0, kind="copy", input_key="q", label_key="a")
    for r in recs:
        assert set(r) == {"q", "a", "solution"}
        assert r["q"][0]["content"] == f"copy {r['a']}=" and r["solution"] == f"\\boxed{{{r['a']}}}"
        assert r["a"].isdigit() and 1 <= len(r["a"]) <= 4


def test_unknown_kind_and_format() -> None:
    with pytest.raises(ValueError, match="unknown dataset kind 'mul'"):
        tiny.math_records(kind="mul")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown dataset format 'csv'"):
        tiny.make_math_dataset("x.csv", fmt="csv")  # type: ignore[arg-type]


def test_cli_dataset_and_bad_args(tmp_path: Path) -> None:
    assert tiny.main(["dataset", str(tmp_path / "d.json"), "--n", "5", "--kind", "copy"]) == 0
    assert len(json.loads((tmp_path / "d.json").read_text())) == 5
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.tiny", "dataset", str(tmp_path / "e.jsonl"), "--n", "x"],
        capture_output=True, text=True, cwd=PROJECT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--n" in proc.stderr
    assert not (tmp_path / "e.jsonl").exists()


def test_cli_model(tmp_path: Path) -> None:
    code = tiny.main(["model", str(tmp_path / "m"), "--hidden-size", "64", "--num-heads", "1",
                      "--num-layers", "1"])  # fmt: skip
    assert code == 0
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_hidden_layers"] == 1
    with pytest.raises(SystemExit) as exc:
        tiny.main(["model"])
    assert exc.value.code == 2
    assert tiny.main(["model", str(tmp_path / "bad"), "--hidden-size", "64", "--num-heads", "3"]) == 2


def test_search_data_answers_are_only_in_the_corpus(tmp_path: Path) -> None:
    """The RL questions' codes are in the corpus only; the warm-up's trajectories are about other entities,
    so a warm-up can teach the format and copying but never an RL question's answer."""
    from trainer.reward.qa import extract_answer

    out = tmp_path / "search"
    done = subprocess.run([sys.executable, "-m", "trainer.tiny", "search", str(out), "--n", "20", "--warmup", "40",
                           "--distractors", "10", "--direct-share", "0.25", "--seed", "3"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    read = lambda name: [json.loads(line) for line in (out / name).read_text().splitlines()]  # noqa: E731
    corpus, questions, warm = read("corpus.jsonl"), read("questions.jsonl"), read("warmup.jsonl")
    assert len(corpus) == 70 and len(questions) == 20 and len(warm) == 40
    names = [c["contents"].split("\n")[0].strip('"') for c in corpus]
    assert len(set(names)) == 70  # one passage per entity: a search for its name finds it
    by_name = {n: c["contents"] for n, c in zip(names, corpus, strict=True)}

    def asked(record: dict) -> tuple[str, str]:
        text = record["question"][0]["content"]
        (code,) = record["golden_answers"]
        name = text.rsplit(" ", 1)[1].rstrip("?")
        assert by_name[name] == f'"{name}"\n{name} is {code}' and code not in text  # the code is in the corpus only
        return name, code

    rl = {asked(q)[0] for q in questions}
    assert all("solution" not in q for q in questions)  # no target response that holds an RL question's code
    searched = direct = 0
    for w in warm:
        name, code = asked(w)
        assert name not in rl
        if w["solution"].startswith("<search>"):
            searched += 1
            assert w["solution"] == (f'<search>{name}</search>\n\n<information>Doc 1(Title: "{name}") {name} is '
                                     f"{code}</information>\n\n<answer>{code}</answer>")
        else:
            direct += 1
            assert extract_answer(w["solution"]) != code  # the direct answers teach the format, not the code
        # no warm-up target names an RL entity or holds an RL entity's passage
        assert not any(f'"{other}"' in w["solution"] or f"{other} is" in w["solution"] for other in rl)
    assert searched and direct
    assert len({asked(w)[0] for w in warm}) == 40  # 40 distinct warm-up entities, none of them asked in RL
    assert tiny.search_records(n=20, warmup=40, distractors=10, direct_share=0.25, seed=3) == (corpus, questions, warm)
    bad = subprocess.run([sys.executable, "-m", "trainer.tiny", "search", str(out), "--n", "0"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "n 0 >= 1" in bad.stderr


def test_python_data_products_only_through_the_tool(tmp_path: Path) -> None:
    out = tmp_path / "python"
    done = subprocess.run([sys.executable, "-m", "trainer.tiny", "python", str(out), "--n", "30", "--warmup", "200",
                           "--guess-digits", "1", "--direct-share", "0.25", "--seed", "5"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    questions = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    warm = [json.loads(line) for line in (out / "warmup.jsonl").read_text().splitlines()]
    assert len(questions) == 30 and len(warm) == 200
    asked = set()
    for q in questions:
        a, b = (int(x) for x in q["question"][0]["content"].removeprefix("what is ").rstrip("?").split("*"))
        assert 100 <= a <= 999 and 100 <= b <= 999 and q["golden_answers"] == [str(a * b)]
        asked |= {(a, b), (b, a)}
    direct = copied = 0
    for w in warm:
        a, b = (int(x) for x in w["question"][0]["content"].removeprefix("what is ").rstrip("?").split("*"))
        assert (a, b) not in asked  # the warm-up never shows an RL question
        product = str(a * b)
        answer = w["solution"].rsplit("<answer>", 1)[1].removesuffix("</answer>")
        if w["solution"].startswith("<answer>"):
            direct += 1
            assert answer != product and len(answer) == len(product)
            continue
        # the trajectory as a rollout makes it: the call, the output as the python tool inserts it, the answer
        assert w["solution"].startswith(f"<python>print({a}*{b})</python>\n<output>\n{product}\n</output>\n<answer>")
        assert answer[:-1] == product[:-1] and len(answer) == len(product)  # the last digit guessed
        copied += answer == product
    assert 25 <= direct <= 75 and copied < (200 - direct) / 3  # ~a quarter direct; the guess right ~1 in 10
    assert tiny.python_records(n=30, warmup=200, guess_digits=1, direct_share=0.25, seed=5) == (questions, warm)
    bad = subprocess.run([sys.executable, "-m", "trainer.tiny", "python", str(out), "--digits", "9"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "digits 9" in bad.stderr
