"""A test kit: tiny in-process models and tiny tasks, for clbench's own tests and for testing a new method or task.

    from clbench.testing import tiny_base, tiny_data, tiny_plan

A tiny model is a 1-layer, 2-head Llama over clbench.arith's 17-token character vocabulary, built in milliseconds
and the same weights for the same seed, so a test can assert exact values on it. Only tests/ and bench/ import
this module: no module of the library does (tests/test_layout.py checks), so nothing here is part of a run.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from clbench.arith import char_tokenizer
from clbench.data import Example, TaskData
from clbench.expand import Expansion, expand
from clbench.models import Base, fingerprint
from clbench.protocol import Plan
from clbench.taskspec import Budget, builtin_task_dir

HIDDEN = 16  # the tiny models' width; their MLP is twice as wide

# measured, not computed: they vary run to run, so a test comparing two runs' values leaves them out. A run reports
# one of MEMORY: CUDA's peak, or on CPU its sampled increase (tests/test_metric_registry.py: all are declared)
MEMORY = frozenset({"peak_mem_mb", "peak_rss_increase_mb"})
NOT_REPRODUCIBLE = frozenset({"train_seconds", "tokens_per_second"}) | MEMORY


# ---------------------------------------------------------------- tiny models


def tiny_llama(
    tokenizer, *, tied: bool, hidden: int = HIDDEN, positions: int = 32, seed: int = 0, special_ids: bool = True
) -> LlamaForCausalLM:
    """A 1-layer, 2-head Llama over `tokenizer`'s vocabulary, `positions` tokens of context, in eval mode.

    Its weights are those after torch.manual_seed(seed), and torch's global random state is left where building
    them leaves it, so what a test draws next is the same every run. special_ids: the config takes the tokenizer's
    bos, eos and pad ids (False: LlamaConfig's defaults, no pad row, as for a BPE trained in a test)."""
    special = ("bos_token_id", "eos_token_id", "pad_token_id") if special_ids else ()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        tie_word_embeddings=tied,
        **{name: getattr(tokenizer, name) for name in special},
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def tiny_base(tied: bool, *, name: str = "tiny", positions: int = 32) -> Base:
    """tiny_llama (seed 0) and the character tokenizer as a loaded base, under the reference `name` (a test puts it
    in Session.bases under that name to run a task on it)."""
    tokenizer = char_tokenizer()
    model = tiny_llama(tokenizer, tied=tied, positions=positions)
    return Base(name, model, tokenizer, fingerprint(model))


def save_tiny_model(path: Path, *, tokenizer=None) -> Path:
    """tiny_llama (untied, seed 0) saved with its tokenizer as a local model folder: what a subprocess or a task
    file's `model:` can load with no hook."""
    tokenizer = tokenizer or char_tokenizer()
    tiny_llama(tokenizer, tied=False).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def expanded(base: Base, new_tokens: tuple[str, ...] = ("<spec>",)) -> tuple[LlamaForCausalLM, object, Expansion]:
    """A copy of the base's model and tokenizer expanded by `new_tokens` (random rows, seed 0), as a run's step 2
    expands them → (model, tokenizer, expansion); the base itself is untouched."""
    model, tokenizer = copy.deepcopy(base.model), copy.deepcopy(base.tokenizer)
    return model, tokenizer, expand(model, tokenizer, list(new_tokens), init="random", seed=0)


# ---------------------------------------------------------------- tiny task data, in memory


def tiny_data() -> TaskData:
    """Multiplication written a<spec>b, over the character vocabulary: 6 training, 3 target examples (groups seen and
    unseen), old text, an old-skill probe (addition) and replay text."""
    mul = lambda a, b, group=None: Example(f"{a}<spec>{b}=", str(a * b), group)
    return TaskData(
        new_tokens=["<spec>"],
        train=[mul(a, b) for a, b in [(3, 4), (7, 2), (12, 5), (9, 9), (40, 3), (6, 6)]],
        target_test=[mul(2, 3, "seen"), mul(8, 7, "unseen"), mul(11, 4, "seen")],
        old_text=["1+2=3", "4*5=20", "33+9=42"],
        old_skill=[Example("5+6=", "11"), Example("20+22=", "42")],
        replay_text=["2+2=4", "9*3=27"],
        eos_is_content=True,  # as tasks/arithmetic.py: an equation ends after its answer
        old_text_break=None,  # as tasks/arithmetic.py: each equation alone after bos
    )


def tiny_plan(base: Base, data: TaskData, method, budget: Budget, method_config=None) -> Plan:
    """A Plan as plan() would make it for a task of `data` (init random, seed 0) and a method (a MethodSpec: a test's
    own, its setup observed or replaced, is the plan's method), for protocol.adapt_and_evaluate; method_config: the
    method's defaults unless given. spec, task, run_id and config are unread there."""
    method_config = method.config() if method_config is None else method_config
    return Plan(None, None, method, "tiny", {}, method_config, base, data, budget, init="random", seed=0)


# ---------------------------------------------------------------- tiny task files

TASK = "tiny-arith"  # write_tiny_task's task
BUDGET = {"n_train": 16, "steps": 6, "batch_size": 4, "eval_batch_size": 64}
PARAMS = {"n_test": 20, "n_old_skill": 20, "n_old_text": 20, "n_replay": 10}
SMALL_PARAMS = {"n_test": 20, "n_old_skill": 10, "n_old_text": 10, "n_replay": 10}  # small_raw's


def write_task_file(directory: Path, name: str = "small", *, raw: dict | None = None, text: str | None = None) -> Path:
    """Write `name`.yaml (raw dict or literal text) with tasks/arithmetic.py beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(builtin_task_dir() / "arithmetic.py", directory / "arithmetic.py")
    path = directory / f"{name}.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def write_tiny_task(
    task_dir: Path,
    model: Path | str,
    *,
    name: str = TASK,
    budget: dict | None = None,
    params: dict | None = None,
    **fields,
) -> Path:
    """tasks/arithmetic.py's generator under the tiny budget (version 1, on `model`); keyword fields override the
    file's top level (with another `generator`, `params` are that generator's alone)."""
    arithmetic = "generator" not in fields
    spec = {
        "name": name,
        "version": 1,
        "description": "arithmetic under a tiny budget, for tests",
        "generator": "arithmetic.py:build",
        "model": str(model),
        "init": "random",
        "budget": {**BUDGET, **(budget or {})},
        "params": {**(PARAMS if arithmetic else {}), **(params or {})},
        **fields,
    }
    return write_task_file(task_dir, name, raw=spec)


def arithmetic_raw() -> dict:
    """tasks/arithmetic.yaml as a dict, read at test time (the task file may gain fields)."""
    return yaml.safe_load((builtin_task_dir() / "arithmetic.yaml").read_text(encoding="utf-8"))


def small_raw(name: str = "small") -> dict:
    """The arithmetic task shrunk to seconds: 3 steps of 4 examples, 8 training examples, tiny eval sets."""
    raw = arithmetic_raw()
    raw["name"] = name
    raw["budget"] = {"n_train": 8, "steps": 3, "batch_size": 4, "eval_batch_size": 16}
    # shrink only the params the current generator knows about
    raw["params"] = {**raw.get("params", {}), **{k: v for k, v in SMALL_PARAMS.items() if k in raw.get("params", {})}}
    raw.pop("profiles", None)
    return raw


# ---------------------------------------------------------------- what a task's runs report

# the metrics that only some tasks' data calls for, one of each kind (every run reports the rest): exact-match
# accuracy, the old skill's, the no-learning and oracle references, stage × task summaries, learned rows read as words
TASK_DEPENDENT = frozenset(
    {
        "target_acc",
        "old_skill_acc",
        "target_loss_nolearn",
        "target_loss_oracle",
        "avg_target_acc",
        "meaning_words_scored",
    }
)


def reported_metrics(data: TaskData, *, adds_tokens: bool) -> set[str]:
    """The metrics of TASK_DEPENDENT a run reports on a task of `data`, read from what the data declares, so that a
    new task brings its own expectation (tests/test_every_method_every_task.py). adds_tokens: the method's
    (MethodSpec.adds_tokens); the control that adds no token reads every set with the base tokenizer."""
    # per-token losses compare only where the target completions tokenize alike with and without the new tokens:
    # no new token in a completion (xling's continuations are written with them), or no token added at all
    alike = not adds_tokens or not any(t in e.completion for e in data.target_test for t in data.new_tokens)
    declared = {
        "target_acc": data.exact_match,  # a short answer matched whole; a free-text continuation never is
        "old_skill_acc": bool(data.old_skill),
        "target_loss_nolearn": alike,
        "target_loss_oracle": bool(data.target_oracle),  # where the task knows what each new token stands for
        "avg_target_acc": bool(data.stages),
        "meaning_words_scored": bool(data.meaning) and adds_tokens,  # the control has no learned rows to read
    }
    return {name for name, reported in declared.items() if reported}
