"""ewc: full fine-tuning pulled back toward the old weights, each by how much old text depends on it.

Elastic Weight Consolidation (Kirkpatrick et al. 2017, PNAS): the training loss gets the penalty
(λ/2) Σ_i F_i (θ_i − θ*_i)², θ* the weights before training and F the diagonal empirical Fisher of
the old model on old text, F_i = mean over texts x of (∂ log p(x) / ∂θ_i)², log p(x) the mean
per-token log-likelihood of one text (the training loss's normalisation, so λ compares with it).
F is estimated on the task's `replay_text` (old text disjoint from the text forgetting is measured
on) through the `training_examples` hook, which the protocol calls before the first step; the
penalty reaches train() through the `penalty` hook (clbench/method.py). The Fisher's likelihood is
the old-vocabulary softmax (ids below expansion.old_vocab): the old model's own distribution, which
the new rows' initialisation does not touch. New-token rows carry no penalty.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from clbench.data import Encoded, Padded
from clbench.devices import input_device
from clbench.errors import ClbenchError
from clbench.method import ALL_WEIGHTS, register_method
from clbench.train import autocast


@dataclass(frozen=True)
class EWCConfig:
    lr: float = field(
        default=1e-3, metadata={"help": "AdamW learning rate for all weights (as fft)", "grid": ALL_WEIGHTS}
    )
    # lam, measured on `clbench run --task arithmetic --set lam=…` (seed 0, offline defaults; fft = λ 0):
    #   λ         0      1e3    1e4    1e5    1e6    1e7
    #   target   0.58   0.577  0.56   0.583  0.58   0.507   (target_acc)
    #   forget   0.658  0.442  0.224  0.106  0.061  0.043   (forgetting_oldvocab)
    #   skill   −0.638 −0.538 −0.398 −0.166 −0.110 −0.102   (old_skill_acc_delta)
    # 1e6: the largest λ tried that keeps fft's target accuracy. F scales with the old text's
    # gradients, so another model or task may want another λ (--set lam=…).
    lam: float = field(default=1e6, metadata={"help": "EWC strength λ: the penalty is (λ/2) Σ F (θ − θ*)²"})
    fisher_examples: int = field(
        default=128, metadata={"help": "how many replay texts (the first ones) estimate the Fisher"}
    )

    def __post_init__(self):
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise ValueError(f"lam must be a finite number >= 0, got {self.lam}")
        if self.fisher_examples < 1:
            raise ValueError(f"fisher_examples must be >= 1, got {self.fisher_examples}")


def diagonal_fisher(model, examples: list[Encoded], *, vocab_limit: int) -> dict[str, torch.Tensor]:
    """name → mean over examples of the squared gradient of the example's mean NLL (softmax over
    the first vocab_limit logits, targets below it scored), one entry per parameter of the model.

    One backward per example; each weight's gradient is squared into F as soon as backward has
    accumulated it, then freed. So beside F (one float32 copy of the weights) only one weight's
    gradient and one example's activations are alive at a time: per-example gradients of every
    weight at once (vmap over 8 texts, before) took 15 GB on SmolLM2-135M, ~256 GB on an 8B model."""
    params = dict(model.named_parameters())
    fisher = {name: torch.zeros_like(p, dtype=torch.float32) for name, p in params.items()}

    def square_into(name: str):
        def hook(p: torch.Tensor) -> None:
            fisher[name].addcmul_(p.grad, p.grad)
            p.grad = None

        return hook

    device = input_device(model)
    padded = Padded(examples, pad_id=0)  # a batch of one row is that row alone: no pad
    for p in params.values():
        p.grad = None  # a previous train() leaves its last step's gradients, which the hooks would add to
    handles = [p.register_post_accumulate_grad_hook(square_into(name)) for name, p in params.items()]
    try:
        for row in range(len(examples)):
            ids, _, target_mask = (t.to(device) for t in padded.batch([row]))
            scored = (target_mask & (ids[:, 1:] < vocab_limit)).float()[0]
            with autocast(device):
                logits = model(input_ids=ids).logits[0, :-1, :vocab_limit]
                nll = F.cross_entropy(logits.float(), ids[0, 1:].clamp(max=vocab_limit - 1), reduction="none")
            ((nll * scored).sum() / scored.sum().clamp(min=1)).backward()
    finally:
        for handle in handles:
            handle.remove()
    for f in fisher.values():  # in place: a divided copy beside the sums would be one more copy of the weights
        f.div_(len(examples))
    return fisher


class Pull(torch.autograd.Function):
    """Σ F (θ − θ*)² of one weight, its gradient 2 F (θ − θ*) computed in backward from θ, θ* and F
    themselves. Plain autograd would keep (θ − θ*) alive from the penalty's forward to the backward:
    one more copy of every weight (measured on SmolLM2-135M: ewc's resident set 2.7× the weights
    above replay's, the same training without the penalty)."""

    @staticmethod
    def forward(ctx, p, anchor, fisher):
        ctx.save_for_backward(p, anchor, fisher)  # tensors that live anyway: nothing new is kept
        return torch.dot(fisher.reshape(-1), (p - anchor).square_().reshape(-1))

    @staticmethod
    def backward(ctx, grad):
        p, anchor, fisher = ctx.saved_tensors
        return (p - anchor).mul_(fisher).mul_(2 * grad), None, None  # one temporary, the gradient itself


class EWC:
    def __init__(self, model, expansion, config: EWCConfig):
        model.float().requires_grad_(True)  # float32 masters, as in fft
        self.model, self.old_vocab, self.config = model, expansion.old_vocab, config
        self.param_groups = [{"params": list(model.parameters())}]
        self.anchors: list[tuple[torch.nn.Parameter, torch.Tensor, torch.Tensor]] = []  # (θ, θ*, F)

    def training_examples(self, train: list, replay: list) -> list:
        """Called before the first step: F and θ* at the weights before training; trains on `train` alone."""
        if not replay:
            raise ClbenchError("method 'ewc' needs old text to estimate its Fisher on: the task has no replay_text")
        config, model = self.config, self.model
        fisher = diagonal_fisher(model, replay[: config.fisher_examples], vocab_limit=self.old_vocab)
        vocab_matrices = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
        for name, p in model.named_parameters():
            if id(p) in vocab_matrices:
                fisher[name][self.old_vocab :] = 0  # new-token rows are free to move
            self.anchors.append((p, p.detach().clone(), fisher[name]))
        return train

    def penalty(self) -> torch.Tensor:
        return self.config.lam / 2 * sum(Pull.apply(p, anchor, f) for p, anchor, f in self.anchors)

    def finalize(self):
        return self.model


register_method(
    "ewc",
    EWCConfig,
    EWC,
    train_vocab="full",
    description="Full fine-tuning with an EWC penalty (diagonal Fisher on replay_text) toward the old weights",
    reads_old_text=True,
    penalty=True,
)
