"""Greedy use of the new tokens: recall where the reference has one, false use on old text, and a few
free-running continuations per run stored beside its numbers and shown on the leaderboard."""

from __future__ import annotations

import dataclasses

import torch
from leaderboard_db import EVIL, record

from clbench import metrics as M
from clbench.data import Example, encode_examples, encode_texts
from clbench.evaluate import score
from clbench.method import methods
from clbench.protocol import GENERATED_TOKENS, adapt_and_evaluate, run_one
from clbench.report.format import esc
from clbench.report.leaderboard import build
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import Budget, load_tasks
from clbench.testing import expanded, small_raw, tiny_base, tiny_data, tiny_plan, write_task_file

NEW = range(10, 12)


def test_recall_asks_the_prediction_before_each_new_token_for_that_very_token():
    ids = torch.tensor([0, 5, 10, 6, 11, 10, 12])  # 12: past the new range, an old token here
    argmax = torch.tensor([5, 10, 7, 10, 10, 12, 3])  # argmax[i] predicts ids[i + 1]; the last predicts nothing
    predicted, targets = argmax[:-1], ids[1:]
    # ids[2] = 10 after argmax 10: recalled; ids[4] = 11 after 10: another new token, not recalled; ids[5] = 10 after 10
    assert M.new_token_recall(predicted, targets, NEW) == (2, 3)
    assert M.new_token_emissions(predicted, NEW) == 3  # 10 at positions 1, 3 and 4; 12 is no new token
    assert M.new_token_recall(torch.tensor([1, 2]), torch.tensor([3, 4]), NEW) == (0, 0)
    assert M.new_token_emissions(torch.tensor([1, 2, 12]), NEW) == 0


@torch.no_grad()
def with_bias(model, bias: float):
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    biased.weight.copy_(head.weight)
    biased.bias.zero_()
    biased.bias[-1] = bias
    model.set_output_embeddings(biased)
    return model


# tiny_data's target examples read <spec> in the prompt; the last one holds it in the completion (as xling does)
EXAMPLES = tiny_data().target_test + [Example("1+", "2<spec>3=6")]


def counts(model, tokenizer, old_vocab: int) -> tuple[int, int, int, int]:
    """(occurrences, recalled, emitted, scored positions) worked out from whole-sequence logits, one example at a time."""
    occurrences = recalled = emitted = scored = 0
    for e in encode_examples(tokenizer, EXAMPLES, 32):
        with torch.no_grad():
            argmax = model(input_ids=torch.tensor([e.ids])).logits[0].argmax(-1)
        hit, seen = M.new_token_recall(argmax[:-1], torch.tensor(e.ids[1:]), range(old_vocab, len(tokenizer)))
        occurrences, recalled = occurrences + seen, recalled + hit
        emitted += M.new_token_emissions(argmax[e.loss_from - 1 : -1], range(old_vocab, len(tokenizer)))
        scored += len(e.ids) - e.loss_from
    return occurrences, recalled, emitted, scored


def test_score_counts_new_tokens_in_prompts_and_completions_as_whole_sequence_logits_do():
    base = tiny_base(tied=False)
    model, tokenizer, _ = expanded(base)
    old = len(base.tokenizer)
    # a bias putting <spec> first at about half the positions: the counts are neither 0 nor everything
    encoded = encode_examples(tokenizer, EXAMPLES, 32)
    with torch.no_grad():
        logits = torch.cat([model(input_ids=torch.tensor([e.ids])).logits[0] for e in encoded])
    with_bias(model, float((logits[:, :old].max(-1).values - logits[:, old]).median()))
    occurrences, recalled, emitted, scored = counts(model, tokenizer, old)
    assert occurrences == 4 and 0 < recalled < 4 and 0 < emitted < scored

    scores = score(model, encoded, old_vocab=old, pad_id=tokenizer.pad_token_id, batch_size=2)
    assert (scores.new_occurrences, scores.new_recalled, scores.new_emitted, scores.n_full) == counts(
        model, tokenizer, old
    )


def test_a_model_made_to_emit_the_new_token_recalls_and_misuses_it_everywhere():
    base = tiny_base(tied=False)
    model, tokenizer, _ = expanded(base)
    with_bias(model, 1e4)
    old, pad = len(base.tokenizer), tokenizer.pad_token_id
    target = score(model, encode_examples(tokenizer, EXAMPLES, 32), old_vocab=old, pad_id=pad, batch_size=2)
    assert (target.new_occurrences, target.new_recalled) == (4, 4)
    old_text = score(
        model, encode_texts(base.tokenizer, tiny_data().old_text, 32), old_vocab=old, pad_id=pad, batch_size=2
    )
    assert old_text.new_emitted == old_text.n_full == 6 + 7 + 8  # every position after bos, eos included
    assert old_text.new_occurrences == 0


class Emitting:
    """A method's adapter whose finished model's head puts <spec> first everywhere (a bias of 1e4)."""

    def __init__(self, adapter):
        self.adapter, self.param_groups = adapter, adapter.param_groups

    def finalize(self):
        return with_bias(self.adapter.finalize(), 1e4)


def emitting_run(name: str):
    spec = methods().get(name)
    emitting = dataclasses.replace(spec, setup=lambda *a: Emitting(spec.setup(*a)))
    budget = Budget(n_train=6, steps=1, batch_size=4, eval_batch_size=2)
    return adapt_and_evaluate(tiny_plan(tiny_base(False), tiny_data(), emitting, budget), session=Session())


def test_a_method_under_the_full_softmax_emits_what_its_head_puts_first_and_et_never_does():
    fft = emitting_run("fft")
    assert (fft.values["new_token_recall"], fft.values["new_token_false_use"]) == (1.0, 1.0)
    # ET trains under p(u | ·) = 0 and decodes over V: the very same head emits nothing
    et = emitting_run("et")
    assert (et.values["new_token_recall"], et.values["new_token_false_use"]) == (0.0, 0.0)
    # three target examples cut before their <spec>, two old texts cut at half (bos 1 + | 2 = 3 eos: 3 of 7)
    assert [(g[0], g[1], g[2]) for g in fft.generations] == [
        (0, "target", "<bos> 2"),
        (1, "target", "<bos> 8"),
        (2, "target", "<bos> 1 1"),
        (3, "old_text", "<bos> 1 +"),
        (4, "old_text", "<bos> 4 * 5"),
    ]
    assert [g[4] for g in fft.generations] == ["<spec> 3 = 6 <eos>", "<spec> 7 = 5 6 <eos>", "<spec> 4 = 4 4 <eos>",
                                               "2 = 3 <eos>", "= 2 0 <eos>"]  # fmt: skip
    assert all(g[3] == " ".join(["<spec>"] * GENERATED_TOKENS) and g[5] == GENERATED_TOKENS for g in fft.generations)
    assert [g[:3] + g[4:5] for g in et.generations] == [g[:3] + g[4:5] for g in fft.generations]
    assert all(g[5] == 0 and "<spec>" not in g[3] for g in et.generations)


def false_use(base, data, model) -> float:
    """Of the old text's scored positions (after bos, eos included), the share whose argmax over the whole
    expanded vocabulary is a new token, worked out from whole-sequence logits one text at a time."""
    old_vocab, emitted, scored = len(base.tokenizer), 0, 0
    for e in encode_texts(base.tokenizer, data.old_text, base.max_length):
        with torch.no_grad():
            argmax = model(input_ids=torch.tensor([e.ids])).logits[0, e.loss_from - 1 : -1].argmax(-1)
        emitted, scored = emitted + int((argmax >= old_vocab).sum()), scored + len(argmax)
    return emitted / scored


def test_a_run_stores_its_generations_with_it_and_the_leaderboard_shows_them(tmp_path, tiny_builtin):
    task = load_tasks([write_task_file(tmp_path / "tasks", raw=small_raw()).parent]).get("small")
    store, adapted = Store(tmp_path / "r.duckdb"), {}
    outcome = run_one(
        task,
        methods().get("fft"),
        seed=0,
        store=store,
        session=Session(),
        model=tiny_builtin,
        on_adapted=lambda base, data, model, tokenizer: adapted.update(base=base, data=data, model=model),
    )
    assert outcome.status == "finished"
    # fft's three steps train on completions that never hold <spec>: nowhere on old text is it put first
    recomputed = false_use(**adapted)
    assert outcome.metrics["new_token_false_use"] == recomputed == 0.0
    stored = store.query("SELECT * FROM generations ORDER BY number")
    assert stored.run_id.unique().tolist() == [outcome.run_id]
    assert stored.source.tolist() == ["target"] * 3 + ["old_text"] * 2
    assert stored.reference[:3].str.startswith("<spec>").all()  # cut right before the prompt's operator

    # every string escaped: a generation's text comes from a model and a task file
    record(
        store, "evil", "small", "et", "tiny", 0, {"target_acc": 0.5}, generations=[(0, "target", EVIL, EVIL, EVIL, 0)]
    )
    record(
        store, "evil", "small", "et", "tiny", 0, {"target_acc": 0.5}, generations=[(0, "old_text", EVIL, "x", EVIL, 1)]
    )
    assert store.query("SELECT source FROM generations WHERE run_id = 'evil'").source.tolist() == ["old_text"]
    page = (build(store.path, tmp_path / "out") / "index.html").read_text(encoding="utf-8")
    assert EVIL not in page and "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page
    shown = page.split("<summary>generations</summary>")
    assert len(shown) == 3 and "<td>x</td>" in page
    assert f"<td>{esc(stored.generated[0])}</td>" in page
