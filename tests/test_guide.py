"""docs/adding-a-task.md's field tables are the code's: the task file's schema and the task data's fields."""

from pathlib import Path

from clbench.data import TaskData
from clbench.guide import dataclass_table, schema_table, tables
from clbench.taskspec import Budget

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "adding-a-task.md"


def test_the_guide_holds_each_generated_table():
    guide = GUIDE.read_text(encoding="utf-8")
    stale = [table.splitlines()[0] for table in tables() if table not in guide]
    assert stale == [], f"out of date in {GUIDE.name}: {stale}; `python -m clbench.guide` prints them to paste"


def test_the_guide_lists_the_validation_splits_tune_needs():
    assert "| `validation` | `list[Example]` | `[]` |" in dataclass_table(TaskData)
    assert "| `validation_old_text` | `list[str]` | `[]` |" in GUIDE.read_text(encoding="utf-8")


def test_a_schema_row_reads_type_default_and_description():
    rows = schema_table(Budget).splitlines()
    assert rows[2] == (
        "| `n_train` | positive int | required | training examples used: the first `n_train` of the generator's "
        "`train` pool (`--n-train` overrides) |"
    )
    assert rows[-1] == "| `eval_batch_size` | positive int | `64` | scoring batch size |"
