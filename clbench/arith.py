"""Arithmetic written in characters: the operand pairs, the split the base model trains on, and the tokenizer.

The local arithmetic base model (clbench/arith_llama.py) learns addition (a, b in 0–99) and
multiplication (a in 0–99, b in 0–9) on a fixed 70% of the multiplication pairs; the arithmetic
tasks (tasks/arithmetic.py, tasks/sequential.py) test a new operator on pairs the base saw with `*`
and on pairs it did not, and draw their old text from the same pairs. Both read them here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from clbench.data import Example

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+*=")
ADD_PAIRS = [(a, b) for a in range(100) for b in range(100)]
MUL_PAIRS = [(a, b) for a in range(100) for b in range(10)]
MUL_SEEN_FRACTION = 0.7
SPLIT_SEED = 1234


def mul_pairs_seen() -> set[tuple[int, int]]:
    """The multiplication pairs in the base model's training data; the rest it never saw."""
    pairs = list(MUL_PAIRS)
    random.Random(SPLIT_SEED).shuffle(pairs)
    return set(pairs[: int(MUL_SEEN_FRACTION * len(pairs))])


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


@dataclass(frozen=True)
class Draw:
    """One data seed's draw for the arithmetic tasks, with the old vocabulary alone (`+`, `*`)."""

    mul_pairs: list[tuple[int, int]]  # every multiplication pair, shuffled: a task cuts its test and pool from it
    old_text: list[str]
    old_skill: list[Example]  # addition prompts and their values
    replay_text: list[str]  # expressions outside old_text and old_skill: rehearsal never sees what is evaluated
    validation_old_text: list[str]  # the next ones after replay_text, for `clbench tune`


def draw(
    template: str, *, data_seed: int, n_old_text: int, n_old_skill: int, n_replay: int, n_validation_old: int = 0
) -> Draw:
    """template: the prompt, e.g. "{a}{op}{b}="; one random stream per data seed, in a fixed order."""
    rng = random.Random(data_seed)
    ex = lambda a, op, b, value: Example(template.format(a=a, op=op, b=b), str(value))
    pairs = list(MUL_PAIRS)
    rng.shuffle(pairs)
    half = n_old_text // 2
    old_text = [ex(a, "+", b, a + b) for a, b in rng.sample(ADD_PAIRS, half)]
    old_text += [ex(a, "*", b, a * b) for a, b in rng.sample(MUL_PAIRS, n_old_text - half)]
    old_skill = [ex(a, "+", b, a + b) for a, b in rng.sample(ADD_PAIRS, n_old_skill)]
    evaluated = {e.prompt for e in old_text + old_skill}
    replay = [ex(a, "+", b, a + b) for a, b in ADD_PAIRS] + [ex(a, "*", b, a * b) for a, b in MUL_PAIRS]
    replay = [e for e in replay if e.prompt not in evaluated]
    rng.shuffle(replay)
    return Draw(
        mul_pairs=pairs,
        old_text=[e.prompt + e.completion for e in old_text],
        old_skill=old_skill,
        replay_text=[e.prompt + e.completion for e in replay[:n_replay]],
        validation_old_text=[e.prompt + e.completion for e in replay[n_replay : n_replay + n_validation_old]],
    )
