"""A random-init model of Qwen2.5-0.5B's shape, with a char-level tokenizer padded to its vocabulary.

No model hub is reachable from the GPU machines, so the benchmarks train a model made here: Qwen2
architecture (q/k/v biases, GQA 14/2 heads, tied embeddings) with Qwen2.5-0.5B's sizes (hidden 896,
24 layers, MLP 4864, vocab 151936; 494M parameters). The tokenizer has :mod:`trainer.tiny`'s characters, one
token each, written as a Qwen2 (byte-level) tokenizer, its vocabulary padded with filler tokens ``<x123>`` up to
the model's, so that every id a random model samples decodes to text (the reward function sees it) and the
logits keep the real vocab's cost.

    python bench/gpu/model.py OUT_DIR [--layers 24 --hidden 896 ... --dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936)
# Qwen2.5-7B's config (7.6B parameters; untied embeddings)
QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064)
# Qwen2.5-32B's config (32.8B parameters; untied embeddings): seed 004's model size
QWEN25_32B = dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                  num_key_value_heads=8, vocab_size=152064)
SHAPES = {"0.5b": (QWEN25_05B, True), "7b": (QWEN25_7B, False), "32b": (QWEN25_32B, False)}


def byte_level(text: str) -> str:
    """``text``'s UTF-8 bytes as byte-level BPE writes them in a vocabulary (GPT-2's byte-to-unicode map, which
    Qwen2's tokenizer uses): space is ``Ġ``, newline ``Ċ``."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return "".join(table[b] for b in text.encode())


def build_padded_tokenizer(vocab_size: int):
    """trainer.tiny's characters as a Qwen2 tokenizer, with filler tokens ``<xN>`` for the ids up to
    ``vocab_size``.

    A Qwen2 tokenizer, not the char tokenizer itself: transformers 5 loads every directory whose config says
    ``model_type: qwen2`` with its ``Qwen2Tokenizer``, which rebuilds the pipeline from the saved vocabulary
    (byte-level pre-tokenizer, NFC) whatever tokenizer.json says. A plain char vocabulary then loses every
    space and newline (``encode("\\n") == []``; verl's Qwen chat handling refused it, 2026-11-28). Written as
    byte-level tokens with no merges, each character is one token, the same after that rebuild."""
    from transformers import AddedToken, Qwen2Tokenizer

    from trainer import tiny

    chars = [byte_level(c) for c in tiny.CHARACTERS]
    vocab = {tok: i for i, tok in enumerate((*tiny.SPECIAL_TOKENS, *chars))}
    if len(vocab) != len(tiny.SPECIAL_TOKENS) + len(tiny.CHARACTERS):
        raise ValueError("two characters share a byte-level token")
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size {vocab_size} is below the char tokenizer's {len(vocab)} tokens")
    vocab.update({f"<x{i}>": i for i in range(len(vocab), vocab_size)})
    tok = Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token=tiny.UNK, eos_token=tiny.EOS, pad_token=tiny.PAD, bos_token=None,
        padding_side="left", model_max_length=32768, clean_up_tokenization_spaces=False)
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True)
                                                          for t in (tiny.IM_START, tiny.IM_END)]})
    tok.chat_template = tiny.CHAT_TEMPLATE
    ids = tok.encode(tiny.CHARACTERS, add_special_tokens=False)
    if ids != list(range(len(tiny.SPECIAL_TOKENS), len(tiny.SPECIAL_TOKENS) + len(tiny.CHARACTERS))):
        raise RuntimeError(f"the tokenizer does not give one token per character: {ids}")
    return tok


def write_config(out: Path, sizes: dict, tied: bool, dtype: str = "bfloat16"):
    """The padded tokenizer and the Qwen2 config of ``sizes`` in ``out`` (no weights; vLLM's dummy load takes
    that much); returns the config."""
    from transformers import Qwen2Config

    out.mkdir(parents=True, exist_ok=True)
    tok = build_padded_tokenizer(sizes["vocab_size"])
    tok.save_pretrained(str(out))
    config = Qwen2Config(**sizes, architectures=["Qwen2ForCausalLM"], max_position_embeddings=32768,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=tied, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, dtype=dtype)
    config.save_pretrained(str(out))
    return config


def make_qwen_shaped(out_dir: str | Path, dtype: str = "bfloat16", seed: int = 0, shape: str = "0.5b",
                     device: str = "cpu", **overrides) -> Path:
    """Save the model (safetensors, ``dtype``) and the padded tokenizer to ``out_dir``; returns it. ``device``:
    where the random weights are made (``cuda`` makes a 7B in seconds; the saved files are the same kind)."""
    import torch
    from transformers import Qwen2ForCausalLM

    base, tied = SHAPES[shape]
    sizes = {**base, **overrides}
    out = Path(out_dir)
    config = write_config(out, sizes, tied, dtype)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        if device != "cpu":
            torch.cuda.manual_seed(seed)
        torch.set_default_dtype(getattr(torch, dtype))  # made in dtype: a 7B in float32 is 30 GB
        try:
            model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    model.save_pretrained(str(out), safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    (out / "params.json").write_text(json.dumps({"params": n, **sizes}))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--device", default="cpu", help="where the random weights are made (cuda: fast)")
    for key in QWEN25_05B:
        p.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=None, help="override the shape's")
    args = vars(p.parse_args(argv))
    overrides = {k: v for k, v in args.items() if k in QWEN25_05B and v is not None}
    out = make_qwen_shaped(args["out_dir"], dtype=args["dtype"], seed=args["seed"], shape=args["shape"],
                           device=args["device"], **overrides)
    print(json.loads((out / "params.json").read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
