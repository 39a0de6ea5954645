"""pt: prompt tuning (peft's PromptEmbedding) with the new tokens' input rows trainable, as in ET.

A soft prompt of k virtual tokens is prepended to every sequence; it and the new rows train,
the backbone stays frozen, the training softmax is the old vocabulary (as in ET).

The virtual-token offset is handled inside the decoder, so neither the training loop nor any
metric can misalign: a pre-hook embeds input_ids, prepends the k prompt vectors and extends the
attention mask; a post-hook drops the first k positions of last_hidden_state. The decoder thus
returns exactly one hidden state per real token, and the head, the loss and every score see
only real positions. The prompt shifts the real tokens' positions by k, as peft's does. The
hooks serve full forward passes (training and scoring), not incremental decoding with a cache.
"""

from dataclasses import dataclass, field

import torch
from peft import PromptTuningConfig
from peft.tuners.prompt_tuning import PromptEmbedding

from clbench.method import NEW_ROWS, register_method
from clbench.rows import NewRows


@dataclass(frozen=True)
class PTConfig:
    lr: float = field(
        default=3e-1, metadata={"help": "AdamW learning rate for the soft prompt and the new rows", "grid": NEW_ROWS}
    )
    # 1 by default: the local arithmetic base only ever saw ~12 positions, and 8 virtual tokens
    # pushed the real ones past them (target_acc 0.13 vs 0.84 with 1, seed 0)
    virtual_tokens: int = field(
        default=1, metadata={"help": "length k of the soft prompt (initialised from sampled vocabulary rows)"}
    )

    def __post_init__(self):
        if self.virtual_tokens < 1:
            raise ValueError(f"virtual_tokens must be at least 1, got {self.virtual_tokens}")


class PromptTuning:
    def __init__(self, model, expansion, config: PTConfig):
        model.requires_grad_(False)
        self.model, self.k = model, config.virtual_tokens
        embedding = model.get_input_embeddings()
        peft_config = PromptTuningConfig(
            task_type="CAUSAL_LM",
            num_virtual_tokens=self.k,
            token_dim=embedding.weight.shape[1],
            num_transformer_submodules=1,
            prompt_tuning_init="SAMPLE_VOCAB",
        )
        # float32 master of the prompt (sampled from a possibly bf16 vocabulary); cast to the embeddings' dtype in use
        self.prompt = PromptEmbedding(peft_config, embedding).to(embedding.weight.device, torch.float32)
        self.rows = NewRows(model, expansion.old_vocab, len(expansion.new_ids))
        decoder = model.get_decoder()
        decoder.register_forward_pre_hook(self._prepend, with_kwargs=True)
        decoder.register_forward_hook(self._strip)
        self.param_groups = [{"params": [self.prompt.embedding.weight, self.rows.weight]}]

    def _prepend(self, decoder, args, kwargs):
        ids = kwargs.pop("input_ids", None) if not args else args[0]
        embeds = self.model.get_input_embeddings()(ids) if ids is not None else kwargs["inputs_embeds"]
        prompt = self.prompt.embedding.weight.to(embeds.dtype).expand(embeds.shape[0], -1, -1)
        kwargs["inputs_embeds"] = torch.cat([prompt, embeds], dim=1)
        mask = kwargs.get("attention_mask")
        if mask is not None:
            kwargs["attention_mask"] = torch.cat([mask.new_ones(mask.shape[0], self.k), mask], dim=1)
        return (), kwargs

    def _strip(self, decoder, args, output):
        output.last_hidden_state = output.last_hidden_state[:, self.k :]
        return output

    def finalize(self):
        self.rows.materialise()
        return self.model  # the prompt hooks stay: the evaluated model is the prompted one


register_method(
    "pt",
    PTConfig,
    PromptTuning,
    train_vocab="old",
    description="Prompt tuning (peft PromptEmbedding) + the new tokens' input rows, backbone frozen",
    trains_rows_outside_model=True,  # not frozen_backbone: the soft prompt precedes old text too
)
