"""bench/gpu/model.py's tokenizer, reloaded the way every system on the GPU machine loads it: AutoTokenizer on a
directory whose config says ``model_type: qwen2``. transformers 5 then builds its own Qwen2Tokenizer from the
saved vocabulary; with a plain char vocabulary that dropped every space and newline, and verl refused to start
(``Expected Qwen newline to tokenize to one token, got []``, 2026-11-28)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from transformers import AutoTokenizer, Qwen2Config

from trainer import tiny

PROJECT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_model", PROJECT / "bench" / "gpu" / "model.py")
bench_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_model)

VOCAB = 512


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("qwen-shaped")
    made = bench_model.build_padded_tokenizer(VOCAB)
    made.save_pretrained(str(out))
    Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(str(out))
    return made, AutoTokenizer.from_pretrained(str(out))


def test_every_character_is_one_token_after_the_reload(saved):
    made, loaded = saved
    first = len(tiny.SPECIAL_TOKENS)
    want = list(range(first, first + len(tiny.CHARACTERS)))
    for tok in (made, loaded):
        assert tok.encode(tiny.CHARACTERS, add_special_tokens=False) == want
        assert tok.encode("\n", add_special_tokens=False) == [tiny.CHARACTERS.index("\n") + first]
        assert tok.encode(" ", add_special_tokens=False) == [tiny.CHARACTERS.index(" ") + first]
    assert len(loaded) == VOCAB


def test_the_chat_template_round_trips_with_its_special_tokens(saved):
    _, loaded = saved
    text = loaded.apply_chat_template([{"role": "user", "content": "12 + 30 =\n?"}], add_generation_prompt=True,
                                      tokenize=False)
    assert text == "<|im_start|>user\n12 + 30 =\n?<|im_end|>\n<|im_start|>assistant\n"
    ids = loaded.encode(text, add_special_tokens=False)
    assert ids[0] == loaded.convert_tokens_to_ids(tiny.IM_START) == tiny.SPECIAL_TOKENS.index(tiny.IM_START)
    assert loaded.convert_tokens_to_ids(tiny.IM_END) in ids
    assert loaded.decode(ids) == text
    assert (loaded.eos_token, loaded.pad_token, loaded.padding_side) == (tiny.EOS, tiny.PAD, "left")
    # a filler id (what a random model mostly samples) decodes to text the reward function can see
    assert loaded.decode([VOCAB - 1]) == f"<x{VOCAB - 1}>"


def test_byte_level_names_whitespace_as_qwen_does():
    assert bench_model.byte_level(" \n") == "\u0120\u010a"  # Ġ Ċ
    assert bench_model.byte_level("a1+") == "a1+"
    with pytest.raises(ValueError, match="below the char tokenizer"):
        bench_model.build_padded_tokenizer(10)
