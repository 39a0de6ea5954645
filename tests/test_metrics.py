"""Pure functions: metrics, encoding/collation, the LR schedule and the batch order."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from clbench import metrics as M
from clbench.arith import char_tokenizer
from clbench.data import Encoded, collate, encode, encode_texts
from clbench.errors import ClbenchError
from clbench.train import epoch_batches, warmup_cosine

# char_tokenizer ids: <pad> 0, <bos> 1, <eos> 2, <unk> 3, '0'..'9' 4..13, '+' 14, '*' 15, '=' 16
PAD, BOS, EOS = 0, 1, 2


def digit(d: int) -> int:
    return 4 + d


PLUS, TIMES, EQ = 14, 15, 16


# ---------------------------------------------------------------- metrics


def test_token_nll_matches_hand_computation():
    logits = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
    targets = torch.tensor([2, 0])
    nll = M.token_nll(logits, targets)
    assert nll.dtype == torch.float64
    assert nll.shape == (2,)
    # row 0: -log(e^2 / (e^0 + e^1 + e^2)); row 1: uniform over 3 → log 3
    expected = [math.log(1 + math.e + math.e**2) - 2.0, math.log(3.0)]
    # computed in float32: within a few ulps (2.4e-7 at 2.4) of the exact values
    assert nll.tolist() == pytest.approx(expected, rel=0, abs=5e-7)
    # target 0 in row 0 is the least likely: log(1 + e + e^2) - 0
    assert M.token_nll(logits[:1], torch.tensor([0])).item() == pytest.approx(
        math.log(1 + math.e + math.e**2), abs=5e-7
    )


def test_token_nll_upcasts_half_logits_and_returns_float64():
    logits = torch.tensor([[0.0, 0.0]], dtype=torch.bfloat16)
    nll = M.token_nll(logits, torch.tensor([1]))
    # bf16 arithmetic would round log 2 to 0.69140625; float32 is within one ulp (6e-8)
    assert nll.dtype == torch.float64 and nll.item() == pytest.approx(math.log(2.0), abs=6e-8)


def test_mean_nll():
    assert M.mean_nll(6.0, 4) == 1.5
    assert M.mean_nll(0.0, 1) == 0.0
    assert math.isnan(M.mean_nll(0.0, 0))
    assert math.isnan(M.mean_nll(3.0, 0))


def test_exact_match_needs_every_position_right():
    # example 0: positions 0,1 both right; example 1: positions 2,3 with 3 wrong; example 2: position 4 right
    correct = torch.tensor([True, True, True, False, True])
    example_of = torch.tensor([0, 0, 1, 1, 2])
    hits = M.exact_match(correct, example_of, 3)
    assert hits.dtype == torch.bool
    assert hits.tolist() == [True, False, True]
    # the order of positions does not matter
    perm = torch.tensor([3, 0, 4, 2, 1])
    assert M.exact_match(correct[perm], example_of[perm], 3).tolist() == [True, False, True]
    # every position wrong
    assert M.exact_match(torch.zeros(5, dtype=torch.bool), example_of, 3).tolist() == [False, False, False]


def test_accuracy():
    assert M.accuracy(torch.tensor([True, False, True, True])) == 0.75
    assert M.accuracy(torch.tensor([False, False])) == 0.0
    assert M.accuracy(torch.tensor([True])) == 1.0
    assert math.isnan(M.accuracy(torch.zeros(0, dtype=torch.bool)))


def test_forgetting_is_adapted_minus_base():
    assert M.forgetting(2.5, 2.0) == 0.5  # worse after adaptation → positive
    assert M.forgetting(1.0, 1.5) == -0.5  # better → negative
    assert M.forgetting(1.25, 1.25) == 0.0


def test_higher_is_better():
    assert M.higher_is_better("target_acc_seen") is True  # per-group accuracy inherits from target_acc
    assert M.higher_is_better("target_acc_unseen") is True
    assert M.higher_is_better("target_acc") is True
    assert M.higher_is_better("forgetting_full") is False
    assert M.higher_is_better("forgetting_oldvocab") is False
    assert M.higher_is_better("target_loss") is False
    assert M.higher_is_better("old_skill_acc_delta") is True
    with pytest.raises(KeyError):
        M.higher_is_better("no_such_metric")


# ---------------------------------------------------------------- encoding and batches


def test_encode_puts_bos_prompt_completion_eos():
    tok = char_tokenizer()
    e = encode(tok, "12+3=", "15", 32)
    assert e.ids == [BOS, digit(1), digit(2), PLUS, digit(3), EQ, digit(1), digit(5), EOS]
    assert e.loss_from == 6  # the first completion token, right after bos + 5 prompt tokens
    assert e == Encoded([1, 5, 6, 14, 7, 16, 5, 9, 2], 6)


def test_encode_plain_text_scores_everything_after_bos():
    tok = char_tokenizer()
    assert encode_texts(tok, ["7*8=56"], 32) == [
        Encoded([BOS, digit(7), TIMES, digit(8), EQ, digit(5), digit(6), EOS], 1)
    ]


def test_encode_length_limit():
    tok = char_tokenizer()
    assert len(encode(tok, "12+3=", "15", 9).ids) == 9  # exactly the context: fine
    with pytest.raises(ClbenchError, match=r"a sequence of 9 tokens exceeds the model context of 8"):
        encode(tok, "12+3=", "15", 8)


def test_collate_pads_and_masks_exactly():
    long = Encoded([1, 5, 6, 2], loss_from=2)  # scored: ids[2], ids[3]
    short = Encoded([1, 7, 2], loss_from=1)  # scored: ids[1], ids[2]
    ids, attention, target = collate([long, short], pad_id=0)
    assert ids.dtype == torch.long and attention.dtype == torch.long and target.dtype == torch.bool
    assert torch.equal(ids, torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]]))
    assert torch.equal(attention, torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))
    # target[b, t] says ids[b, t + 1] is scored
    assert torch.equal(target, torch.tensor([[False, True, True], [True, True, False]]))
    # what the training loss sees: the scored next tokens, in order
    assert ids[:, 1:][target].tolist() == [6, 2, 7, 2]


def test_collate_uses_the_given_pad_id():
    ids, attention, target = collate([Encoded([1, 2], 1), Encoded([1, 5, 5, 2], 3)], pad_id=9)
    assert ids.tolist() == [[1, 2, 9, 9], [1, 5, 5, 2]]
    assert attention.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert target.tolist() == [[True, False, False], [False, False, True]]


# ---------------------------------------------------------------- schedule and batch order


def test_warmup_cosine_values():
    f = warmup_cosine(2, 10)
    assert f(0) == 0.5  # (0 + 1) / 2
    assert f(1) == 1.0
    assert f(2) == 1.0  # progress 0: cos 0
    assert f(4) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)), abs=1e-15)  # progress 2/8
    assert f(6) == 0.5  # progress 1/2
    assert f(10) == 0.0  # progress 1: cos π
    assert f(15) == 0.0  # clamped past the end
    g = warmup_cosine(1, 5)  # the protocol's minimum warm-up of one step
    assert g(0) == 1.0
    assert g(1) == 1.0  # progress 0/4
    assert g(3) == 0.5  # progress 2/4
    assert g(5) == 0.0


def _stream(n, batch_size, steps, seed=0):
    batches = list(epoch_batches(n, batch_size, steps, torch.Generator().manual_seed(seed)))
    assert len(batches) == steps
    assert all(len(b) == batch_size for b in batches)
    return [i for b in batches for i in b]


@pytest.mark.parametrize("n, batch_size, steps", [(10, 4, 5), (8, 4, 6), (3, 4, 3), (7, 7, 3), (5, 2, 10)])
def test_epoch_batches_every_index_once_per_epoch(n, batch_size, steps):
    stream = _stream(n, batch_size, steps)
    complete = len(stream) // n
    for epoch in range(complete):
        assert sorted(stream[epoch * n : (epoch + 1) * n]) == list(range(n)), f"epoch {epoch}"
    # a trailing partial epoch repeats nothing
    tail = stream[complete * n :]
    assert len(set(tail)) == len(tail)
    assert Counter(stream) == Counter(dict.fromkeys(range(n), complete)) + Counter(tail)


def test_epoch_batches_deterministic_per_seed():
    assert _stream(10, 4, 5, seed=3) == _stream(10, 4, 5, seed=3)
    assert _stream(10, 4, 5, seed=3) != _stream(10, 4, 5, seed=4)
