"""LoRA (peft) with the new tokens' rows trainable.

Low-rank adapters on the linear layers cannot by themselves give a new token a
meaning: its embedding row would stay at its initialisation. peft's `trainable_token_indices`
makes exactly the new rows trainable (the input rows, and for an untied head its rows too;
a tied head shares the input delta). finalize() merges everything into the base weights, so the
evaluated model is a plain transformers model with the trained new rows written in.
"""

from dataclasses import dataclass, field

from peft import LoraConfig, get_peft_model

from clbench.method import register_method


@dataclass(frozen=True)
class LoRAConfig:
    lr: float = field(
        default=3e-3,
        metadata={
            "help": "AdamW learning rate for adapters and new rows",
            "grid": (3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
        },
    )
    rank: int = field(default=8, metadata={"help": "LoRA rank r"})
    alpha: float = field(default=16.0, metadata={"help": "LoRA alpha (the update is scaled by alpha / rank)"})
    targets: str = field(
        default="all-linear",
        metadata={
            "help": "modules that get adapters: 'all-linear' (peft: every linear layer but the output head) or comma-separated names"
        },
    )

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"rank must be at least 1, got {self.rank}")


class LoRA:
    def __init__(self, model, expansion, config: LoRAConfig):
        new = list(expansion.new_ids)
        names = [_module_name(model, m) for m in (model.get_input_embeddings(), model.get_output_embeddings())]
        tokens = new if expansion.tied else dict.fromkeys(names, new)
        peft_config = LoraConfig(
            r=config.rank,
            lora_alpha=config.alpha,
            lora_dropout=0.0,
            target_modules=config.targets
            if config.targets == "all-linear"
            else [t.strip() for t in config.targets.split(",") if t.strip()],
            trainable_token_indices=tokens,
        )
        # peft injects adapters into `model` in place: the protocol's training loop calls it as is
        self.peft_model = get_peft_model(model, peft_config)
        self.param_groups = [{"params": [p for p in self.peft_model.parameters() if p.requires_grad]}]

    def finalize(self):
        return self.peft_model.merge_and_unload()


def _module_name(model, module) -> str:
    """The attribute name peft matches for this module (e.g. embed_tokens, lm_head)."""
    return next(name for name, m in model.named_modules() if m is module).rsplit(".", 1)[-1]


register_method(
    "lora",
    LoRAConfig,
    LoRA,
    train_vocab="full",
    description="LoRA (peft) on the projections + the new tokens' embedding rows trainable",
)
