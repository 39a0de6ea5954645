"""Bad input never trains and never writes: each case ends with exit 2 and one line naming the problem.

Every case runs `clbench run` next to a results DB that holds one finished run and asserts: exit code
≠ 0; exactly one `clbench: error:` line on stderr, naming the problem (the only other stderr line allowed
is the `loading base model …` progress line); no traceback; every file under the test's folder — the DB
first — byte-identical afterwards, and no file created anywhere else the command pointed at.
Default tier: in process through clbench.cli.main with the file descriptors captured; slow tier: the
same cases as real subprocesses.
"""

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest
import torch
from safetensors.torch import load_file
from tiny_setup import cli_env, run_clbench
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from clbench.arith import char_tokenizer
from clbench.cli import main
from clbench.data import Example, TaskData, encode_examples, read_all, unknown_text
from clbench.testing import TASK, save_tiny_model, write_tiny_task

READ_ONLY_DIR = Path("/sys")  # refuses new files even to root (chmod does not): EACCES, or EROFS in containers


class Case:
    """A workspace for one case: a copy of the reference DB, the tiny model and task, room for bad files."""

    def __init__(self, tiny_cli, root: Path, reference_db: Path):
        self.tiny_cli, self.root = tiny_cli, root
        self.db = root / "results.duckdb"
        shutil.copy(reference_db, self.db)

    def run(self, *extra: str, task_dir: Path | None = None) -> list[str]:
        # argparse keeps the last of a repeated option, so a case overrides --task/--method/--db by repeating it
        return [
            "run",
            "--task",
            TASK,
            "--method",
            "et",
            "--task-dir",
            str(task_dir or self.tiny_cli.tasks),
            "--db",
            str(self.db),
            *extra,
        ]

    def task(self, name: str = TASK, **fields) -> Path:
        """A task folder holding tiny-arith with some fields changed; → the folder."""
        folder = self.root / f"tasks-{name}"
        write_tiny_task(folder, self.tiny_cli.model, name=name, **fields)
        return folder

    def generator_task(self, source: str, *, files: dict[str, bytes] | None = None, **fields) -> Path:
        """A task folder whose generator is `source` (defines Params and build), with some top-level fields
        set; → the folder."""
        folder = self.root / "tasks-custom"
        folder.mkdir()
        (folder / "custom.py").write_text(source)
        for name, content in (files or {}).items():
            (folder / name).write_bytes(content)
        write_tiny_task(folder, self.tiny_cli.model, name="custom", generator="custom.py:build", **fields)
        return folder

    def file(self, name: str, content: bytes) -> Path:
        path = self.root / name
        path.write_bytes(content)
        return path


GENERATOR = """
from pathlib import Path
from pydantic import BaseModel, ConfigDict
from clbench.data import Example, TaskData

class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

def build(params, tokenizer):
    examples = [Example(f"{a}<x>2=", str(2 * a)) for a in range(20)]
    return TaskData(new_tokens=NEW_TOKENS, train=examples, target_test=examples, old_text=OLD_TEXT)
"""

# `-` is no character of the arithmetic tokenizer: without an opt-in, old text the base reads as <unk> is refused
UNREADABLE_OLD_TEXT = GENERATOR.replace("NEW_TOKENS", '["<x>"]').replace("OLD_TEXT", '["1+1=2", "9-3=6"]')


def bpe_model(case: Case) -> Path:
    """A tiny_cli model whose byte-level BPE vocabulary has the word " times" as one token, "Ġtimes"."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["three times four is twelve", "2 times 3 = 6"] * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    return save_tiny_model(case.root / "bpe-model", tokenizer=fast)


def pickle_model(case: Case) -> Path:
    """A model folder whose weights are a pickle (pytorch_model.bin), not safetensors."""
    folder = save_tiny_model(case.root / "pickle-model")
    weights = {}
    for shard in folder.glob("*.safetensors"):
        weights.update(load_file(shard))
        shard.unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    return folder


def foreign_db(case: Case) -> Path:
    path = case.root / "other-app.duckdb"
    with duckdb.connect(str(path)) as db:
        db.execute("CREATE TABLE runs (id INTEGER, name VARCHAR); INSERT INTO runs VALUES (1, 'not ours')")
    return path


# (id, argv from a Case, what the one error line must contain)
CASES = [
    (
        "unknown-task",
        lambda c: c.run("--task", "tiny-arihtmetic"),
        "unknown task 'tiny-arihtmetic' (did you mean 'tiny-arith'?)",
    ),
    ("unknown-method", lambda c: c.run("--method", "ett"), "unknown method 'ett' (did you mean 'et'?)"),
    (
        "malformed-yaml",
        lambda c: c.run(task_dir=_mkdir(c.root / "yaml", {"broken.yaml": b"name: [unclosed\n"})),
        "broken.yaml is not valid YAML (line 2)",
    ),
    (
        "unknown-key-in-task-file",
        lambda c: c.run(task_dir=c.task(learning_rate=0.1)),
        "learning_rate: Extra inputs are not permitted",
    ),
    (
        "unknown-key-in-params",
        lambda c: c.run(task_dir=c.task(params={"operater": "<x>"})),
        "params: operater: Extra inputs are not permitted",
    ),
    (
        "wrong-type-in-task-file",
        lambda c: c.run(task_dir=c.task(budget={"steps": "many"})),
        "budget.steps: Input should be a valid integer",
    ),
    ("wrong-type-option", lambda c: c.run("--set", "lr=fast"), "option 'lr' needs a float, got 'fast'"),
    (
        "new-token-in-base-vocabulary",
        lambda c: c.run(task_dir=c.task(params={"operator": "*"})),
        "new token(s) already in the base vocabulary: ['*']",
    ),
    (
        "duplicate-new-tokens",
        lambda c: c.run(
            "--task",
            "custom",
            task_dir=c.generator_task(
                GENERATOR.replace("NEW_TOKENS", '["<x>", "<x>"]').replace("OLD_TEXT", '["1+1=2"]')
            ),
        ),
        "duplicate new tokens: ['<x>']",
    ),
    (
        "empty-training-set",
        lambda c: c.run(task_dir=c.task(params={"n_test": 1000})),
        "the generator produced an empty train, target or old-text set",
    ),
    (
        "n-train-larger-than-data",
        lambda c: c.run("--n-train", "100000"),
        "n_train 100000 exceeds the 880 training examples",
    ),
    (
        "zero-steps",
        lambda c: c.run(task_dir=c.task(budget={"steps": 0})),
        "budget.steps: Input should be greater than 0",
    ),
    (
        "zero-learning-rate",
        lambda c: c.run("--set", "lr=0"),
        "method 'et': lr must be a positive finite number, got 0.0",
    ),
    (
        "negative-learning-rate",
        lambda c: c.run("--method", "fft", "--set", "lr=-1e-3"),
        "method 'fft': lr must be a positive finite number, got -0.001",
    ),
    ("nan-learning-rate", lambda c: c.run("--set", "lr=nan"), "lr must be a positive finite number, got nan"),
    (
        "unknown-init-strategy",
        lambda c: c.run("--init", "zeros"),
        "unknown init strategy 'zeros'; known: random, mean, subword-mean",
    ),
    (
        "unknown-init-in-task-file",
        lambda c: c.run(task_dir=c.task(init="zeros")),
        "init 'zeros' is not one of random, mean, subword-mean",
    ),
    (
        "model-path-missing",
        lambda c: c.run("--model", str(c.root / "no-such-model")),
        "no-such-model' does not exist or is not a directory",
    ),
    ("model-weights-not-safetensors", lambda c: c.run("--model", str(pickle_model(c))), "model.safetensors"),
    ("unknown-builtin-model", lambda c: c.run("--model", "builtin:nope"), "unknown builtin model 'builtin:nope'"),
    (
        "corrupt-db",
        lambda c: c.run("--db", str(c.file("garbage.duckdb", b"not a database\n" * 300))),
        "not a valid DuckDB database file",
    ),
    (
        "truncated-db",
        lambda c: c.run("--db", str(c.file("truncated.duckdb", c.db.read_bytes()[:4096]))),
        "cannot open results database",
    ),
    (
        "db-of-another-application",
        lambda c: c.run("--db", str(foreign_db(c))),
        "is not a clbench results database (table runs lacks",
    ),
    (
        "db-in-read-only-directory",
        lambda c: c.run("--db", str(READ_ONLY_DIR / "clbench-results.duckdb")),
        f"cannot create results database in {READ_ONLY_DIR}",
    ),
    # a directory selects the record store; one holding other files is not one
    ("db-path-is-a-foreign-directory", lambda c: c.run("--db", str(c.root)), "is not a clbench record store"),
    (
        "db-record-store-is-a-file",
        lambda c: c.run("--db", str(_mkdir(c.root / "plain", {"results": b"x"}) / "results") + "/"),
        "is a file, not a directory",
    ),
    ("db-folder-missing", lambda c: c.run("--db", str(c.root / "nowhere" / "r.duckdb")), "nowhere does not exist"),
    ("seeds-malformed", lambda c: c.run("--seeds", "0,,1"), "--seeds must be comma-separated integers, got '0,,1'"),
    ("seeds-repeated", lambda c: c.run("--seeds", "0,0"), "--seeds must be distinct non-negative integers, got '0,0'"),
    ("conflicting-flags", lambda c: c.run("--method", "et,fft", "--set", "lr=1e-3"), "--set applies to one method"),
    (
        "non-utf8-task-file",
        lambda c: c.run(task_dir=_mkdir(c.root / "latin", {"latin.yaml": "name: caf\u00e9\n".encode("latin-1")})),
        "'utf-8' codec can't decode",
    ),
    (
        "non-utf8-data-file",
        lambda c: c.run(
            "--task",
            "custom",
            task_dir=c.generator_task(
                GENERATOR.replace("NEW_TOKENS", '["<x>"]').replace(
                    "OLD_TEXT", 'Path(__file__).with_name("old.txt").read_text(encoding="utf-8").split()'
                ),
                files={"old.txt": "1+1=2 caf\u00e9".encode("latin-1")},
            ),
        ),
        "task 'custom': cannot read its data: 'utf-8' codec can't decode",
    ),
    (
        "old-text-the-base-cannot-represent",
        lambda c: c.run("--task", "custom", task_dir=c.generator_task(UNREADABLE_OLD_TEXT)),
        "clbench: error: old text example 1 '9-3=6': the tokenizer reads '-' as '<unk>' "
        "(1 of 2 examples; `allow_unknown_tokens: true` in the task file accepts that)",
    ),
    (
        "sequence-longer-than-context",
        lambda c: c.run(task_dir=c.task(params={"template": "0" * 40 + "{a}{op}{b}="})),
        "exceeds the model context of 32",
    ),
    (
        "new-token-collides-with-a-word",
        lambda c: c.run("--model", str(bpe_model(c)), task_dir=c.task(params={"operator": "times"})),
        "new token 'times' collides with the base vocabulary's word 'Ġtimes'",
    ),
    (
        "task-dir-missing",
        lambda c: c.run(task_dir=c.root / "no-such-tasks"),
        "no-such-tasks does not exist or is not a folder",
    ),
    ("n-train-zero", lambda c: c.run("--n-train", "0"), "expected a positive integer, got '0'"),
    ("set-unknown-option", lambda c: c.run("--set", "momentum=0.9"), "method 'et' has no option 'momentum'"),
    ("set-without-value", lambda c: c.run("--set", "lr"), "--set takes KEY=VALUE, got 'lr'"),
    ("unknown-profile", lambda c: c.run("--profile", "papr"), "task 'tiny-arith' has no profile 'papr'"),
    (
        "generator-file-missing",
        lambda c: c.run(task_dir=c.task(generator="missing.py:build")),
        "missing.py does not exist",
    ),
    (
        "task-file-name-mismatch",
        lambda c: c.run(task_dir=_rename(c.task(), TASK + ".yaml", "other.yaml")),
        "the file name must be the task name",
    ),
    ("misspelt-flag", lambda c: c.run("--sedes", "1"), "unrecognized arguments: --sedes 1"),
    (
        "device-map-on-a-builtin",
        lambda c: c.run("--model", "builtin:arith-llama", "--device-map", "auto"),
        "--device-map is for hub and local models",
    ),
    (
        "device-map-with-device",
        lambda c: c.run("--device-map", "auto", "--device", "cpu"),
        "--device-map places the model itself; leave --device at auto",
    ),
    (
        "replay-without-replay-text",
        lambda c: c.run("--method", "replay", task_dir=c.task(params={"n_replay": 0})),
        "method 'replay' reads old text through its training_examples hook, and task 'tiny-arith' has no replay_text",
    ),
    (
        "ewc-without-replay-text",
        lambda c: c.run("--method", "ewc", task_dir=c.task(params={"n_replay": 0})),
        "method 'ewc' reads old text through its training_examples hook, and task 'tiny-arith' has no replay_text",
    ),
    (
        "device-map-unknown",
        lambda c: c.run("--device-map", "balanced"),
        "argument --device-map: invalid choice: 'balanced'",
    ),
]


def _mkdir(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir()
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder


def _rename(folder: Path, old: str, new: str) -> Path:
    (folder / old).rename(folder / new)
    return folder


def snapshot(root: Path) -> dict[str, str]:
    # __pycache__: Python's own bytecode cache of a task's generator, not clbench's writing
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def reference_db(tiny_cli, tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("bad-input") / "results.duckdb"
    assert main(tiny_cli.run_args(db, "--method", "et")) == 0
    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("SELECT count(*) FROM runs WHERE status = 'finished'").fetchone() == (1,)
    return db


@pytest.mark.parametrize("runner", ["in-process", pytest.param("subprocess", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name, argv, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_ends_with_one_line_and_changes_nothing(
    name, argv, expected, runner, tiny_cli, reference_db, tmp_path, capfd, monkeypatch
):
    case = Case(tiny_cli, tmp_path, reference_db)
    args = argv(case)
    before = snapshot(tmp_path)
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path.parent / f"{tmp_path.name}-cache"))
    if runner == "in-process":
        # as in a `clbench` process, whose HF_HUB_DISABLE_PROGRESS_BARS is set before transformers is imported
        transformers_logging.disable_progress_bar()
        capfd.readouterr()
        code, err = main(args), capfd.readouterr().err
    else:
        done = run_clbench(args, cli_env(tmp_path.parent / f"{tmp_path.name}-cache"))
        code, err = done.returncode, done.stderr

    assert code == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("clbench: error: ")]
    assert len(errors) == 1 and expected in errors[0], err
    assert all(line.startswith("loading base model ") for line in lines if line not in errors), err
    transformers_logging.enable_progress_bar()
    assert snapshot(tmp_path) == before
    assert not (READ_ONLY_DIR / "clbench-results.duckdb").exists()


def test_unreadable_old_text_runs_when_the_task_opts_in_and_the_run_records_it(tiny_cli, reference_db, tmp_path):
    case = Case(tiny_cli, tmp_path, reference_db)
    folder = case.generator_task(UNREADABLE_OLD_TEXT, allow_unknown_tokens=True)
    assert main(case.run("--task", "custom", task_dir=folder)) == 0
    with duckdb.connect(str(case.db), read_only=True) as db:
        configs = dict(db.execute("SELECT task, config FROM runs WHERE status = 'finished'").fetchall())
    assert json.loads(configs["custom"])["allow_unknown_tokens"] is True
    # recorded only where set: a task without it keeps the config, and so the run_id, it always had
    assert "allow_unknown_tokens" not in json.loads(configs["tiny-arith"])


def test_unknown_text_names_at_most_ten_pieces_and_skips_a_tokenizer_without_unk():
    tokenizer, examples = char_tokenizer(), [Example("", "1+1=2"), Example("12*", "abcdefghijkl")]
    encoded = encode_examples(tokenizer, examples, 64)
    assert unknown_text(tokenizer, "old skill", examples, encoded) == (
        "old skill example 1 '12*abcdefghijkl': the tokenizer reads 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j' "
        "and 2 more as '<unk>' (1 of 2 examples; `allow_unknown_tokens: true` in the task file accepts that)"
    )
    tokenizer.unk_token = None  # nothing can become an unknown token: nothing is checked
    assert read_all(tokenizer, tokenizer, TaskData([], examples, examples, ["xyz"]), 2, 64, allow_unknown=False) == []
