"""lm-eval forgetting checks, in-process: base and adapted model scored as they are in memory.

    clbench run --task arithmetic --method et,fft --lm-eval clbench_old_text,clbench_old_skill
    clbench lm-eval --run RUN_ID --tasks clbench_old_text,hellaswag

The local tasks (clbench/lm_eval_tasks/*.yaml) read the run's own task data, written to a
JSON-lines file for each evaluation: `clbench_old_text` (log-likelihood of the old-vocabulary text
clbench measures forgetting on, read as clbench reads it: running text, each passage after the one before it and
the task's break, or alone after bos with its first token as context; no eos; word and byte perplexity, bits per
byte) and
`clbench_old_skill` (log-likelihood and greedy match of the old-skill probe's completions). Any
other name goes to lm-eval's own registry (online datasets).

lm-eval scores the model as a whole, so the adapted model's numbers are under the full softmax
over V ∪ U (clbench's `forgetting_full` view), never the old-vocabulary one.

Pitfalls handled here (tests/test_lmeval.py):
- lm-eval's response cache (`use_cache`) is keyed by the request alone: base and adapted answers
  would be mixed up. It is never enabled.
- its request cache is keyed by task name and tokenizer name; an expanded tokenizer keeps the
  base's name, and the local tasks keep their names across tasks with different data. Off too.
- HFLM calls `eval()` and `tie_weights()` on the model it wraps; `tie_weights` would re-tie an
  output matrix that a method untied on purpose. Every parameter object is put back right after
  HFLM is built, before anything is scored, and the training mode is restored afterwards.
"""

from __future__ import annotations

import importlib.metadata
import json
import tempfile
from importlib import resources
from pathlib import Path

import yaml

from clbench.data import TaskData, leading_text, preceded
from clbench.errors import ClbenchError
from clbench.storage import ResultStore

LOCAL_TASKS = resources.files("clbench") / "lm_eval_tasks"


def local_tasks() -> dict[str, str]:
    """name → YAML text of the task configs shipped with clbench."""
    return {
        p.name.removesuffix(".yaml"): p.read_text(encoding="utf-8")
        for p in LOCAL_TASKS.iterdir()
        if p.name.endswith(".yaml")
    }


def parse_tasks(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names) or len(set(names)) != len(names):
        raise ClbenchError(f"--lm-eval/--tasks takes distinct comma-separated lm-eval task names, got {text!r}")
    return names


def documents(name: str, data: TaskData, tokenizer) -> list[dict]:
    # clbench scores every sequence as [bos] prompt completion; lm-eval adds no special token to a
    # loglikelihood context, so the prompt carries the bos string (HFLM then adds none of its own)
    bos = tokenizer.bos_token or ""
    if name == "clbench_old_text":
        texts, cut = data.old_text, data.old_text_break
        if cut is not None and len(texts) > 1:
            # running text (clbench/data.py): each text whole after the one before it and the break
            return [{"context": bos + before + cut, "text": text} for before, text in preceded(texts)]
        # alone after bos: a text's first token, predicted from bos alone, is context; a text of one token has
        # nothing scored and is left out, as clbench's own old-text loss scores nothing of it
        heads = [(text, leading_text(tokenizer, text, 1)) for text in texts]
        return [{"context": bos + head, "text": text[len(head) :]} for text, head in heads if text[len(head) :]]
    return [{"prompt": bos + e.prompt, "completion": e.completion} for e in data.old_skill]


def old_text_results(doc: dict, results: list) -> dict:
    """clbench_old_text's process_results: lm-eval's own rolling metrics (word and byte perplexity, bits per byte)
    over what lm-eval scored: doc["text"] after doc["context"] (and the context's trailing whitespace, see below)."""
    from lm_eval.api.task import ConfigurableTask

    # lm-eval moves a context's trailing whitespace into what it scores (TemplateLM._encode_pair): a whitespace break
    # ("\n\n") is scored there, unlike in clbench's own reading, and its bytes are counted with the text's
    context = doc["context"]
    scored = context[len(context.rstrip()) :] + doc["text"]
    (loglikelihood, _), words = results[0], ConfigurableTask.count_words(scored)
    scored_bytes = ConfigurableTask.count_bytes(scored)
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, scored_bytes),
        "bits_per_byte": (loglikelihood, scored_bytes),
    }


def lm_eval_version() -> str:
    return importlib.metadata.version("lm_eval")


class Checker:
    """Scores base and adapted models on a fixed list of lm-eval tasks; base scores computed once per process."""

    def __init__(self, tasks: list[str], batch_size: int = 32):
        from lm_eval.tasks import TaskManager

        self.tasks, self.batch_size, self.local = tasks, batch_size, local_tasks()
        online = [t for t in tasks if t not in self.local]
        # indexing lm-eval's ~14k built-in task files takes ~20 s: only when an online task is asked for
        self.manager = TaskManager(include_defaults=bool(online))
        unknown = [t for t in online if t not in self.manager.all_tasks]
        if unknown:
            raise ClbenchError(
                f"unknown lm-eval task(s) {', '.join(unknown)}; local tasks: {', '.join(sorted(self.local))}"
            )
        self.base_cache: dict[tuple, dict] = {}

    def configs(self, data: TaskData, tokenizer, folder: Path) -> list:
        configs = []
        for name in self.tasks:
            if name not in self.local:
                configs.append(name)
                continue
            docs = documents(name, data, tokenizer)
            if not docs:
                raise ClbenchError(f"lm-eval task {name!r}: this clbench task has no data for it")
            path = folder / f"{name}.jsonl"
            path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
            config = yaml.safe_load(self.local[name]) | {"dataset_kwargs": {"data_files": {"test": str(path)}}}
            # a Python hook in a config dict: what `!function` names in a task file lm-eval loads itself
            configs.append(config | ({"process_results": old_text_results} if name == "clbench_old_text" else {}))
        return configs

    def scores(self, model, tokenizer, data: TaskData) -> dict[tuple[str, str], dict]:
        """(task, metric) → {value, task_version, task_hash} for one model."""
        from lm_eval import simple_evaluate
        from lm_eval.models.huggingface import HFLM

        training, params = model.training, dict(model.named_parameters(remove_duplicate=False))
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.batch_size)
        restore_parameters(model, params)
        try:
            with tempfile.TemporaryDirectory(prefix="clbench-lmeval-") as folder:
                results = simple_evaluate(
                    model=lm,
                    tasks=self.configs(data, tokenizer, Path(folder)),
                    task_manager=self.manager,
                    use_cache=None,
                    cache_requests=False,
                    bootstrap_iters=0,
                    log_samples=True,
                )
        finally:
            model.train(training)
        return flatten(results)

    def compare(self, base, base_tokenizer, base_key: tuple, adapted, tokenizer, data: TaskData) -> list[dict]:
        """One row per (task, metric): base, adapted, delta = adapted − base, versions and hash."""
        if base_key not in self.base_cache:
            self.base_cache[base_key] = self.scores(base, base_tokenizer, data)
        before, after = self.base_cache[base_key], self.scores(adapted, tokenizer, data)
        version = lm_eval_version()
        return [
            {
                "task": task,
                "metric": metric,
                "base": before[task, metric]["value"],
                "adapted": a["value"],
                "delta": a["value"] - before[task, metric]["value"],
                "lm_eval_version": version,
                "task_version": a["task_version"],
                "task_hash": a["task_hash"],
            }
            for (task, metric), a in sorted(after.items())
            if (task, metric) in before
        ]


def restore_parameters(model, params: dict) -> None:
    """Put back every parameter object HFLM's tie_weights() replaced (a method's untied output rows)."""
    for name, param in params.items():
        owner_name, _, attr = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        if getattr(owner, attr) is not param:
            setattr(owner, attr, param)


def flatten(results: dict) -> dict[tuple[str, str], dict]:
    from lm_eval.utils import hash_string

    flat = {}
    for task, metrics in results["results"].items():
        samples = results.get("samples", {}).get(task)
        # the task hash lm-eval's EvaluationTracker writes: documents, prompts and targets as evaluated
        task_hash = (
            hash_string("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples))
            if samples
            else None
        )
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            name = metric if filter_name == "none" else key
            flat[task, name] = {
                "value": float(value),
                "task_version": str(results["versions"].get(task)),
                "task_hash": task_hash,
            }
    return flat


def reconstruct(store: ResultStore, run_id: str, session, task_dirs: list[Path]) -> dict:
    """A finished run's base, data, adapted model and tokenizer, rebuilt by re-running its config
    (clbench/rescore.py rebuild: the same run id, the stored quality metrics reproduced, exactly on CPU)."""
    from clbench.distributed import log
    from clbench.rescore import rebuild

    rebuilt = rebuild(store, run_id, session, task_dirs)
    if rebuilt.largest_difference > 1e-6:
        log(f"  warning: run {run_id} did not rebuild exactly ({rebuilt.why()}); lm-eval scores the rebuilt model")
    return rebuilt.captured


def check_run(
    store: ResultStore,
    run_id: str,
    checker: Checker,
    captured: dict | None,
    session,
    task_dirs: list[Path],
    *,
    only_missing: bool = False,
) -> list[dict]:
    """lm-eval rows for one run, recorded; `captured` is the in-memory adapted model, or None to rebuild it.

    only_missing: a run that already has rows for every task is left as it is (resumed `clbench run`)."""
    if only_missing and captured is None:
        done = store.query("SELECT * FROM lm_eval WHERE run_id = ?", [run_id])
        if set(checker.tasks) <= set(done.task):
            return done[done.task.isin(checker.tasks)].to_dict("records")
    captured = captured or reconstruct(store, run_id, session, task_dirs)
    base, data = captured["base"], captured["data"]
    rows = checker.compare(
        base.model,
        base.tokenizer,
        (base.fingerprint, data.fingerprint()),
        captured["model"],
        captured["tokenizer"],
        data,
    )
    store.record_lm_eval(run_id, rows)
    return rows


def format_rows(run_id: str, rows: list[dict]) -> str:
    lines = [
        f"{run_id}  {r['task']:<20} {r['metric']:<16} base {r['base']:.6g}  adapted {r['adapted']:.6g}  delta {r['delta']:+.6g}"
        for r in rows
    ]
    return "\n".join(lines)
