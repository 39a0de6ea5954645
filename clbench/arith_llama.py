"""builtin:arith-llama: a character-level Llama trained from scratch by clbench on the arithmetic of clbench/arith.py.

It stands in for the paper's Llama-3.2-3B on the arithmetic-operator task where no hub is
reachable: addition, and multiplication on the pairs `mul_pairs_seen()` names, so a new operator
can be tested on pairs the base saw with `*` and on pairs it did not.

The recipe does not give the same weights everywhere (float kernels differ between CPUs: four
builds on four machines or sessions gave four fingerprints), so the weights one build gave ship with clbench
(clbench/assets/arith-llama/) and builtin:arith-llama loads them: the same model on every machine.
`clbench build-base [--force]` builds the recipe here, into the cache, and reports how far that
build lands from the shipped one; `--model builtin:arith-local` runs on it, under its own name.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from clbench import metrics
from clbench.arith import ADD_PAIRS, char_tokenizer, mul_pairs_seen
from clbench.cache import cache_root, publish
from clbench.data import Example, encode_examples
from clbench.errors import ClbenchError
from clbench.evaluate import score
from clbench.train import train
from clbench.weights import fingerprint

ASSETS = Path(__file__).parent / "assets"
SHIPPED = ASSETS / "arith-llama"
# weights.fingerprint of the shipped weights; written only here (the README quotes it, a test checks both)
SHIPPED_FINGERPRINT = "5aac12d85dbb988c"


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


# The model-size axis: the same recipe (data, tokenizer, depth) at half, one and two times the width, each trained to
# ≥ 99 % addition (steps and lr adjusted where the shipped ones fell short, below); each build shipped like
# builtin:arith-llama, its fingerprint checked at every load (assets/<name>/PROVENANCE.md)
FAMILY = {
    # at 2,000 steps the half width reached 98.4 % addition (fingerprint 3905e0558183183c): it gets twice the steps
    "arith-llama-w64": Recipe(hidden=64, mlp=256, heads=2, steps=4000),
    "arith-llama": Recipe(),
    # at lr 3e-3 the double width reached 95.0 % addition (fingerprint 8fb041bf1a64c0c6): half the lr for twice the width
    "arith-llama-w256": Recipe(hidden=256, mlp=1024, heads=8, lr=1.5e-3),
}
FAMILY_FINGERPRINTS = {
    "arith-llama-w64": "cb5a046ab9c95aac",
    "arith-llama": SHIPPED_FINGERPRINT,
    "arith-llama-w256": "e25a947fcc15bc3f",
}


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
    """builtin:arith-local: this machine's build of the recipe, cached; built first if missing (~70–100 s on 2 cores)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    target = cache_root() / "models" / f"arith-llama-{recipe.key()}"
    if force and target.exists():
        shutil.rmtree(target)
    if not (target / "recipe.json").exists():
        log(f"building the arithmetic base model (recipe {recipe.key()})")
        log(f"  cached in {target}")
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


def load_shipped(name: str = "arith-llama"):
    """The base builtin:<name> names (a member of FAMILY): its recipe's build shipped with clbench, never rebuilt."""
    folder, expected = ASSETS / name, FAMILY_FINGERPRINTS[name]
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    if (found := fingerprint(model)) != expected:
        raise ClbenchError(
            f"the arithmetic base in {folder} has fingerprint {found}, not the shipped {expected}; reinstall clbench"
        )
    return model, tokenizer


def accuracies(model, tokenizer) -> dict[str, float]:
    """Exact match on the arithmetic task's old-skill set (addition) and on its test pairs written with `*`,
    those the base trained on and the others: what a task run measures of the base."""
    from clbench.taskspec import load_tasks  # the task registry is not needed to build or load the base

    task = load_tasks().get("arithmetic")
    _, budget, params = task.resolved()
    data = task.build(params, tokenizer)
    sets = {
        "add_acc": data.old_skill,
        "mul_acc_seen": [e for e in data.target_oracle if e.group == "seen"],
        "mul_acc_unseen": [e for e in data.target_oracle if e.group == "unseen"],
    }
    limit = model.config.max_position_embeddings
    return {
        name: metrics.accuracy(
            score(
                model,
                encode_examples(tokenizer, examples, limit),
                old_vocab=len(tokenizer),
                pad_id=tokenizer.pad_token_id,
                batch_size=budget.eval_batch_size,
            ).hits_old
        )
        for name, examples in sets.items()
    }


def compare(
    local: Mapping[str, torch.Tensor],
    shipped: Mapping[str, torch.Tensor],
    local_acc: Mapping[str, float],
    shipped_acc: Mapping[str, float],
) -> dict[str, float]:
    """How far a local build lands from the shipped base: the largest |difference| of any weight, and
    each accuracy's local − shipped (`<name>_diff`). Arguments: two state dicts, two accuracies()."""
    if local.keys() != shipped.keys() or any(local[k].shape != shipped[k].shape for k in shipped):
        raise ClbenchError("the local build's tensors are not the shipped base's: another recipe, not comparable")
    largest = max((local[k].double() - shipped[k].double()).abs().max().item() for k in shipped)
    return {"max_abs_weight_diff": largest, **{f"{k}_diff": local_acc[k] - shipped_acc[k] for k in shipped_acc}}


def versus_shipped(model, tokenizer) -> list[str]:
    """A local build beside the shipped base, as lines for `clbench build-base`."""
    shipped, shipped_tokenizer = load_shipped()
    local_acc, shipped_acc = accuracies(model, tokenizer), accuracies(shipped, shipped_tokenizer)
    diff = compare(model.state_dict(), shipped.state_dict(), local_acc, shipped_acc)
    lines = [
        f"local build: fingerprint {fingerprint(model)}; shipped base: {SHIPPED_FINGERPRINT}",
        f"largest weight difference: {diff['max_abs_weight_diff']:.3g}",
    ]
    lines += [
        f"{name}: local {local_acc[name]:.3f}, shipped {shipped_acc[name]:.3f} ({diff[name + '_diff']:+.3f})"
        for name in shipped_acc
    ]
    lines.append("runs use the shipped base (builtin:arith-llama); --model builtin:arith-local uses this build")
    return lines
