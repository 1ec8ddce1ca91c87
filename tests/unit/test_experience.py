import pytest
import torch

from trainer.experience import build_experience, shard


def test_prompts_left_padded_responses_right_padded():
    exp = build_experience([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=0)
    assert exp.input_ids.tolist() == [[5, 6, 8, 0, 0], [0, 7, 9, 10, 11]]
    assert exp.attention_mask.tolist() == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]]
    assert exp.action_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert exp.num_actions == 3


def test_empty_response_keeps_one_masked_column():
    exp = build_experience([[5]], [[]], pad_id=0)
    assert exp.input_ids.tolist() == [[5, 0]] and exp.action_mask.tolist() == [[0.0]]


def test_rows_select_every_tensor():
    exp = build_experience([[1], [2], [3]], [[4], [5], [6]], pad_id=0)
    exp.advantages = torch.tensor([[0.1], [0.2], [0.3]])
    rows = exp.rows([2, 0])
    assert rows["input_ids"].tolist() == [[3, 6], [1, 4]]
    torch.testing.assert_close(rows["advantages"], torch.tensor([[0.3], [0.1]]))
    assert "ref_logprobs" not in rows


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 prompts and 1 responses"):
        build_experience([[1], [2]], [[3]], pad_id=0)


def test_shards_cover_all_rows_in_order():
    assert shard(5, 2) == [[0, 1, 2], [3, 4]]
    assert shard(2, 4) == [[0], [1], [], []]
