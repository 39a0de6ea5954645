"""Embedding Tuning (ET): train only the new tokens' input-embedding rows; everything else frozen.

The paper's construction (arXiv 2605.04308): adding states U while keeping every V→V transition,
so training uses the old-vocabulary softmax (p(u | ·) = 0) and old text is scored bit-identically.
"""

from dataclasses import dataclass, field

from clbench.method import NEW_ROWS, register_method
from clbench.rows import NewRows


@dataclass(frozen=True)
class ETConfig:
    lr: float = field(default=3e-2, metadata={"help": "AdamW learning rate for the new rows", "grid": NEW_ROWS})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay, applied to the new rows only"})


class ET:
    def __init__(self, model, expansion, config: ETConfig):
        model.requires_grad_(False)
        self.model = model
        self.rows = NewRows(model, expansion.old_vocab, len(expansion.new_ids))
        self.param_groups = [{"params": [self.rows.weight], "weight_decay": config.weight_decay}]

    def finalize(self):
        self.rows.materialise()
        return self.model


register_method(
    "et",
    ETConfig,
    ET,
    train_vocab="old",
    description="Embedding Tuning: new input rows only, backbone frozen",
    trains_rows_outside_model=True,
    frozen_backbone=True,
)
