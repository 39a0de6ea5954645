"""et-full: Embedding Tuning as PEFT's TrainableTokens trains new tokens, under the full softmax.

Only the new tokens' rows train, everything else frozen, but the softmax runs over V ∪ U, so a
new token learns to be predicted as well as read. Where the model ties its embeddings (SmolLM2,
Llama-3.2, Qwen2.5) each new token has ONE row, serving as its input embedding and its output
row, as in a tied model trained the usual way; where it does not, an input row and an output
row. Old rows of both matrices stay bit-identical, so forgetting_oldvocab is 0; what sharing the
softmax with U costs old text is forgetting_full. This is the form of ET the paper's
cross-lingual results most plausibly come from (`et` cannot predict its new tokens at all).
"""

from dataclasses import dataclass, field

import torch

from clbench.method import NEW_ROWS, register_method
from clbench.rows import NewLogits, NewRows


@dataclass(frozen=True)
class ETFullConfig:
    lr: float = field(default=3e-2, metadata={"help": "AdamW learning rate for the new rows", "grid": NEW_ROWS})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay, applied to the new rows only"})


class ETFull:
    def __init__(self, model, expansion, config: ETFullConfig):
        model.requires_grad_(False)
        self.model, self.expansion = model, expansion
        old, n_new = expansion.old_vocab, len(expansion.new_ids)
        self.rows = NewRows(model, old, n_new)
        head = model.get_output_embeddings()
        if expansion.tied:  # one parameter read by both hooks: its gradient sums both uses
            self.out_rows = self.rows.weight
        else:
            self.out_rows = torch.nn.Parameter(head.weight[old : old + n_new].detach().clone().float())
        self.logits = NewLogits(head, old, n_new, lambda: self.out_rows)
        params = [self.rows.weight] + ([] if expansion.tied else [self.out_rows])
        self.param_groups = [{"params": params, "weight_decay": config.weight_decay}]

    @torch.no_grad()
    def finalize(self):
        self.logits.remove()
        self.rows.materialise()  # tied: the head is this matrix, so the output rows are written too
        if not self.expansion.tied:
            head = self.model.get_output_embeddings()
            head.weight[self.expansion.old_vocab : self.expansion.new_vocab] = self.out_rows.to(head.weight.dtype)
        return self.model


register_method(
    "et-full",
    ETFullConfig,
    ETFull,
    train_vocab="full",
    description="ET under the full softmax as PEFT's TrainableTokens: new rows only (tied: one row in and out)",
    trains_rows_outside_model=True,
    frozen_backbone=True,  # new rows only: on text without new tokens the hidden states are the base's
)
