"""What a distilling method's teacher reads (baselines/distill.py), and which of its positions it compares.

The student is a training example as the run reads it: the expanded tokenizer's ids, each new token one
position. The teacher is the same example as the base model reads it, each new token replaced by what it
stands for (`source`):

- "train_oracle": the task's `train_oracle`, the example with each new token written as what it stands for
  there (pseudowords: the word its pseudo-word replaced in that sentence; arithmetic: `*`);
- "meaning": the one word each new token has in the task's `meaning` (sequential: `<spec>` is `*`);
- "pieces": the new token's own sub-word pieces, as the base tokenizer reads its string, where the task knows
  no meaning (no `meaning`, no `target_oracle`): its new tokens are spelled as what they mean (xling's words).

A task that knows its tokens stand for something else but not what each training example's stands for (a
`target_oracle` alone, or a token of several words and no `train_oracle`) is refused.

Positions compared, as in the reference implementation (konstantinjdobler/token-distillation,
`train_loop.py`, `transform_input_token_format`): every student position with the teacher position that has
read the same text, an old token with itself and a new token with the last of the pieces it replaces. A
train_oracle reading is aligned by its one differing span: the common head and tail, and the span's last
positions (the same pairs where the example holds one new token).
"""

from __future__ import annotations

from dataclasses import dataclass

from clbench.data import Encoded, Stage, TaskData, encode_examples
from clbench.errors import ClbenchError
from clbench.expand import spelled


@dataclass(frozen=True)
class Reading:
    student: list[int]  # the example as train() feeds it
    teacher: list[int]  # as the base reads it, each new token replaced by what it stands for
    student_at: list[int]  # positions compared: student_at[k] of the student with teacher_at[k] of the teacher
    teacher_at: list[int]


def source(data: TaskData, task: str = "this task") -> str:
    """What the teacher reads in each new token's place (module docstring); ClbenchError where the task cannot say."""
    if data.train_oracle:
        return "train_oracle"
    if data.meaning:
        several = next((t for t in data.new_tokens if len(data.meaning.get(t, [])) != 1), None)
        if several is None:
            return "meaning"
        raise ClbenchError(
            f"task {task!r}: new token {several!r} stands for {len(data.meaning.get(several, []))} words "
            "(meaning) and the task has no train_oracle saying which one each training example means: "
            "a distilling method's teacher cannot read it"
        )
    if data.target_oracle:
        raise ClbenchError(
            f"task {task!r} says what its new tokens stand for in its target examples (target_oracle) but not "
            "in its training examples (no train_oracle, no meaning): a distilling method's teacher cannot read them"
        )
    return "pieces"


def readings(tokenizer, data: TaskData, stage: Stage, student: list[Encoded], max_length: int) -> list[Reading]:
    """tokenizer: the base's; student: the stage's first len(student) training examples as train() reads them."""
    kind = source(data)
    if kind == "train_oracle":  # a plain task: its one stage's train is data.train
        oracle = encode_examples(tokenizer, data.train_oracle[: len(student)], max_length)
        return [aligned(s.ids, t.ids) for s, t in zip(student, oracle)]
    # expand() gives U the ids after |V|, in the task's order
    pieces = {
        len(tokenizer) + data.new_tokens.index(token): spelled(
            tokenizer, data.meaning[token][0] if kind == "meaning" else token, whole_words=data.whole_word_tokens
        )
        for token in stage.new_tokens
    }
    read = [substituted(s.ids, pieces) for s in student]
    longest = max(len(r.teacher) for r in read)
    if longest > max_length:
        raise ClbenchError(f"a teacher reading of {longest} tokens exceeds the model context of {max_length}")
    return read


def substituted(student: list[int], pieces: dict[int, list[int]]) -> Reading:
    """Each new token (a key of pieces) replaced by its pieces; every student position compared."""
    teacher, teacher_at = [], []
    for token in student:
        teacher += pieces.get(token, [token])
        teacher_at.append(len(teacher) - 1)
    return Reading(student, teacher, list(range(len(student))), teacher_at)


def aligned(student: list[int], teacher: list[int]) -> Reading:
    """Two readings of one text that differ in one span: their common head and tail, and the span's last
    positions, compared (each has read the same text up to there)."""
    shortest = min(len(student), len(teacher))
    head = next((i for i in range(shortest) if student[i] != teacher[i]), shortest)
    tail = next((i for i in range(shortest - head) if student[-1 - i] != teacher[-1 - i]), shortest - head)
    student_end, teacher_end = len(student) - tail, len(teacher) - tail  # the spans [head, *_end) differ
    student_at, teacher_at = list(range(head)), list(range(head))
    if head < student_end and head < teacher_end:
        student_at.append(student_end - 1)
        teacher_at.append(teacher_end - 1)
    student_at += range(student_end, len(student))
    teacher_at += range(teacher_end, len(teacher))
    return Reading(student, teacher, student_at, teacher_at)
