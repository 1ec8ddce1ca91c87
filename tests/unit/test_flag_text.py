"""A trainer flag's text is read one way (trainer.config.fields.from_text), with one rule for "none": the
trainer's command line, rlrun's --set and presets, and text given to TrainerConfig agree, flag by flag."""

from __future__ import annotations

import pytest

from rlrun.presets import coerce, parse_sets
from trainer.config import TrainerConfig
from trainer.config.cli import build_parser, read_argv
from trainer.config.fields import NONE_WORDS, check_field, flag_specs, from_text

SPECS = {s.name: s for s in flag_specs(TrainerConfig)}
OPTIONAL = [s for s in SPECS.values() if s.optional and s.base is not bool]


def _cli(*argv: str) -> dict:
    values, _, problems = read_argv(list(argv), build_parser())
    assert not problems, problems
    return values


@pytest.mark.parametrize("word", [*NONE_WORDS, "None", "NULL", " none "])
def test_none_means_none_for_every_flag_that_may_be_none_wherever_it_is_written(word):
    assert len(OPTIONAL) > 10
    for spec in OPTIONAL:
        assert from_text(spec, word) is None, spec.name
        assert coerce(spec, word) == (None, None), spec.name
        assert parse_sets([f"{spec.name}={word}"])[spec.name] is None, spec.name
        if not spec.is_pair:  # two numbers on the command line: argparse takes two words
            assert _cli(spec.cli, word)[spec.name] is None, spec.name
        if spec.is_list or spec.is_pair:  # the text TrainerConfig reads itself
            assert check_field(spec, word) == (None, None), spec.name


def test_none_is_a_word_where_the_flag_cannot_be_none():
    norm = SPECS["is_correction"]  # a choice named none
    assert not norm.optional and "none" in norm.choices
    assert from_text(norm, "none") == "none" == coerce(norm, "none")[0] == parse_sets(["is_correction=none"])[
        "is_correction"] == _cli("--is_correction", "none")["is_correction"]
    batch = SPECS["train_batch_size"]
    with pytest.raises(ValueError, match="'none' is not an integer"):
        from_text(batch, "none")
    assert coerce(batch, "none") == ("none", "an integer")


def test_lists_pairs_numbers_and_switches_read_the_same_everywhere():
    pair = SPECS["eps_clip_low_high"]
    for text in ("0.1,0.3", "0.1 0.3", " 0.1, 0.3 "):
        assert from_text(pair, text) == (0.1, 0.3) == coerce(pair, text)[0] == check_field(pair, text)[0]
        assert parse_sets([f"eps_clip_low_high={text}"])["eps_clip_low_high"] == (0.1, 0.3)
    assert _cli("--eps_clip_low_high", "0.1", "0.3")["eps_clip_low_high"] == (0.1, 0.3)
    listed = next(s for s in SPECS.values() if s.is_list)
    assert from_text(listed, "a, b,,c") == ("a", "b", "c") == coerce(listed, "a, b,,c")[0] == \
        _cli(listed.cli, "a, b,,c")[listed.name]
    lr = SPECS["actor_learning_rate"]
    assert from_text(lr, "5e-7") == 5e-7 == _cli("--actor_learning_rate", "5e-7")["actor_learning_rate"]
    switch = SPECS["bf16"]
    assert [from_text(switch, w) for w in ("true", "Yes", "on", "1", "false", "no", "OFF", "0")] == [True] * 4 + \
        [False] * 4
    with pytest.raises(ValueError, match="'maybe' is not a boolean switch"):
        from_text(switch, "maybe")
