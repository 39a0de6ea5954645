"""Sparse decompositions of a vector over the rows of an embedding matrix.

The paper's reading of Embedding Tuning is a token-to-dictionary mapping: a new token's row is
(close to) a combination of a few old tokens' rows. Orthogonal matching pursuit (OMP) finds such
a combination greedily; the `omp` init, `et-dict` and `clbench explain` all use this one function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Decomposition:
    indices: list[int]  # rows of the dictionary, in the order OMP chose them
    weights: list[float]  # least-squares coefficients of those rows
    residual: float  # ‖target − Σ wᵢ·rowᵢ‖ / ‖target‖ (0 = exact)

    def reconstruction(self, dictionary: torch.Tensor) -> torch.Tensor:
        weights = torch.tensor(self.weights, dtype=torch.float64)
        return (
            weights @ dictionary.double()[self.indices]
            if self.indices
            else torch.zeros(dictionary.shape[1], dtype=torch.float64)
        )


def omp(dictionary: torch.Tensor, target: torch.Tensor, s: int) -> Decomposition:
    """Best s-sparse approximation of target [d] over dictionary [n, d], by OMP.

    Each step adds the row most correlated (cosine) with the current residual, then refits all
    chosen coefficients by least squares, so the residual is orthogonal to every chosen row.
    Stops early once the residual is zero. Computed in float64 on the CPU.
    """
    atoms = dictionary.detach().double().cpu()
    x = target.detach().double().cpu()
    norms = atoms.norm(dim=1).clamp_min(1e-300)
    chosen: list[int] = []
    coef = torch.zeros(0, dtype=torch.float64)
    residual = x.clone()
    scale = x.norm().item()
    for _ in range(min(s, len(atoms))):
        if residual.norm().item() <= 1e-12 * max(scale, 1e-300):
            break
        correlation = (atoms @ residual).abs() / norms
        correlation[chosen] = -1.0
        chosen.append(int(correlation.argmax()))
        basis = atoms[chosen].T  # [d, k]
        coef = torch.linalg.lstsq(basis, x[:, None]).solution[:, 0]
        residual = x - basis @ coef
    relative = residual.norm().item() / scale if scale else 0.0
    return Decomposition(chosen, coef.tolist(), relative)


def nearest(dictionary: torch.Tensor, target: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k rows of dictionary with the highest cosine similarity to target, best first."""
    atoms = dictionary.detach().double().cpu()
    x = target.detach().double().cpu()
    cosine = (atoms @ x) / (atoms.norm(dim=1) * x.norm()).clamp_min(1e-300)
    top = cosine.topk(min(k, len(atoms)))
    return list(zip(top.indices.tolist(), top.values.tolist()))
