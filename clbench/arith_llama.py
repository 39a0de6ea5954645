"""builtin:arith-llama: a character-level Llama trained from scratch by clbench on the arithmetic of clbench/arith.py.

It stands in for the paper's Llama-3.2-3B on the arithmetic-operator task where no hub is
reachable: addition, and multiplication on the pairs `mul_pairs_seen()` names, so a new operator
can be tested on pairs the base saw with `*` and on pairs it did not. Rebuild it from scratch with
`clbench build-base --force` (deterministic on CPU for a given recipe).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from clbench.arith import ADD_PAIRS, char_tokenizer, mul_pairs_seen
from clbench.cache import cache_root, publish
from clbench.data import Example, encode_examples
from clbench.train import train


@dataclass(frozen=True)
class Recipe:
    layers: int = 2
    hidden: int = 128
    mlp: int = 512
    heads: int = 4
    steps: int = 2000
    batch_size: int = 128
    lr: float = 3e-3
    seed: int = 0
    mul_repeat: int = 10  # multiplication pairs are 10× fewer than addition pairs; rebalance

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def corpus(recipe: Recipe) -> list[Example]:
    """Whole expressions as text: the base is a language model of arithmetic, loss on every token."""
    seen = sorted(mul_pairs_seen())
    add = [Example("", f"{a}+{b}={a + b}") for a, b in ADD_PAIRS]
    mul = [Example("", f"{a}*{b}={a * b}") for a, b in seen] * recipe.mul_repeat
    return add + mul


def build(recipe: Recipe, log=print) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    torch.manual_seed(recipe.seed)
    tokenizer = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden,
        intermediate_size=recipe.mlp,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.heads,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    examples = encode_examples(tokenizer, corpus(recipe), config.max_position_embeddings)

    def progress(step: int, loss: float, lr: float, grad_norm: float) -> None:
        if (step + 1) % 250 == 0:
            log(f"  base model step {step + 1}/{recipe.steps}  loss {loss:.4f}")

    train(
        model,
        [{"params": list(model.parameters())}],
        examples,
        steps=recipe.steps,
        batch_size=recipe.batch_size,
        lr=recipe.lr,
        seed=recipe.seed,
        pad_id=tokenizer.pad_token_id,
        warmup_frac=0.05,
        on_step=progress,
    )
    return model, tokenizer


def load_or_build(recipe: Recipe = Recipe(), force: bool = False, log=None):
    """Load the cached base for this recipe, building it first if missing (~70 s on 2 cores)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    target = cache_root() / "models" / f"arith-llama-{recipe.key()}"
    if force and target.exists():
        shutil.rmtree(target)
    if not (target / "recipe.json").exists():
        log(f"building the arithmetic base model (recipe {recipe.key()}); cached in {target}")
        model, tokenizer = build(recipe, log)

        def write(staging: Path) -> None:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            # recipe.json is written last: its presence means the rest is complete
            (staging / "recipe.json").write_text(json.dumps(asdict(recipe), indent=1))

        publish(target, write)
    model = AutoModelForCausalLM.from_pretrained(target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    return model, tokenizer
