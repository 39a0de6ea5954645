"""et-dict: Embedding Tuning with each new row an explicit s-sparse dictionary over the old rows.

The paper reads ET as a token-to-dictionary mapping; this makes it the parameterisation:
row(u) = Σ_v α_uv · E_old[v] with at most s non-zero α_uv. α is a dense trainable matrix
[|U|, |V|]; the forward pass keeps only its s largest-magnitude entries per row (top-s) and the
backward pass is straight-through (every α_uv gets the gradient it would get if it were kept),
so a dropped old token can re-enter the support. α starts as the OMP fit of the expanded
row, so training starts from (an s-sparse approximation of) the task's `init`.
Everything else is ET: backbone frozen, old-vocabulary softmax.
"""

from dataclasses import dataclass, field

import torch

from clbench.method import register_method
from clbench.rows import NewRows
from clbench.sparse import omp


@dataclass(frozen=True)
class ETDictConfig:
    lr: float = field(
        default=1e-1,
        metadata={"help": "AdamW learning rate for the dictionary weights α", "grid": (1e-2, 3e-2, 1e-1, 3e-1, 1.0)},
    )
    s: int = field(default=4, metadata={"help": "non-zero weights per new row (top-s by magnitude)"})

    def __post_init__(self):
        if self.s < 1:
            raise ValueError(f"s must be at least 1, got {self.s}")


def top_s(alpha: torch.Tensor, s: int) -> torch.Tensor:
    """alpha with all but the s largest-magnitude entries of each row zeroed (forward); identity gradient."""
    keep = torch.zeros_like(alpha, dtype=torch.bool).scatter_(
        1, alpha.abs().topk(min(s, alpha.shape[1]), dim=1).indices, True
    )
    return alpha + (alpha * keep - alpha).detach()


class ETDict:
    def __init__(self, model, expansion, config: ETDictConfig):
        model.requires_grad_(False)
        self.model, self.s = model, config.s
        weight = model.get_input_embeddings().weight
        self.dictionary = weight[: expansion.old_vocab].detach()  # a view: no copy of the old rows
        alpha = torch.zeros(len(expansion.new_ids), expansion.old_vocab, dtype=torch.float32)
        for i, new_id in enumerate(expansion.new_ids):
            fit = omp(self.dictionary, weight[new_id], config.s)
            alpha[i, fit.indices] = torch.tensor(fit.weights, dtype=torch.float32)
        self.alpha = torch.nn.Parameter(alpha.to(weight.device))
        self.rows = NewRows(model, expansion.old_vocab, len(expansion.new_ids), rows=self.sparse_rows)
        self.param_groups = [{"params": [self.alpha]}]

    def sparse_rows(self) -> torch.Tensor:
        return top_s(self.alpha, self.s) @ self.dictionary.float()

    def finalize(self):
        self.rows.materialise()
        return self.model


register_method(
    "et-dict",
    ETDictConfig,
    ETDict,
    train_vocab="old",
    description="ET with each new row an s-sparse combination of old rows (top-s, straight-through)",
    trains_rows_outside_model=True,
    frozen_backbone=True,
)
