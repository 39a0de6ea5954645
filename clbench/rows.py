"""Trainable rows for the new tokens, outside the frozen embedding matrix.

A forward hook swaps the new tokens' embeddings into the input-embedding output. The big
matrix keeps requires_grad=False, so backward never forms its gradient (with tied embeddings
that would be a full |V|×d matmul through the output head) and the optimizer holds state for
the new rows alone: nothing can touch an old row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class NewRows(nn.Module):
    def __init__(self, model, old_vocab: int, n_new: int, rows: Callable[[], torch.Tensor] | None = None):
        """rows: how to compute the [n_new, d] rows; default a free parameter per row (plain ET)."""
        super().__init__()
        self.embedding = model.get_input_embeddings()
        self.old_vocab = old_vocab
        self.n_new = n_new
        weight = self.embedding.weight
        self.weight = nn.Parameter(weight[old_vocab : old_vocab + n_new].detach().clone().float())
        self.rows = rows or (lambda: self.weight)
        self._handle = self.embedding.register_forward_hook(self._substitute)

    def _substitute(self, module, args, out):
        ids = args[0]
        # ids past these rows (a later stage's tokens) keep their own embedding
        is_new = (ids >= self.old_vocab) & (ids < self.old_vocab + self.n_new)
        new = self.rows()[(ids - self.old_vocab).clamp(0, self.n_new - 1)]
        return torch.where(is_new.unsqueeze(-1), new.to(out.dtype), out)

    @torch.no_grad()
    def materialise(self) -> None:
        """Write the learned rows into the embedding matrix and remove the hook."""
        self.embedding.weight[self.old_vocab : self.old_vocab + self.n_new] = self.rows().to(
            self.embedding.weight.dtype
        )
        self._handle.remove()


class NewLogits:
    """A forward hook on the output head that computes the new tokens' logits from rows outside it.

    The head's own matrix stays frozen and out of the graph, as the input side's does with NewRows;
    logits of old tokens (and of a later stage's tokens) are the head's, untouched."""

    def __init__(self, head: nn.Module, old_vocab: int, n_new: int, rows: Callable[[], torch.Tensor]):
        self.old_vocab, self.new_vocab, self.rows = old_vocab, old_vocab + n_new, rows
        self._handle = head.register_forward_hook(self._substitute)

    def _substitute(self, head, args, logits):
        mine = F.linear(args[0], self.rows().to(args[0].dtype))
        return torch.cat([logits[..., : self.old_vocab], mine.to(logits.dtype), logits[..., self.new_vocab :]], dim=-1)

    def remove(self) -> None:
        self._handle.remove()
