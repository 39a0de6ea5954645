"""Every registered method on every registered task, through the one protocol, on a tiny model.

The real bases make this hours of CPU; a tiny tied Llama over the character vocabulary runs each
pair in seconds and still exercises what differs between tasks: stages, whole-word tokens,
replay text, old-skill probes, byte counts. Each pair must finish with finite target and
forgetting numbers, and a method declared frozen_backbone must leave old-vocabulary text exactly
as the base had it.
"""

import dataclasses
import math

import pytest
import torch
from test_methods import FROZEN_BACKBONE
from transformers import LlamaConfig, LlamaForCausalLM

from clbench.arith import char_tokenizer
from clbench.method import methods
from clbench.models import Base, fingerprint
from clbench.protocol import Session, run_one
from clbench.store import Store
from clbench.taskspec import Task, load_tasks


def tiny_tied_base() -> Base:
    torch.manual_seed(0)
    tokenizer = char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    return Base("tiny-tied", model, tokenizer, fingerprint(model))


def read_by_characters(task: Task) -> Task:
    """The task with its explicit opt-in to unknown text: the tiny base's character tokenizer knows only the
    arithmetic characters, so the text tasks' words would be refused as <unk>."""
    return dataclasses.replace(task, spec=task.spec.model_copy(update={"allow_unknown_tokens": True}))


@pytest.fixture(scope="module")
def session():
    session = Session(device="cpu")
    session.bases["tiny-tied"] = tiny_tied_base()
    return session


@pytest.mark.parametrize("task_name", load_tasks().names())
@pytest.mark.parametrize("method_name", methods().names())
def test_method_runs_on_task(task_name, method_name, session, tmp_path):
    task, method = read_by_characters(load_tasks().get(task_name)), methods().get(method_name)
    outcome = run_one(
        task, method, seed=0, store=Store(tmp_path / "r.duckdb"), session=session, model="tiny-tied", n_train=4
    )
    assert outcome.status == "finished", outcome.reason
    values = outcome.metrics
    for name in ("target_loss", "target_loss_full", "forgetting_oldvocab", "forgetting_full"):
        assert math.isfinite(values[name]), name
    if method_name in FROZEN_BACKBONE:  # old text's hidden states are the base's: not pt, whose prompt precedes it
        assert values["forgetting_oldvocab"] == 0.0
        assert values.get("old_skill_acc_delta", 0.0) == 0.0
