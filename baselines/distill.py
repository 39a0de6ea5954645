"""distill: Token Distillation (Dobler, Elliott, de Melo, arXiv 2505.20133; first released as AweDist).

Each new token's input row learns to make the frozen model read the new token as it reads what the token
stands for: on every training example, the hidden states of the model reading the new token (the student)
are pulled toward those the same frozen model computes where the text holds the token's meaning instead
(the teacher). The teacher reads a new token's own sub-word pieces where its spelling is its meaning (xling),
the word it stands for where the task knows it (pseudowords, arithmetic, sequential), and the method is refused
where the task knows only that it stands for something (clbench/teacher.py says which, and the run's config
records it as `teacher`). Choices, as the reference implementation (konstantinjdobler/token-distillation,
`token_distillation/train_loop.py`, its defaults) makes them:

- layer: the last, after the final norm (HF's hidden_states[-1], `target_layer=-1`): what the head reads;
- positions: every position of the example, each compared with the teacher position that has read the same
  text (an old token with itself, the new token with the last piece it replaces); those before the first
  new token match by construction and count in the mean, as there;
- loss: mean squared error over those positions and the hidden dimension (`MSE-on-hiddens`), in float32;
- output rows: on a tied model the new row is also the new token's output row, learned by distillation alone
  (the reference learns nothing else there); on an untied one the new output row is its own parameter trained
  by the next-token loss alone (`OutputEmbeddingInit.TRAIN_WITH_CE`): the head reads the hidden states
  detached, so the task loss reaches only the output rows and the distillation loss only the input rows.

The protocol owns the rest, as for every method: the task's initialisation (the reference starts from the
sub-word mean, as `--init subword-mean` does), AdamW with warm-up and cosine decay (the reference's schedule
is constant; its paper's was linear), gradient clipping at 1, the task's batches; the training softmax is
V ∪ U (what trains the untied output rows), and the logged loss is that next-token loss, which only the
untied output rows train on. Old rows of both matrices stay bit-identical: forgetting_oldvocab is 0.

Cost: the teacher's hidden states are recomputed at every step, not cached: one more forward pass of the
decoder without the head and without a graph, on the teacher's reading of the batch (at least as long as the
student's), beside ET's forward and backward (the backward reaches the input rows through every layer, as
ET's does). Measured on SmolLM2-135M, pseudowords' default batches of 4 (2 shared, loaded CPU cores, steps
interleaved): 8.3 s a step against et's 6.4 s, 1.29×. Caching would hold n_train × length × d floats: 10 MB
on pseudowords' cpu profile (4,518 positions × 576), but about 12 GB on xling's paper profile (5,000 chunks of
~300 tokens × 2,048), so the per-step pass is kept, as the reference keeps it; it holds no graph, so peak
memory is et's plus one batch of the teacher's activations.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from clbench.errors import ClbenchError
from clbench.method import DISTILLED_ROWS, register_method
from clbench.rows import NewLogits, NewRows
from clbench.teacher import Reading
from clbench.train import autocast


@dataclass(frozen=True)
class DistillConfig:
    lr: float = field(default=1e-2, metadata={"help": "AdamW learning rate for the new rows", "grid": DISTILLED_ROWS})


class Distill:
    def __init__(self, model, expansion, config: DistillConfig):
        model.requires_grad_(False)
        self.model, self.expansion = model, expansion
        old, n_new = expansion.old_vocab, len(expansion.new_ids)
        self.rows = NewRows(model, old, n_new)
        head = model.get_output_embeddings()
        if expansion.tied:  # the new row is the output row: the head reads its current value, untrained there
            self.out_rows = None
            self.logits = NewLogits(head, old, n_new, lambda: self.rows.weight.detach())
        else:
            self.out_rows = torch.nn.Parameter(head.weight[old : old + n_new].detach().clone().float())
            self.logits = NewLogits(head, old, n_new, lambda: self.out_rows)
        self._handles = [
            model.register_forward_pre_hook(self._read_ids, with_kwargs=True),
            head.register_forward_pre_hook(self._keep_hidden),
        ]
        self.param_groups = [{"params": [self.rows.weight] + ([] if expansion.tied else [self.out_rows])}]
        self.by_student: dict[tuple[int, ...], Reading] = {}

    def teacher(self, readings: list[Reading], pad_id: int) -> None:
        """The protocol's teacher hook: a batch row is found by its ids, padded as train() pads them."""
        self.pad_id, self.width = pad_id, max(len(r.student) for r in readings)
        # identical student texts get one teacher, the last one's (train() cannot tell them apart either)
        self.by_student = {self._key(r.student): r for r in readings}

    def _key(self, ids: list[int]) -> tuple[int, ...]:
        return tuple(ids) + (self.pad_id,) * (self.width - len(ids))

    def _read_ids(self, model, args, kwargs):
        if model.training:
            self.ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]

    def _keep_hidden(self, head, args):
        if head.training:  # the student's last hidden states, kept for penalty(); the head reads them detached
            self.hidden = args[0]
            return (args[0].detach(), *args[1:])
        return None

    def penalty(self) -> torch.Tensor:
        """The distillation loss on the batch train() has just run forward."""
        try:
            batch = [self.by_student[self._key(row)] for row in self.ids.tolist()]
        except (KeyError, AttributeError):
            raise ClbenchError("distill trained on an example its teacher hook was not given") from None
        width = max(len(r.teacher) for r in batch)
        ids = torch.tensor([r.teacher + [self.pad_id] * (width - len(r.teacher)) for r in batch])
        with torch.no_grad(), autocast(self.ids.device):
            taught = self.model.base_model(input_ids=ids.to(self.ids.device)).last_hidden_state
        rows = torch.tensor([b for b, r in enumerate(batch) for _ in r.student_at], device=taught.device)
        at = lambda positions: torch.tensor(positions, device=taught.device)
        student = self.hidden[rows, at([i for r in batch for i in r.student_at])]
        target = taught[rows, at([i for r in batch for i in r.teacher_at])]
        return F.mse_loss(student.float(), target.float())

    @torch.no_grad()
    def finalize(self):
        for handle in self._handles:
            handle.remove()
        self.logits.remove()
        self.hidden = self.ids = None
        self.rows.materialise()  # tied: the head is this matrix, so the output rows are written too
        if self.out_rows is not None:
            head = self.model.get_output_embeddings()
            head.weight[self.expansion.old_vocab : self.expansion.new_vocab] = self.out_rows.to(head.weight.dtype)
        return self.model


register_method(
    "distill",
    DistillConfig,
    Distill,
    train_vocab="full",
    description="Token Distillation: new input rows match the base's last hidden states on what each token stands for",
    penalty=True,  # the distillation loss
    reads_teacher_text=True,
    trains_rows_outside_model=True,
    frozen_backbone=True,  # new rows only: on text without new tokens the hidden states are the base's
)
