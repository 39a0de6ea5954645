"""et-out: Embedding Tuning plus a trainable output row per new token, so the model can emit it.

ET keeps p(u | ·) = 0 and therefore never generates a new token (the paper's stated limitation).
et-out trains, besides the new input rows, a separate output row per new token under the full
softmax over V ∪ U. Old rows of both matrices stay untouched; what the new output rows cost is
visible in `forgetting_full` (they can steal probability from old tokens on old text).

During training the output rows live outside the head: a forward hook replaces the head's
logits for U with hidden · out_rowsᵀ, so no gradient or optimizer state reaches the head's
matrix. For a tied model, finalize() gives the head its own copy of the embedding matrix (old
rows bit-identical) before writing the new input and output rows, which must differ.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from clbench.method import NEW_ROWS, register_method
from clbench.rows import NewRows


@dataclass(frozen=True)
class ETOutConfig:
    lr: float = field(
        default=3e-2, metadata={"help": "AdamW learning rate for the new input and output rows", "grid": NEW_ROWS}
    )


class ETOut:
    def __init__(self, model, expansion, config: ETOutConfig):
        model.requires_grad_(False)
        self.model, self.expansion = model, expansion
        self.rows = NewRows(model, expansion.old_vocab, len(expansion.new_ids))
        head = model.get_output_embeddings()
        self.out_rows = torch.nn.Parameter(
            head.weight[expansion.old_vocab : expansion.new_vocab].detach().clone().float()
        )
        self._handle = head.register_forward_hook(self._new_logits)
        self.param_groups = [{"params": [self.rows.weight, self.out_rows]}]

    def _new_logits(self, head, args, logits):
        old, new = self.expansion.old_vocab, self.expansion.new_vocab
        mine = F.linear(args[0], self.out_rows.to(args[0].dtype))
        return torch.cat([logits[..., :old], mine.to(logits.dtype), logits[..., new:]], dim=-1)

    @torch.no_grad()
    def finalize(self):
        self._handle.remove()
        head = self.model.get_output_embeddings()
        if self.expansion.tied:
            head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
            self.model.config.tie_word_embeddings = False
        self.rows.materialise()
        head.weight[self.expansion.old_vocab : self.expansion.new_vocab] = self.out_rows.to(head.weight.dtype)
        return self.model


register_method(
    "et-out",
    ETOutConfig,
    ETOut,
    train_vocab="full",
    description="ET plus a separate trainable output row per new token (can generate U)",
    trains_rows_outside_model=True,
    frozen_backbone=True,  # the output rows act on the head's logits, after the hidden states
)
