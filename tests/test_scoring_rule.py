"""What is scored: a position whose target is text the task is about. A first token predicted from bos alone and an
eos appended to a cut window are the window's format and are not scored (clbench/data.py, docs/metrics.md); the
new tokens' own transitions are measured at the positions around them (after_new_loss, new_token_loss)."""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch

from clbench import metrics as M
from clbench.arith import char_tokenizer
from clbench.data import TRAINING, Encoded, Example, TaskData, encode, encode_texts, scored
from clbench.errors import ClbenchError
from clbench.evaluate import score
from clbench.expand import expand
from clbench.method import methods
from clbench.models import Base, fingerprint
from clbench.protocol import adapt_and_evaluate, base_reading
from clbench.session import Session
from clbench.taskspec import Budget
from clbench.testing import tiny_base, tiny_plan
from clbench.train import train

TOKENIZER = char_tokenizer()
BOS, EOS = TOKENIZER.bos_token_id, TOKENIZER.eos_token_id
ID = TOKENIZER.get_vocab()


def ids(text: str) -> list[int]:
    return [ID[c] for c in text]


def test_encode_scores_exactly_the_positions_the_rule_names():
    cut = scored(eos_is_content=False)
    # plain text: the first token is read from bos alone (context), the appended eos is not there to predict
    assert encode(TOKENIZER, "", "12+3", 32, cut) == Encoded([BOS, *ids("12+3")], 2, 3)
    # a prompt: every completion token is scored, and an eos that is content with them
    assert encode(TOKENIZER, "1+2=", "3", 32, scored(eos_is_content=True)) == Encoded([BOS, *ids("1+2=3"), EOS], 5, 1)
    assert encode(TOKENIZER, "1+2=", "34", 32, cut) == Encoded([BOS, *ids("1+2=34")], 5, 2)
    # training reads every position, as before: bos + text + eos, the loss from the first token on
    assert (
        encode(TOKENIZER, "", "12+3", 32)
        == encode(TOKENIZER, "", "12+3", 32, TRAINING)
        == Encoded([BOS, *ids("12+3"), EOS], 1)
    )
    # a one-token text leaves nothing to score
    assert encode(TOKENIZER, "", "7", 32, cut) == Encoded([BOS, ID["7"]], 2, 0)


def test_old_text_is_read_as_running_text_each_passage_after_the_one_before_it():
    """A task with an old_text_break scores every token of each passage, after bos, the passage before it (the last,
    for the first) and the break as unscored context; no eos is appended unless it is content."""
    rule = scored(eos_is_content=False, old_text_break="=")
    texts = ["12+3", "4*5", "7"]
    read = encode_texts(TOKENIZER, texts, 32, rule)
    assert read == [
        Encoded([BOS, *ids("7="), *ids("12+3")], 3, 4),
        Encoded([BOS, *ids("12+3="), *ids("4*5")], 6, 3),
        Encoded([BOS, *ids("4*5="), *ids("7")], 5, 1),
    ]
    scores = score(tiny_base(tied=False).model, read, old_vocab=len(TOKENIZER), pad_id=0, batch_size=2)
    assert scores.n_full == scores.n_bytes == 4 + 3 + 1  # every character of every passage, none of the context
    assert scores.position_target[scores.position_example.argsort(stable=True)].tolist() == ids("12+34*57")
    # the context loses its oldest tokens past max_length; the passage is never cut
    assert encode_texts(TOKENIZER, texts, 6, rule)[1] == Encoded([BOS, *ids("3="), *ids("4*5")], 3, 3)
    # an eos that is content follows each passage
    assert encode_texts(TOKENIZER, texts, 32, scored(True, "="))[2] == Encoded([BOS, *ids("4*5=7"), EOS], 5, 1)
    # a passage with no other before it, and a task without a break (arithmetic), read each alone after bos
    assert encode_texts(TOKENIZER, ["12+3"], 32, rule) == [Encoded([BOS, *ids("12+3")], 2, 3)]
    alone = scored(eos_is_content=False)
    assert encode_texts(TOKENIZER, texts, 32, alone) == [encode(TOKENIZER, "", t, 32, alone) for t in texts]


def test_scored_bytes_leave_out_the_bytes_of_the_token_read_as_context():
    class Words:  # a slow tokenizer of whole words: the bytes come from decoding the skipped token
        is_fast, bos_token_id, eos_token_id = False, 0, 1
        vocab = {"¡hola": 2, " señor": 3}

        def encode(self, text, add_special_tokens=False):
            return [self.vocab[w] for w in ("¡hola", " señor") if w in text]

        def decode(self, token_ids):
            return "".join(w for w, i in self.vocab.items() if i in token_ids)

    text = "¡hola señor"
    assert encode(Words(), "", text, 8, scored(False)).scored_bytes == len(" señor".encode()) == 7
    assert encode(Words(), "¡hola", " señor", 8, scored(False)).scored_bytes == 7  # a completion: all its bytes
    assert len(text.encode()) == 13


def test_score_counts_the_scored_positions_and_their_bytes():
    base = tiny_base(tied=False)
    texts = ["12+3", "4*5=20", "7"]
    cut = encode_texts(base.tokenizer, texts, 32, scored(False))
    scores = score(base.model, cut, old_vocab=len(base.tokenizer), pad_id=0, batch_size=2)
    assert scores.n_full == scores.n_old == 3 + 5 + 0
    assert scores.n_bytes == 3 + 5 + 0
    # per position: example, index in the completion (from loss_from), target
    order = scores.position_example.argsort(stable=True)
    assert scores.position_example[order].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    assert scores.position_index[order].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert scores.position_target[order].tolist() == ids("2+3") + ids("*5=20")
    assert scores.position_since_new.tolist() == [0] * 8  # no new token anywhere
    assert scores.example_n_old.tolist() == [3, 5, 0]


def windows(n: int, rng: random.Random, width: int = 10) -> list[str]:
    """Cut windows of running "text": `width` characters of a stream with a regularity (a digit, then an operator)."""
    stream = "".join(rng.choice("0123456789") + rng.choice("+*=") for _ in range(width * n))
    return [stream[i * width : (i + 1) * width] for i in range(n)]


def knowing_base() -> Base:
    """The tiny model taught the stream on windows of 20 characters: it knows the text, not the 10-character
    windows' format (where their eos comes)."""
    base = tiny_base(tied=False)
    long = encode_texts(base.tokenizer, windows(256, random.Random(1), width=20), 32)
    params = [{"params": list(base.model.parameters())}]
    train(base.model, params, long, steps=150, batch_size=16, lr=1e-2, seed=0, pad_id=0)
    return Base("tiny-knowing", base.model.eval(), base.tokenizer, fingerprint(base.model))


def test_a_format_only_fine_tune_moves_old_text_forgetting_no_more_than_its_content_positions():
    """The control that adds no token, trained on its task's own windows (bos + 10 characters + eos, every
    position), learns their format: that an eos comes after ten characters. Under the scoring rule old-text
    forgetting moves exactly as the loss at the content positions does, each window read after the one before it
    (running text: consecutive cuts of one stream, so no break): worse, as a model taught to stop after ten
    characters reads text that goes on. Scored over every position of each window alone (the rule before it) the
    same fine-tune reads as an improvement, the appended eos carrying it."""
    rng = random.Random(0)
    data = TaskData(
        new_tokens=["<spec>"],
        train=[Example("", w) for w in windows(64, rng)],
        target_test=[Example("", w) for w in windows(8, rng)],
        old_text=windows(16, rng),
        old_text_break="",
    )
    control, base = methods().get("nonew"), knowing_base()
    adapted = {}
    budget = Budget(n_train=64, steps=60, batch_size=16, eval_batch_size=16)
    plan = tiny_plan(base, base_reading(None, control, data), control, budget, control.config({"lr": 3e-3}))
    result = adapt_and_evaluate(plan, session=Session(), on_adapted=lambda b, d, model, t: adapted.update(model=model))

    def per_position(model, windows: list[list[int]]) -> torch.Tensor:  # [windows, positions]: NLL of each target
        batch = torch.tensor(windows)
        with torch.no_grad():
            logits = model(input_ids=batch).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none").double()

    def change(windows: list[list[int]]) -> torch.Tensor:  # per position, mean over the windows
        return (per_position(adapted["model"], windows) - per_position(base.model, windows)).mean(0)

    texts = data.old_text
    running = change([[BOS, *ids(before), *ids(t)] for before, t in zip(texts[-1:] + texts, texts)])
    content = running[10:].mean().item()  # the text's 10 characters, each after the 10 before it
    assert result.values["forgetting_oldvocab"] == pytest.approx(content, abs=1e-6)
    alone = change([[BOS, *ids(t), EOS] for t in texts])  # 0 from bos alone, 1-9 the text, 10 the appended eos
    every_position = alone.mean().item()  # the rule before: bos → first token and the eos averaged in
    # measured: the running text +4.07 (worse: the control learned to stop after ten characters, and running text
    # goes on), the appended eos −7.44, every position alone −0.640: the rule before read "remembers better"
    assert content > 1.0 and alone[10] < -5.0
    assert every_position < 0 < content


def test_after_new_loss_reads_the_targets_after_each_new_token_and_the_references_at_the_same_positions():
    base = tiny_base(tied=False)
    model, tokenizer = base.own_model(), copy.deepcopy(base.tokenizer)
    torch.manual_seed(0)
    expand(model, tokenizer, ["<spec>"], init="random", seed=0)
    new = len(base.tokenizer)
    rule = scored(eos_is_content=True)
    target = [Encoded([BOS, *ids("12"), new, *ids("3="), *ids("36"), EOS], 6, 3)]  # prompt 12<spec>3=, 36
    expanded = score(model, target, old_vocab=new, pad_id=0, batch_size=1)
    # targets 3 6 <eos> at indices 6 7 8: 3, 4, 5 tokens after <spec> (index 3)
    assert expanded.position_since_new.tolist() == [3, 4, 5]
    assert expanded.new_occurrences == 1  # <spec> in the prompt, predicted from "12"
    nll = expanded.position_nll_old
    assert M.after_new_losses(expanded) == {
        "after_new_loss": nll[:2].mean().item(),
        "after_new_loss_3": nll[0].item(),
        "after_new_loss_4": nll[1].item(),
    }
    # the oracle reads `*` where <spec> stood: the same completion, matched by example and index
    oracle = score(
        base.model,
        [encode(base.tokenizer, "12*3=", "36", 32, rule)],
        old_vocab=new,
        pad_id=0,
        batch_size=1,
    )
    assert M.after_new_reference(expanded, oracle) == oracle.position_nll_old[:2].mean().item()
    # a reading whose targets differ there is no reference at the same positions
    other = score(base.model, [encode(base.tokenizer, "12*3=", "47", 32, rule)], old_vocab=new, pad_id=0, batch_size=1)
    assert M.after_new_reference(expanded, other) is None


def test_since_new_counts_from_the_latest_new_token_inside_a_completion():
    base = tiny_base(tied=False)
    model, tokenizer = base.own_model(), copy.deepcopy(base.tokenizer)
    expand(model, tokenizer, ["<a>", "<b>"], init="random", seed=0)
    a, b = len(base.tokenizer), len(base.tokenizer) + 1
    # bos 1 <a> 2 3 <b> 4: plain text, the first token read from bos
    text = Encoded([BOS, ID["1"], a, ID["2"], ID["3"], b, ID["4"]], 2, 0)
    scores = score(model, [text], old_vocab=a, pad_id=0, batch_size=1)
    assert scores.position_target.tolist() == [a, ID["2"], ID["3"], b, ID["4"]]
    assert scores.position_since_new.tolist() == [0, 1, 2, 3, 1]
    assert scores.new_occurrences == 2
    nll_full = scores.position_nll_full
    assert scores.new_nll_full == pytest.approx((nll_full[0] + nll_full[3]).item())
    values = M.after_new_losses(scores)
    assert values["after_new_loss_1"] == pytest.approx(
        (scores.position_nll_old[1] + scores.position_nll_old[4]).item() / 2
    )
    assert values["after_new_loss"] == pytest.approx(scores.position_nll_old[[1, 2, 4]].mean().item())


def test_the_control_reads_the_task_without_its_new_tokens():
    control = methods().get("nonew")
    data = TaskData(
        new_tokens=["<spec>"],
        train=[Example("1<spec>2=", "2")],
        target_test=[Example("3<spec>4=", "12")],
        old_text=["1+1=2"],
        train_oracle=[Example("1*2=", "2")],
        meaning={"<spec>": ["*"]},
    )
    read = base_reading(None, control, data)
    assert (read.new_tokens, read.train, read.train_oracle, read.meaning) == ([], data.train_oracle, [], {})
    assert read.target_test == data.target_test and read.old_text == data.old_text
    plain = dataclasses.replace(data, train_oracle=[], meaning={})
    assert base_reading(None, control, plain).train == data.train  # xling: the language's text as it is
    staged = dataclasses.replace(data, stages=[object()])
    task = type("T", (), {"name": "sequential"})()
    with pytest.raises(ClbenchError, match="adds no token, and the stages of task 'sequential'"):
        base_reading(task, control, staged)
