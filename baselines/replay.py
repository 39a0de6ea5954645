"""replay: full fine-tuning with old-vocabulary text rehearsed alongside the new examples.

The classic continual-learning reference that is not parameter-efficient: every weight trains,
and a `fraction` of the training examples is old text (the task's `replay_text`, disjoint from
the text forgetting is measured on). With n new examples it adds round(n·f / (1 − f)) replay
examples, so shuffled batches hold a fraction f of old text in expectation.
"""

from dataclasses import dataclass, field

from clbench.errors import ClbenchError
from clbench.method import ALL_WEIGHTS, register_method


@dataclass(frozen=True)
class ReplayConfig:
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate for all weights", "grid": ALL_WEIGHTS})
    fraction: float = field(
        default=0.5, metadata={"help": "share of training examples that are replayed old text, in [0, 1)"}
    )

    def __post_init__(self):
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"fraction must be in [0, 1), got {self.fraction}")


class Replay:
    def __init__(self, model, expansion, config: ReplayConfig):
        model.float().requires_grad_(True)  # float32 masters, as in fft
        self.model, self.fraction = model, config.fraction
        self.param_groups = [{"params": list(model.parameters())}]

    def training_examples(self, train: list, replay: list) -> list:
        count = round(len(train) * self.fraction / (1.0 - self.fraction))
        if count and not replay:
            raise ClbenchError("method 'replay' needs old text to rehearse: the task has no replay_text")
        return train + [replay[i % len(replay)] for i in range(count)]

    def finalize(self):
        return self.model


register_method(
    "replay",
    ReplayConfig,
    Replay,
    train_vocab="full",
    description="Full fine-tuning with a fraction of replayed old-vocabulary text",
    reads_old_text=True,
)
