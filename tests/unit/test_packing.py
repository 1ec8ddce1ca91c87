"""Sample packing (``--packing_samples``): the packed layout by hand, and packed forwards of a real tiny
model (log-probs, values, gradients) equal to the padded ones on every action token."""

from __future__ import annotations

import pytest
import torch

from trainer.experience import build_experience
from trainer.learn.packing import block_causal_mask, first_fit, pack, unpack

PAD = 0


def _exp():
    # prompts of 3, 1, 2 tokens; responses of 2, 3, 0 tokens (the empty one keeps a masked column)
    return build_experience([[5, 6, 7], [8], [9, 10]], [[11, 12], [13, 14, 15], []], PAD)


def test_pack_by_hand():
    exp = _exp()
    # padded: P = 3, R = 3 -> rows  [5 6 7 | 11 12 _], [_ _ 8 | 13 14 15], [_ 9 10 | _ _ _]
    # real lengths 5, 4, 2: longest first into rows of the padded width 6 -> [5], [4 + 2]
    packed = pack(exp.input_ids, exp.attention_mask, exp.num_actions)
    assert packed.input_ids.tolist() == [[5, 6, 7, 11, 12, 0], [8, 13, 14, 15, 9, 10]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 0, 1]]
    assert packed.lengths.tolist() == [5, 4, 2]
    # the output predicting action (b, r) sits one column before the action token: flat row * 6 + col
    assert packed.pred_index.tolist() == [[2, 3, -1], [6, 7, 8], [-1, -1, -1]]
    mask = packed.attention_mask
    assert mask.shape == (2, 1, 6, 6) and mask.dtype == torch.bool
    assert mask[0, 0, 4].tolist() == [True] * 5 + [False]  # last token of sequence 0
    assert mask[0, 0, 5].tolist() == [False] * 5 + [True]  # the fill slot sees itself only
    assert mask[1, 0, 5].tolist() == [False] * 4 + [True, True]  # sequence 2 does not see sequence 1
    assert mask[1, 0, 3].tolist() == [True] * 4 + [False, False]
    per_token = torch.arange(12.0).view(2, 6)
    assert unpack(per_token, packed, fill=-1.0).tolist() == [[2, 3, -1], [6, 7, 8], [-1, -1, -1]]
    # log-probs of logits[:, :-1] have one column less; the last column never predicts a token
    assert unpack(per_token[:, :-1], packed, fill=-1.0).tolist() == [[2, 3, -1], [6, 7, 8], [-1, -1, -1]]
    with pytest.raises(ValueError, match=r"shape \(2, 4\); expected \(2, 6\) or \(2, 5\)"):
        unpack(per_token[:, :4], packed)


def test_flash_packs_one_row_without_a_mask_and_eager_gets_an_additive_mask():
    exp = _exp()
    flash = pack(exp.input_ids, exp.attention_mask, exp.num_actions, attn="flash_attention_2")
    assert flash.attention_mask is None
    assert flash.input_ids.tolist() == [[5, 6, 7, 11, 12, 8, 13, 14, 15, 9, 10]]
    assert flash.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1]]
    assert flash.pred_index.tolist() == [[2, 3, -1], [5, 6, 7], [-1, -1, -1]]
    sdpa = pack(exp.input_ids, exp.attention_mask, exp.num_actions).attention_mask
    eager = pack(exp.input_ids, exp.attention_mask, exp.num_actions, attn="eager", dtype=torch.bfloat16).attention_mask
    assert eager.dtype == torch.bfloat16
    assert torch.equal(eager == 0, sdpa) and torch.all(eager[~sdpa] == torch.finfo(torch.bfloat16).min)


def test_first_fit_places_longest_first_within_the_width():
    # 5 -> row 0; 4 -> row 1; 3 fits neither -> row 2; 2 -> row 1 after the 4; 1 -> row 0 after the 5
    assert first_fit([3, 5, 2, 4, 1], 6) == [(2, 0), (0, 0), (1, 4), (1, 0), (0, 5)]
    assert first_fit([6, 6], 6) == [(0, 0), (1, 0)]


def test_block_causal_mask_per_row():
    m = block_causal_mask(torch.tensor([[0, 0, 1, -1]]))[0, 0]
    assert m.tolist() == [[True, False, False, False], [True, True, False, False],
                          [False, False, True, False], [False, False, False, True]]


@pytest.mark.parametrize("ids, attn, n, expected", [
    (torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 5, dtype=torch.long), 2, "of one [B, L] shape"),
    (torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long), 2, "of one [B, L] shape"),
    (torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), 4, "expected 0 < num_actions < L=4"),
    (torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), 0, "expected 0 < num_actions"),
    (torch.zeros(2, 4, dtype=torch.long), torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), 2, "row 1 of the micro"),
])
def test_bad_input_is_refused_with_what_was_expected(ids, attn, n, expected):
    with pytest.raises(ValueError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        pack(ids, attn, n)


def test_an_attention_packing_cannot_keep_apart_is_refused():
    exp = _exp()
    with pytest.raises(ValueError, match="supports attention sdpa, eager, flash_attention_2; the model uses 'flex'"):
        pack(exp.input_ids, exp.attention_mask, exp.num_actions, attn="flex")


# --- packed forwards of a real model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from trainer.tiny import make_model

    return str(make_model(tmp_path_factory.mktemp("tiny") / "m", hidden_size=64, num_layers=2, num_heads=4))


def _ragged(vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lens_p, lens_r = [7, 2, 5, 9, 3], [6, 11, 0, 1, 4]
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lens_p]
    responses = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lens_r]
    return build_experience(prompts, responses, PAD)


def _policy(tiny, attn: str, packing: bool):
    pytest.importorskip("ray")
    from transformers import AutoModelForCausalLM

    from trainer.learn.model_worker import ModelWorker

    worker = ModelWorker(0, 1)
    torch.manual_seed(0)
    worker.engine = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation=attn)
    worker.temperature, worker.packing, worker.attn = 0.7, packing, attn
    return worker


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_and_gradients_equal_the_padded_ones(tiny, attn):
    from trainer.learn.losses import policy_loss

    padded, packed = _policy(tiny, attn, False), _policy(tiny, attn, True)
    exp = _ragged(padded.engine.config.vocab_size)
    mask = exp.action_mask
    assert mask.sum() < mask.numel()  # the batch really is ragged
    grads, logps = [], []
    for worker in (padded, packed):
        logp = worker._action_logprobs(exp.input_ids, exp.attention_mask, exp.num_actions)
        old = torch.full_like(logp, -3.0)
        adv = torch.linspace(-1, 1, mask.numel()).view_as(mask)
        loss, _ = policy_loss(logp, old, adv, mask, 0.2)
        loss.backward()
        logps.append(logp.detach())
        grads.append({n: p.grad.clone() for n, p in worker.engine.named_parameters()})
    on = mask.bool()
    torch.testing.assert_close(logps[1][on], logps[0][on], rtol=0, atol=1e-5)
    assert torch.all(logps[1][~on] == 0)
    assert logps[0][on].abs().min() > 0  # real log-probs, not the fill
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_packed_forward_is_not_the_padded_one_without_the_block_mask(tiny):
    # the mask is what keeps sequences apart: with plain causal attention over the packed row, later rows
    # see earlier ones and their log-probs change (this is what the block mask must prevent)
    worker = _policy(tiny, "sdpa", True)
    exp = _ragged(worker.engine.config.vocab_size)
    p = pack(exp.input_ids, exp.attention_mask, exp.num_actions)
    assert p.input_ids.size(0) < exp.input_ids.size(0)  # some rows hold more than one sequence
    with torch.no_grad():
        blocked = worker.engine(input_ids=p.input_ids, attention_mask=p.attention_mask,
                                position_ids=p.position_ids).logits
        leaky = worker.engine(input_ids=p.input_ids, position_ids=p.position_ids).logits
    # a row's first sequence sees nothing before it either way; what follows it differs without the mask
    shared = next(r for r in range(p.input_ids.size(0)) if (p.position_ids[r, 1:] == 0).any())
    second = int((p.position_ids[shared, 1:] == 0).nonzero()[0]) + 1
    torch.testing.assert_close(leaky[shared, :second], blocked[shared, :second])
    assert not torch.allclose(leaky[shared, second:], blocked[shared, second:], atol=1e-3)


def test_packed_critic_values_equal_the_padded_ones(tiny):
    pytest.importorskip("ray")
    from transformers import AutoModel

    from trainer.learn.critic_worker import CriticWorker, ValueModel

    torch.manual_seed(0)
    model = ValueModel(AutoModel.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa"), 64)
    torch.nn.init.normal_(model.value_head.weight)  # a head that reads the hidden state
    exp = _ragged(model.backbone.config.vocab_size, seed=1)
    mb = {"input_ids": exp.input_ids, "attention_mask": exp.attention_mask, "action_mask": exp.action_mask}
    values = []
    for packing in (False, True):
        worker = CriticWorker(0, 1)
        worker.engine, worker.packing, worker.attn = model, packing, "sdpa"
        with torch.no_grad():
            values.append(worker._values(mb))
    on = exp.action_mask.bool()
    assert values[0][on].abs().min() > 0
    torch.testing.assert_close(values[1][on], values[0][on], rtol=0, atol=1e-5)
