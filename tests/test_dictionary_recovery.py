"""Dictionary recovery: how well a learned new row's sparse decomposition reads back what the task
says the token means (clbench/explain.py), on hand-made embeddings with exact values.

    python -m pytest -q tests/test_dictionary_recovery.py
"""

import copy

import pytest
import torch

from clbench.arith import char_tokenizer
from clbench.data import TaskData
from clbench.explain import (
    centred,
    describe_rows,
    describe_truth,
    meaning_recovery,
    recover,
    recovery_metrics,
    word_ids,
)
from clbench.testing import tiny_base

# a, b, c, d; d = a + b
DICTIONARY = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])
NAMES = ["a", "b", "c", "d"]


def test_ranks_by_cosine_and_recall_among_the_omp_atoms():
    # x = 2·a + 3·c: cosines c .832, a .555, d .392, b 0; OMP with s = 2 picks c, then a
    first = recover(torch.tensor([2.0, 0, 3.0]), DICTIONARY, ["a", "b"], [0, 1])
    assert (first.ranks, first.chosen, first.recall) == ([2, 4], [True, False], 0.5)
    # y = b + 0.1·c: b nearest; a word that is not one token (None) is not scored
    second = recover(torch.tensor([0.0, 1.0, 0.1]), DICTIONARY, ["b", "zz"], [1, None])
    assert (second.ranks, second.chosen, second.recall) == ([1, None], [True, None], 1.0)
    unscored = recover(torch.tensor([1.0, 0, 0]), DICTIONARY, ["zz"], [None])
    assert unscored.recall is None
    # recall: mean over tokens with a scored word (0.5, 1.0); ranks: median of 2, 4, 1
    assert recovery_metrics([first, second, unscored]) == {
        "meaning_words_scored": 3.0,
        "meaning_recall_at_s": 0.75,
        "meaning_rank_median": 2,
    }
    assert recovery_metrics([unscored]) == {"meaning_words_scored": 0.0}
    assert (
        describe_truth(first, NAMES)
        == "truth (centred): 'a' ('a') rank 2 ✓, 'b' ('b') rank 4; recall@2 0.50; chance rank 2.5"
    )
    assert describe_truth(second, NAMES) == (
        "truth (centred): 'b' ('b') rank 1 ✓, 'zz' not one token; recall@2 1.00; chance rank 2.5"
    )


def test_a_rank_counts_only_strictly_closer_rows():
    # to a + b: d is nearest (cosine 1); a and b tie behind it (1/√2), and both rank 2
    found = recover(torch.tensor([1.0, 1.0, 0.0]), DICTIONARY, ["a", "b", "d"], [0, 1, 3])
    assert found.ranks == [2, 2, 1]


def test_a_true_word_is_one_base_token_or_not_scored():
    tokenizer = char_tokenizer()  # characters: '*' is one token, ' *' and '12' are two
    star = tokenizer.convert_tokens_to_ids("*")
    assert word_ids(tokenizer, ["*", "12"], whole_words=False) == [star, None]
    assert word_ids(tokenizer, ["*"], whole_words=True) == [None]  # the leading space makes it two


def test_explain_prints_the_truth_under_the_decomposition():
    rows = torch.tensor([[2.0, 0, 3.0], [0.0, 1.0, 0.1]])
    lines = describe_rows(
        rows, ["<x>", "<y>"], DICTIONARY, NAMES, s=1, k=1, meaning={"<x>": ["a", "b"]}, truth={"<x>": [0, 1]}
    )
    assert lines[:3] == [
        "<x>  nearest (cosine): 'c' 0.832",
        "     ≈ 3·'c'   (residual 0.555)",
        # centred (mean row [.5, .5, .25]): cosines c .478, a .131, d −.079, b −.709; OMP (|cosine|)
        # chooses b first (with a negative weight), then a
        "     truth (centred): 'a' ('a') rank 2 ✓, 'b' ('b') rank 4 ✓; recall@2 1.00; chance rank 2.5",
    ]
    assert len(lines) == 5  # <y> has no known meaning: no truth line


def test_meaning_recovery_of_an_adapted_model():
    base = tiny_base(tied=False)
    model = copy.deepcopy(base.model)
    old = len(base.tokenizer)
    model.resize_token_embeddings(old + 2)
    star = base.tokenizer.convert_tokens_to_ids("*")
    with torch.no_grad():  # a large common component, as SmolLM2's rows have: raw cosine sees only it
        base.model.get_input_embeddings().weight += 1.0
    rows, mean = centred(base.model.get_input_embeddings().weight)
    row = mean + 0.1 * rows[star]  # the mean row plus a tenth of '*''s centred row: '*' in the centred space
    with torch.no_grad():
        model.get_input_embeddings().weight[old] = row.float()
    assert recover(row, base.model.get_input_embeddings().weight, ["*"], [star]).ranks == [4]  # uncentred
    data = TaskData(["<m>", "<n>"], [], [], [], meaning={"<m>": ["*"], "<n>": ["12"]})
    assert meaning_recovery(base, model, data) == {
        "meaning_words_scored": 1.0,  # '12' is two characters: not scored
        "meaning_recall_at_s": 1.0,
        "meaning_rank_median": 1,
    }
    assert meaning_recovery(base, model, TaskData(["<m>"], [], [], [])) == {}  # no meaning known


@pytest.mark.parametrize("whole_words", [False, True])
def test_a_rows_file_keeps_the_truth_for_explain(tmp_path, whole_words):
    from clbench.explain import load_meaning, save_new_rows

    base = tiny_base(tied=False)
    path = tmp_path / "rows.safetensors"
    save_new_rows(path, base.model, len(base.tokenizer) - 1, ["<m>"], {"<m>": ["*"]}, whole_words)
    assert load_meaning(path) == ({"<m>": ["*"]}, whole_words)


def test_centred_an_untrained_row_reads_at_chance():
    """A row at the mean plus noise v and its mirror (mean − v) rank every word at V + 1 in sum,
    so at (V + 1) / 2 on average: chance. Uncentred, both sit near the mean and rank alike."""
    base = tiny_base(tied=False)
    weight = base.model.get_input_embeddings().weight.detach().double()
    rows, mean = centred(weight)
    noise = 1e-6 * torch.randn(weight.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    words, ids = ["*", "1"], [base.tokenizer.convert_tokens_to_ids(w) for w in ["*", "1"]]
    up, down = (recover(sign * noise, rows, words, ids) for sign in (1, -1))
    assert [a + b for a, b in zip(up.ranks, down.ranks)] == [len(weight) + 1] * 2
    raw_up, raw_down = (recover(mean + sign * noise, weight, words, ids) for sign in (1, -1))
    assert raw_up.ranks == raw_down.ranks  # uncentred: the mean's ranks, whatever the noise
