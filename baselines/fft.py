"""Full fine-tuning (FFT): every weight trains, new rows included, with the usual full softmax."""

from dataclasses import dataclass, field

from clbench.method import ALL_WEIGHTS, register_method


@dataclass(frozen=True)
class FFTConfig:
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate for all weights", "grid": ALL_WEIGHTS})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay on all weights"})


class FFT:
    def __init__(self, model, expansion, config: FFTConfig):
        # float32 masters (a no-op on CPU, where models load in float32): a bf16 weight cannot take
        # an update below 2^-8 of itself; under autocast the forward still computes in bf16
        model.float().requires_grad_(True)
        self.model = model
        self.param_groups = [{"params": list(model.parameters()), "weight_decay": config.weight_decay}]

    def finalize(self):
        return self.model


register_method("fft", FFTConfig, FFT, train_vocab="full", description="Full fine-tuning of every weight")
