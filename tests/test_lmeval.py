"""lm-eval in-process: agreement with clbench's own old-text loss, and the pitfalls of wrapping a live model.

Tiny random Llama over the character tokenizer; lm-eval runs on the shipped local task configs only
(no network, no lm-eval task index).
"""

import copy
import dataclasses
import importlib.metadata
import math

import pytest
import torch

from clbench.arith import char_tokenizer
from clbench.data import TRAINING, Encoded, TaskData, encode_texts, scored
from clbench.evaluate import score
from clbench.expand import expand
from clbench.lmeval import Checker
from clbench.tasks.arithmetic import Params, build
from clbench.testing import tiny_llama


def tiny_model(tokenizer, tied=False, seed=0):
    """clbench.testing's tiny Llama, twice as wide (32) with a context of 64."""
    return tiny_llama(tokenizer, tied=tied, hidden=32, positions=64, seed=seed)


@pytest.fixture(scope="module")
def data():
    return build(Params(n_test=10, n_old_skill=20, n_old_text=30, n_replay=0), char_tokenizer())


@pytest.fixture(scope="module")
def checker():
    return Checker(["clbench_old_text", "clbench_old_skill"], batch_size=16)


@pytest.fixture(scope="module")
def base_scores(data, checker):
    """lm-eval scores of tiny_model(seed 0) on `data`: each lm-eval call costs ~2 s, share it."""
    return checker.scores(tiny_model(char_tokenizer()), char_tokenizer(), data)


RULE = scored(eos_is_content=False)  # clbench's scoring rule for text: no first token from bos, no eos


def clbench_nll(model, tokenizer, texts, scoring=TRAINING) -> tuple[float, int, int]:
    """Σ NLL (full softmax), tokens scored and their bytes (scored_bytes) by clbench.evaluate.score under `scoring`."""
    encoded = encode_texts(tokenizer, texts, 64, scoring)
    scores = score(model, encoded, old_vocab=len(tokenizer), pad_id=tokenizer.pad_token_id, batch_size=64)
    return scores.nll_full, scores.n_full, sum(e.scored_bytes for e in encoded)


def lm_eval_nll(scores, n_bytes: int) -> float:
    """Σ NLL from lm-eval's bits_per_byte: bpb = Σ NLL / (scored bytes · ln 2)."""
    return scores["clbench_old_text", "bits_per_byte"]["value"] * n_bytes * math.log(2)


def test_old_text_is_scored_on_clbench_rule_first_token_as_context_and_no_eos(data, checker, base_scores):
    tokenizer = char_tokenizer()
    base = tiny_model(tokenizer)
    adapted, expanded = copy.deepcopy(base), copy.deepcopy(tokenizer)
    expand(adapted, expanded, ["<spec>"], init="random", seed=0)  # a new output row: full softmax ≠ old softmax
    for model, tok, scores in ((base, tokenizer, base_scores), (adapted, expanded, None)):
        scores = scores or checker.scores(model, tok, data)
        # the rule of a text task (no eos content): every token but the first (bos + it are context), no eos;
        # float32 (lm-eval) vs float64 (clbench) log-softmax, measured relative difference ~5e-9
        ours, n_tokens, n_bytes = clbench_nll(model, tok, data.old_text, RULE)
        assert n_tokens == n_bytes == sum(len(t) - 1 for t in data.old_text) == 204  # 30 texts, 234 characters
        assert lm_eval_nll(scores, n_bytes) == pytest.approx(ours, rel=1e-7)
        # arithmetic's own old-text loss also scores the eos after each equation (eos_is_content): the only difference
        with_eos, n_with_eos, _ = clbench_nll(model, tok, data.old_text, data.scoring)
        assert n_with_eos == n_tokens + len(data.old_text) and with_eos > ours
        # the rule before issue 37 (task version 1, lm-eval's loglikelihood_rolling): the first token from bos too
        everything, n_everything, _ = clbench_nll(model, tok, data.old_text)
        assert n_everything - len(data.old_text) == n_with_eos and everything > with_eos


def test_old_text_with_a_break_is_read_as_running_text_by_both(data, checker):
    """A text task's old text (old_text_break): each passage whole after the one before it and the break, in
    clbench and in lm-eval alike. The character tokenizer has no whitespace, so the break here is `=`: lm-eval moves
    a whitespace break into what it scores (TemplateLM._encode_pair), which clbench.lmeval counts with the text."""
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer)
    running = dataclasses.replace(data, old_text_break="=")
    scores = checker.scores(model, tokenizer, running)
    ours, n_tokens, n_bytes = clbench_nll(model, tokenizer, running.old_text, scored(False, "="))
    assert n_tokens == n_bytes == sum(len(t) for t in data.old_text) == 234  # every character, the first too
    assert lm_eval_nll(scores, n_bytes) == pytest.approx(ours, rel=3e-7)
    assert lm_eval_nll(scores, n_bytes) != pytest.approx(clbench_nll(model, tokenizer, data.old_text, RULE)[0])


def test_lm_eval_rolling_scores_the_first_token_from_the_prefix_token_alone():
    """Why clbench_old_text is not lm-eval's loglikelihood_rolling: its first window predicts every token, the first
    from the prefix token (bos) alone, and appends no eos."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    windows = [make_disjoint_window(w) for w in get_rolling_token_windows([5, 6, 7, 8, 9], 1, 3, 1)]
    # (context, scored): the first window scores 5 with only the prefix 1 before it; a later window has the text
    # before it as context; nothing after 9 (no eos)
    assert windows == [([1], [5, 6, 7]), ([6, 7], [8, 9])]


def test_old_skill_accuracy_is_clbench_exact_match_without_eos(data, base_scores):
    """lm-eval's greedy `acc` on the probe equals the teacher-forced exact match of the completion
    alone after [bos] prompt (lm-eval does not score the eos clbench appends)."""
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer)
    hits = []
    for e in data.old_skill:
        ids = torch.tensor(
            [[tokenizer.bos_token_id] + tokenizer.encode(e.prompt + e.completion, add_special_tokens=False)]
        )
        n = len(e.completion)
        with torch.no_grad():
            predicted = model(ids).logits[0, -n - 1 : -1].argmax(-1)
        hits.append(bool((predicted == ids[0, -n:]).all()))
    assert base_scores["clbench_old_skill", "acc"]["value"] == sum(hits) / len(hits)


def test_base_and_adapted_are_never_confused_and_base_scores_are_cached_per_base(data):
    """No response cache: a changed model gets its own numbers, an identical copy the same ones."""
    checker = Checker(["clbench_old_text"], batch_size=16)
    tokenizer = char_tokenizer()
    base = tiny_model(tokenizer)
    same, changed = copy.deepcopy(base), copy.deepcopy(base)
    with torch.no_grad():
        changed.model.layers[0].mlp.down_proj.weight.mul_(3)
    rows_same = checker.compare(base, tokenizer, ("b",), same, tokenizer, data)
    rows_changed = checker.compare(base, tokenizer, ("b",), changed, tokenizer, data)
    assert [r["delta"] for r in rows_same] == [0.0, 0.0, 0.0]
    assert all(r["delta"] != 0 for r in rows_changed)
    assert [r["base"] for r in rows_changed] == [r["base"] for r in rows_same]
    bits = {r["metric"]: r for r in rows_changed}["bits_per_byte"]
    for model, value in ((base, bits["base"]), (changed, bits["adapted"])):
        ours, _, n_bytes = clbench_nll(model, tokenizer, data.old_text, RULE)
        assert value * n_bytes * math.log(2) == pytest.approx(ours, rel=1e-7)
    assert {r["task_hash"] for r in rows_same + rows_changed} == {rows_same[0]["task_hash"]}
    version = importlib.metadata.version("lm_eval")
    assert [(r["metric"], r["task_version"], r["lm_eval_version"]) for r in rows_same] == [
        ("bits_per_byte", "3.0", version),
        ("byte_perplexity", "3.0", version),
        ("word_perplexity", "3.0", version),
    ]


def test_same_task_name_with_other_data_is_not_served_from_a_request_cache(data, checker, base_scores):
    """The local tasks keep their names across clbench tasks (and tokenizers keep theirs after expansion):
    with lm-eval's request cache on, the second data set would be answered with the first one's requests."""
    tokenizer = char_tokenizer()
    model = tiny_model(tokenizer)
    other = build(Params(n_test=10, n_old_skill=20, n_old_text=30, n_replay=0, data_seed=1), tokenizer)
    first, second = base_scores, checker.scores(model, tokenizer, other)
    assert first["clbench_old_text", "bits_per_byte"] != second["clbench_old_text", "bits_per_byte"]
    ours, _, n_bytes = clbench_nll(model, tokenizer, other.old_text, RULE)
    assert lm_eval_nll(second, n_bytes) == pytest.approx(ours, rel=1e-7)


def test_hflm_would_retie_an_untied_head_and_the_checker_puts_it_back(data, checker):
    tokenizer = char_tokenizer()
    model, expanded = tiny_model(tokenizer, tied=True), copy.deepcopy(tokenizer)
    expand(model, expanded, ["<spec>"], init="random", seed=0)
    # a method that unties on purpose: its own output matrix, new row moved, config still says "tied"
    head = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        head[-1] += 1.0
    model.lm_head.weight = head
    untied = copy.deepcopy(model)
    model.train()

    # the pitfall is real in this lm-eval/transformers: HFLM's tie_weights() re-ties the copy
    from lm_eval.models.huggingface import HFLM

    HFLM(pretrained=untied, tokenizer=expanded, batch_size=4)
    assert untied.lm_head.weight is untied.model.embed_tokens.weight

    scores = checker.scores(model, expanded, data)
    assert model.lm_head.weight is head and model.model.embed_tokens.weight is not head
    assert torch.equal(head[-1], model.model.embed_tokens.weight[-1] + 1.0)
    assert model.training  # restored after lm-eval's eval()
    ours, _, n_bytes = clbench_nll(model.eval(), expanded, data.old_text, RULE)
    assert lm_eval_nll(scores, n_bytes) == pytest.approx(ours, rel=1e-7)  # scored with the untied head


ENGLISH = [
    "The cat sat on the mat.",
    "A naïve café owner walked home.",
    "Forgetting is measured on old text, word by word.",
]


def english_tokenizer():
    """A small byte-level BPE trained on ENGLISH: tokens, bytes and words all differ in count."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        ENGLISH,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<pad>", "<bos>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def test_english_text_word_and_byte_perplexity_follow_from_clbench_nll():
    tokenizer = english_tokenizer()
    model = tiny_model(tokenizer)
    data = TaskData(new_tokens=[], train=[], target_test=[], old_text=ENGLISH, old_text_break=None)
    scores = Checker(["clbench_old_text"], batch_size=4).scores(model, tokenizer, data)
    nll, n_tokens, n_bytes = clbench_nll(model, tokenizer, ENGLISH, RULE)
    n_words = sum(len(t.split()) for t in ENGLISH)
    heads = [tokenizer.decode(tokenizer.encode(t, add_special_tokens=False)[:1]) for t in ENGLISH]
    # 47 tokens and 105 bytes in all ("naïve café": 2-byte characters); the first tokens, "The", "A", "For" (7 bytes),
    # are context; every word keeps a scored part, so the words are the texts' own (lm-eval counts " cat sat" as 2)
    assert heads == ["The", "A", "For"] and (n_tokens, n_bytes, n_words) == (47 - 3, 105 - 7, 21)
    value = lambda metric: scores["clbench_old_text", metric]["value"]
    assert value("bits_per_byte") == pytest.approx(nll / n_bytes / math.log(2), rel=1e-7)
    # exp multiplies the NLL's float32 relative error (~5e-8) by NLL / bytes (2.6 here): 1.3e-7 measured
    assert value("byte_perplexity") == pytest.approx(math.exp(nll / n_bytes), rel=3e-7)
    assert value("word_perplexity") == pytest.approx(math.exp(nll / n_words), rel=1e-6)


def test_a_whitespace_break_is_scored_by_lm_eval_and_not_by_clbench():
    """Running English text with the text tasks' break "\n\n": lm-eval moves a context's trailing whitespace into
    what it scores (TemplateLM._encode_pair), so its log-likelihood is clbench's plus the break's own tokens, and its
    bytes are the passages' plus two a passage."""
    tokenizer = english_tokenizer()
    model = tiny_model(tokenizer)
    data = TaskData(new_tokens=[], train=[], target_test=[], old_text=ENGLISH)  # the default break, "\n\n"
    scores = Checker(["clbench_old_text"], batch_size=4).scores(model, tokenizer, data)
    ours, n_tokens, n_bytes = clbench_nll(model, tokenizer, ENGLISH, scored(False, "\n\n"))
    assert (n_tokens, n_bytes) == (47, 105)  # every token and byte of every passage, the first too
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    with_break = [  # what lm-eval scores: the break and the passage, after bos and the passage before
        Encoded([tokenizer.bos_token_id, *encode(before), *encode("\n\n" + text)], 1 + len(encode(before)), 0)
        for before, text in zip(ENGLISH[-1:] + ENGLISH, ENGLISH)
    ]
    theirs = score(model, with_break, old_vocab=len(tokenizer), pad_id=tokenizer.pad_token_id, batch_size=4)
    assert theirs.n_full == n_tokens + 2 * len(ENGLISH)  # "\n" "\n": no merge for it in this BPE
    assert lm_eval_nll(scores, n_bytes + 2 * len(ENGLISH)) == pytest.approx(theirs.nll_full, rel=3e-7)
    assert theirs.nll_full > ours
