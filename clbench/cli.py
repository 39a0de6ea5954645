"""clbench's command line: a thin layer over importable functions.

clbench run --task all --method et
clbench run --task arithmetic --method et,fft --seeds 0,1,2
clbench ls tasks | methods ; clbench validate ; clbench results
clbench leaderboard --out leaderboard/out

A command is declared once, by @command above its function: its name, help and options (flags of OPTIONS, with
the command's own overrides). Modules that import torch, pandas or duckdb are imported inside the commands that
need them: `--help` and a bad flag answer in a tenth of a second, and `merge`, `export` and `push` run without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clbench import executors
from clbench.errors import ClbenchError
from clbench.live import TRACKERS, live_log
from clbench.lrsearch import merged_search
from clbench.spec import RunSpec

DEFAULT_DB = "clbench-results.duckdb"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise ClbenchError(f"{message} (see `{self.prog} --help`)")


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ClbenchError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ClbenchError(f"--seeds must be distinct non-negative integers, got {text!r}")
    return seeds


def parse_options(pairs: list[str], flag: str = "--set") -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ClbenchError(f"{flag} takes KEY=VALUE, got {pair!r}")
        options[key] = value
    return options


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


KV = {"action": "append", "default": [], "metavar": "KEY=VALUE"}
# every option, declared once; a command names those it takes (with overrides where its meaning differs)
OPTIONS = {
    "--task": {"required": True, "help": "task names, comma-separated, or 'all'"},
    "--method": {"required": True, "help": "method names, comma-separated, or 'all'"},
    "--model": {"help": "base model: builtin:NAME, a local path or a Hugging Face id (default: the task's)"},
    "--profile": {"help": "a task profile, e.g. 'paper' for the paper's models and budgets"},
    "--seeds": {"default": "0", "help": "comma-separated seeds (default: 0)"},
    "--init": {"help": "initialisation of the new rows (default: the task's)"},
    "--n-train": {"type": positive_int, "help": "override the task's number of training examples"},
    "--set": {**KV, "help": "method option, e.g. lr=1e-3"},
    "--param": {**KV, "help": "override a task param, e.g. n_test=50"},
    "--budget": {**KV, "help": "override a budget key, e.g. steps=20"},
    "--tuned": {
        "action": "store_true",
        "help": "take each method's lr from `clbench tune`'s choice in --db (refused where there is none); "
        "without it, the lr the task file ships for its profile, else the method's default",
    },
    "--trust-remote-code": {"action": "store_true", "help": "allow a hub model's own code to run"},
    "--device": {"default": "auto", "help": "auto (the GPU if torch sees one), cpu, cuda or cuda:N"},
    "--device-map": {
        "choices": ["auto"],
        "help": "auto: place a hub/local model too large for one GPU across all of them (transformers' "
        "device_map; never moved, never copied)",
    },
    "--db": {
        "default": os.environ.get("CLBENCH_DB", DEFAULT_DB),
        "help": f"results: a DuckDB file, or DIR/ for the record store (many processes, shared filesystem; "
        f"docs/scale.md) (default: {DEFAULT_DB} or $CLBENCH_DB)",
    },
    "--task-dir": {"action": "append", "type": Path, "default": [], "help": "extra folder of task YAML files"},
    "--lm-eval": {
        "metavar": "TASKS",
        "help": "also score base and adapted model in-process with these lm-eval tasks, e.g. "
        "clbench_old_text,clbench_old_skill (shipped, offline) or any lm-eval task name (online)",
    },
    "--log-samples": {
        "action": "store_true",
        "help": "also store each target and old-text example's scores and first-position predictions (table "
        "samples); not part of the run's config: a finished run is not rerun for them",
    },
    "--log": {
        "choices": TRACKERS,
        "help": "also send each run's training curves and metrics to this tracker as they come (its package "
        "must be installed)",
    },
    "--wide": {
        "action": "store_true",
        "help": "the results in one table with every headline metric, however wide (default: per task, the "
        "headline metrics that fit 120 columns)",
    },
    "--metrics": {
        "metavar": "A,B",
        "help": "the results in one table with exactly these metrics, comma-separated, e.g. target_acc,forgetting_full",
    },
    "--out": {"type": Path, "help": "output file"},
}
ONE_TASK = {"help": "one task name"}


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    flags: list[str]  # in the order --help lists them: OPTIONS' flags, the command's own and positionals
    own: dict[str, dict]  # flag → argparse keywords over OPTIONS' (where its meaning differs) or in place of them
    function: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}  # in declaration order, the order `clbench --help` lists them


def command(name: str, help: str, flags: str, own: dict[str, dict] | None = None):
    """Declares the command the decorated function runs; flags: space-separated."""

    def declare(function: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = Command(name, help, flags.split(), own or {}, function)
        return function

    return declare


def build_parser() -> Parser:
    parser = Parser(prog="clbench", description="Continual-learning benchmark for vocabulary expansion in LMs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for declared in COMMANDS.values():
        sub = commands.add_parser(declared.name, help=declared.help)
        for flag in declared.flags:
            sub.add_argument(flag, **{**OPTIONS.get(flag, {}), **declared.own.get(flag, {})})
    return parser


def spec_arguments(args, n_methods: int) -> dict:
    """RunSpec.make's keywords from the flags of run, tune and sweep: --model, --profile, --init, --set (for one
    method), --budget, and those of --n-train, --tuned and --param the command takes."""
    given = vars(args)
    how = {"model": args.model, "profile": args.profile, "init": args.init}
    how |= {"options": method_options(args.set, n_methods), "budget_overrides": parse_options(args.budget, "--budget")}
    how |= {name: given[name] for name in ("n_train", "tuned") if name in given}
    if "param" in given:
        how["param_overrides"] = parse_options(args.param, "--param")
    return how


def method_options(pairs: list[str], n_methods: int) -> dict[str, str]:
    """--set KEY=VALUE (repeatable) → {KEY: VALUE}, for one method only: each method has its own options."""
    options = parse_options(pairs)
    if options and n_methods > 1:
        raise ClbenchError("--set applies to one method; name a single --method with it")
    return options


def summary_view(args) -> dict:
    """summary()'s keywords from --wide and --metrics, names checked."""
    from clbench.report.summary import metric_names

    if args.wide and args.metrics:
        raise ClbenchError("--wide shows every headline metric and --metrics the ones named: give one")
    return {"wide": args.wide, "metrics": metric_names(args.metrics) if args.metrics else None}


@command(
    "run",
    "run tasks × methods × seeds; only what is missing from the DB",
    "--task --method --model --profile --seeds --init --n-train --set --param --budget --tuned --trust-remote-code "
    "--device --device-map --db --task-dir --lm-eval --log-samples --log --wide --metrics",
)
def cmd_run(args) -> int:
    from clbench import distributed
    from clbench.method import methods
    from clbench.protocol import plan
    from clbench.records import open_store
    from clbench.report.summary import summary
    from clbench.session import Session
    from clbench.taskspec import load_tasks

    tasks, registry = load_tasks(args.task_dir), methods()
    specs = run_specs(args, tasks.resolve(args.task), registry.resolve(args.method))
    view = summary_view(args)
    main = distributed.is_main()
    store = open_store(args.db)
    session = Session(trust_remote_code=args.trust_remote_code, device=args.device, device_map=args.device_map)
    if main:  # launched as several processes, only the main one touches the store (clbench/distributed.py)
        store.check()
    checker = lm_eval_checker(args.lm_eval) if args.lm_eval else None  # bad task names fail before any training
    live = live_log(args.log) if args.log else None  # a tracker that is not installed fails before any training
    # every run is planned, so its input checked, before the first one trains or writes
    plans = [
        plan(spec, tasks.get(spec.task), registry.get(spec.method), session=session, tuned_choice=store.tuned)
        for spec in specs
    ]
    outcomes = execute_all(plans, store, session, args, checker, live)
    distributed.close()
    if not main:
        return 0  # the other processes trained in lockstep; the main one reports
    failed = report_statuses([o.status for o in outcomes], args.db)
    print(summary(store, [o.run_id for o in outcomes], **view))
    return 1 if failed else 0


def run_specs(args, task_names: list[str], method_names: list[str]) -> list[RunSpec]:
    """`clbench run`'s arguments → one RunSpec per task × method × seed, every flag checked first."""
    from clbench import distributed
    from clbench.devices import resolve_device

    seeds, how = parse_seeds(args.seeds), spec_arguments(args, len(method_names))
    resolve_device(args.device)  # a bad --device fails before any model is loaded
    if args.device_map and args.device != "auto":
        raise ClbenchError("--device-map places the model itself; leave --device at auto")
    if distributed.launched() and (args.device_map or args.lm_eval):
        # each process would place a whole model across every GPU; lm-eval scores in one process
        raise ClbenchError(
            f"{'--device-map' if args.device_map else '--lm-eval'} runs in one process, not under "
            "accelerate launch (for --lm-eval: `clbench lm-eval --run RUN_ID` afterwards)"
        )
    return [
        RunSpec.make(task, method, seed=seed, **how)
        for task in task_names
        for method in method_names
        for seed in seeds
    ]


def execute_all(plans: list, store, session, args, checker, live) -> list:
    """execute_checked() each plan in turn; of several, each announced with the time left (progress)."""
    from clbench.distributed import log

    outcomes, seconds = [], []
    for number, planned in enumerate(plans, 1):
        if len(plans) > 1:
            log(progress(number, len(plans), seconds))
        started = time.monotonic()
        outcomes.append(execute_checked(planned, store, session, args, checker, live))
        if outcomes[-1].status == "finished":  # a skipped run takes no time, and would pull the estimate down
            seconds.append(time.monotonic() - started)
    return outcomes


def progress(number: int, total: int, seconds: list[float]) -> str:
    """ "run 3/8", with the time this run and the rest will take at the mean of the finished runs' seconds."""
    line = f"run {number}/{total}"
    if not seconds:
        return line
    minutes = round((total - number + 1) * sum(seconds) / len(seconds) / 60)
    return f"{line}: about {minutes} min left" if minutes else f"{line}: under a minute left"


def execute_checked(planned, store, session, args, checker, live):
    """execute() one plan; with --lm-eval, the lm-eval tasks on its adapted model (a run already in the store is
    rebuilt for them)."""
    from clbench.lmeval import check_run, format_rows
    from clbench.protocol import execute

    captured = {}
    keep = lambda base, data, model, tokenizer: captured.update(base=base, data=data, model=model, tokenizer=tokenizer)
    outcome = execute(
        planned,
        store=store,
        session=session,
        log_samples=args.log_samples,
        live=live,
        on_adapted=keep if checker else None,
    )
    if checker and outcome.status in ("finished", "skipped"):  # not failed, nor left to another process
        rows = check_run(store, outcome.run_id, checker, captured or None, session, args.task_dir, only_missing=True)
        print(format_rows(outcome.run_id, rows), file=sys.stderr)
    return outcome


def report_statuses(statuses: list[str], db: str) -> int:
    """One stderr line on what a command did; → the number of failed runs."""
    counts = {s: statuses.count(s) for s in ("finished", "skipped", "failed", "busy")}
    print(
        f"{len(statuses)} runs: {counts['finished']} finished, {counts['skipped']} already in {db}, {counts['failed']} failed",
        file=sys.stderr,
    )
    if counts["busy"]:
        print(f"{counts['busy']} run(s) left to other live processes that hold them", file=sys.stderr)
    return counts["failed"]


def lm_eval_checker(text: str, batch_size: int = 32):
    from clbench.lmeval import Checker, parse_tasks

    return Checker(parse_tasks(text), batch_size)


@command(
    "tune",
    "choose each method's lr on the task's validation split (never its test sets); store the choice",
    "--task --method --seeds --grid --past-edges --model --profile --init --set --param --budget --device --db "
    "--task-dir",
    {
        "--task": ONE_TASK,
        "--seeds": {"help": "comma-separated seeds; the choice minimises their mean"},
        "--grid": {"help": "comma-separated learning rates (default: each method's declared grid)"},
        "--past-edges": {
            "type": positive_int,
            "default": 0,
            "metavar": "N",
            "help": "while a choice sits on an edge of its search, up to N more lrs, each one grid step past it "
            "(default: none)",
        },
        "--set": {"help": "another method option"},
    },
)
def cmd_tune(args) -> int:
    from clbench.devices import resolve_device
    from clbench.method import methods
    from clbench.records import open_store
    from clbench.session import Session
    from clbench.taskspec import load_tasks
    from clbench.tune import table, tune

    task, registry = load_tasks(args.task_dir).get(args.task), methods()
    chosen = [registry.get(name) for name in registry.resolve(args.method)]
    how = spec_arguments(args, len(chosen))
    grid = parse_grid(args.grid) if args.grid else None
    seeds = parse_seeds(args.seeds)
    resolve_device(args.device)
    store = open_store(args.db)
    store.check()
    session = Session(device=args.device)
    choices = tune(
        task, chosen, seeds=seeds, store=store, session=session, grid=grid, past_edges=args.past_edges, **how
    )
    print(table(choices))
    return 0


def parse_grid(text: str) -> list[float]:
    try:
        grid = [float(s) for s in text.split(",")]
    except ValueError:
        raise ClbenchError(f"--grid must be comma-separated learning rates, got {text!r}") from None
    if any(not (lr > 0 and lr < float("inf")) for lr in grid) or len(set(grid)) != len(grid):
        raise ClbenchError(f"--grid must be distinct positive finite learning rates, got {text!r}")
    return grid


@command("ls", "list tasks or methods", "what --task-dir", {"what": {"choices": ["tasks", "methods"]}})
def cmd_ls(args) -> int:
    from clbench.method import methods
    from clbench.taskspec import load_tasks

    if args.what == "tasks":
        for name, task in ((n, load_tasks(args.task_dir).get(n)) for n in load_tasks(args.task_dir)):
            print(f"{name:<16} v{task.spec.version}  {task.spec.model:<24} {task.spec.description}")
    else:
        for name in methods():
            spec = methods().get(name)
            options = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(spec.config_cls))
            print(f"{name:<10} {spec.description}  [{options}]")
    return 0


@command(
    "validate",
    "check task files (schema, params, generator; new tokens and unknown text against the model's tokenizer)",
    "tasks --profile --model --task-dir",
    {
        "tasks": {
            "nargs": "*",
            "metavar": "TASK_OR_FILE",
            "help": "task names or task YAML files (default: every task)",
        },
        "--profile": {"help": "check the data of this profile (default: the task's own)"},
        "--model": {"help": "check against this model's tokenizer (default: the task's or profile's)"},
    },
)
def cmd_validate(args) -> int:
    """Every problem is one line on stderr (exit 2); a task whose model's tokenizer is not on this machine
    is built with the character tokenizer and says its tokenizer was not checked (exit 0)."""
    problems, tokenizers = [], {}
    for task in validated_tasks(args):
        try:
            summary, found = check_task(task, args.profile, args.model, tokenizers)
        except ClbenchError as error:  # the task's own messages name it
            summary, found = None, [str(error)]
        problems += found
        if not found:
            print(f"ok  {summary}")
    for problem in problems:
        print(f"clbench: error: {problem}", file=sys.stderr)
    return 2 if problems else 0


def validated_tasks(args) -> list:
    """The tasks named (registry names, or paths to task files anywhere), else every task."""
    from clbench.taskspec import load_task_file, load_tasks

    def one(name: str):
        path = Path(name)
        if path.suffix in (".yaml", ".yml") or path.is_file():
            return load_task_file(path)
        return load_tasks(args.task_dir).get(name)

    if args.tasks:
        return [one(name) for name in args.tasks]
    registry = load_tasks(args.task_dir)
    return [registry.get(name) for name in registry]


def check_task(task, profile: str | None, model: str | None, tokenizers: dict) -> tuple[str, list[str]]:
    """Builds the task's data with its model's tokenizer (weights are not loaded) and makes the checks a run's
    preflight makes on it. tokenizers: model → tokenizer (or why there is none), shared across tasks.
    → (summary, problems)."""
    from clbench.arith import char_tokenizer

    for other in task.spec.profiles:
        task.resolved(other)
    default_model, budget, params = task.resolved(profile)
    model = model or default_model
    tokenizer = tokenizer_of(model, tokenizers)
    offline = isinstance(tokenizer, str)
    data = task.build(params, char_tokenizer() if offline else tokenizer)  # a generator needs some tokenizer
    summary = (
        f"{task.name} v{task.spec.version}: {len(data.new_tokens)} new tokens, {len(data.train)} train, "
        f"{len(data.target_test)} target, {len(data.old_text)} old-text, {len(data.validation)} validation"
    )
    if short := data.shortfall(params):
        summary += f" ({short})"
    try:
        problems = data_problems(task, data, budget.n_train, tokenizer)
    except ClbenchError as error:
        problems = [str(error)]
    where = f"task {task.name!r}" if offline else f"task {task.name!r} with {model}'s tokenizer"
    return (f"{summary}; {tokenizer}" if offline else summary), [f"{where}: {p}" for p in problems]


def data_problems(task, data, n_train: int, tokenizer) -> list[str]:
    """protocol.data_problems: every set a run would read as <unk>, one line each; with no tokenizer here (a str
    saying why), the count of training examples alone."""
    from clbench import protocol

    if isinstance(tokenizer, str):
        protocol.check_training_examples(data, n_train)
        return []
    # without the weights the model's context is unknown: no sequence is too long here
    allow_unknown = task.spec.allow_unknown_tokens
    return protocol.data_problems(tokenizer, data, n_train, task.spec.init, sys.maxsize, allow_unknown=allow_unknown)


def tokenizer_of(model: str, tokenizers: dict):
    """The model's tokenizer, loaded once across tasks, or why there is none on this machine (a str)."""
    from clbench.models import NotOffline, load_tokenizer

    if model not in tokenizers:
        try:
            tokenizers[model] = load_tokenizer(model)
        except NotOffline as error:
            tokenizers[model] = f"tokenizer not checked: {error}"
    return tokenizers[model]


@command(
    "results",
    "print finished results: mean over seeds per task × method × model",
    "--db --task --wide --metrics",
    {"--task": {"required": False, "help": "only this task"}},
)
def cmd_results(args) -> int:
    from clbench.records import open_store
    from clbench.report.summary import summary

    print(summary(open_store(args.db), task=args.task, **summary_view(args)))
    return 0


@command(
    "sweep",
    "sample-efficiency curve: run methods × n_train × seeds; only what is missing",
    "--task --method --n --seeds --model --profile --init --set --tuned --param --budget --target-gap --db "
    "--task-dir --executor --workers --executor-folder --slurm-partition --gpus-per-job --timeout-min --device",
    {
        "--task": ONE_TASK,
        "--n": {"required": True, "help": "comma-separated numbers of training examples, e.g. 10,50,200"},
        "--param": {
            "dest": "swept",  # a grid, not an override: spec_arguments leaves it to parse_sweep_params
            "metavar": "KEY=V1,V2,...",
            "help": "sweep a task param over these values (repeatable: the grid is their cartesian product)",
        },
        "--target-gap": {
            "type": float,
            "default": 0.5,
            "help": "N*: the smallest n_train from which the mean gap_closed stays at or above this (default: "
            "0.5); printed with the fit N* ≈ c·s·ln|V| after a dictionary_size sweep",
        },
        "--executor": {
            "default": "inline",
            "choices": ["inline", "local", "slurm"],
            "help": "inline: this process; local/slurm: submitit jobs (see clbench/executors.py)",
        },
        "--workers": {"type": positive_int, "default": 1, "help": "submitit jobs the grid is split into"},
        "--executor-folder": {"default": "clbench-jobs", "help": "submitit logs and pickles (shared FS on SLURM)"},
        "--gpus-per-job": {"type": int, "default": 0},
        "--timeout-min": {"type": positive_int, "default": 240},
    },
)
def cmd_sweep(args) -> int:
    from clbench.devices import resolve_device
    from clbench.method import methods
    from clbench.records import open_store
    from clbench.session import Session
    from clbench.sweep import grid, sweep
    from clbench.taskspec import load_tasks

    task, registry = load_tasks(args.task_dir).get(args.task), methods()
    chosen = [registry.get(name) for name in registry.resolve(args.method)]
    ns, seeds = parse_counts(args.n), parse_seeds(args.seeds)
    swept, how = parse_sweep_params(args.swept), spec_arguments(args, len(chosen))
    for point in grid(swept):  # every point's values are checked by the task's schemas before any run
        task.resolved(args.profile, params_override=point or None, budget_override=how["budget_overrides"] or None)
    resolve_device(args.device)
    store, session = open_store(args.db), Session(device=args.device)
    if args.executor == "inline":
        outcomes = [
            (o.run_id, o.status)
            for o in sweep(task, chosen, ns, seeds, store=store, session=session, params=swept, **how)
        ]
    else:
        outcomes = submitted(args, task, chosen, ns, seeds, swept, how)
    failed = report_statuses([status for _, status in outcomes], args.db)
    print_sweep(store, [run_id for run_id, _ in outcomes], list(swept), args, task, session)
    return 1 if failed else 0


def submitted(args, task, chosen: list, ns: list[int], seeds: list[int], swept: dict, how: dict) -> list:
    """The sweep's points run as submitit jobs (clbench/executors.py) → (run_id, status) each."""
    from clbench.records import is_record_store
    from clbench.sweep import grid_specs

    # jobs run elsewhere: an absolute path, still saying which kind of store it is
    db_path = str(Path(args.db).resolve()) + ("/" if is_record_store(args.db) else "")
    task_dirs = tuple(str(d.resolve()) for d in args.task_dir)
    requests = [
        executors.RunRequest(spec, db_path, device=args.device, task_dirs=task_dirs)
        for spec in grid_specs(task, chosen, ns, seeds, swept, **how)
    ]
    jobs = {"workers": args.workers, "folder": args.executor_folder, "timeout_min": args.timeout_min}
    jobs |= {"slurm_partition": args.slurm_partition, "gpus_per_job": args.gpus_per_job}
    return [(run_id, status) for run_id, status, _ in executors.execute(requests, args.executor, **jobs)]


def print_sweep(store, run_ids: list[str], swept: list[str], args, task, session) -> None:
    """The curve per (method, swept params, n_train); after a dictionary_size sweep, N*(s) and its fit."""
    import pandas as pd

    from clbench.sweep import LAW_PARAM, curve, law_report, n_star_table

    table = curve(store, run_ids, by=swept)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.4g}".format):
        print(table.to_string())
    if swept == [LAW_PARAM] and "gap_closed" in table:
        vocab = len(session.base(args.model or task.resolved(args.profile)[0]).tokenizer)
        print(law_report(n_star_table(table, swept, args.target_gap), vocab, args.target_gap))


def parse_sweep_params(pairs: list[str]) -> dict[str, list[str]]:
    """--param KEY=V1,V2,... (repeatable) → {KEY: [V1, V2, ...]}, in the order given."""
    swept = {}
    for pair in pairs:
        key, text = next(iter(parse_options([pair], "--param").items()))
        values = text.split(",")
        if key in swept or any(not v for v in values) or len(set(values)) != len(values):
            raise ClbenchError(f"--param {key}: give the key once, with distinct non-empty values, got {text!r}")
        swept[key] = values
    return swept


def parse_counts(text: str) -> list[int]:
    try:
        counts = [positive_int(s) for s in text.split(",")]
    except argparse.ArgumentTypeError:
        raise ClbenchError(f"--n must be comma-separated positive integers, got {text!r}") from None
    if len(set(counts)) != len(counts):
        raise ClbenchError(f"--n names a count twice: {text!r}")
    return counts


@command(
    "explain",
    "nearest old tokens and sparse decomposition of a run's learned new rows",
    "run_id -s --db",
    {
        "run_id": {"help": "a finished run's id (or a unique prefix)"},
        "-s": {"type": positive_int, "default": 4, "help": "old tokens in the sparse decomposition (default: 4)"},
    },
)
def cmd_explain(args) -> int:
    from clbench.explain import explain
    from clbench.records import open_store
    from clbench.session import Session

    print(explain(open_store(args.db), args.run_id, s=args.s, session=Session()))
    return 0


@command(
    "leaderboard",
    "write index.html, leaderboard.md and leaderboard.csv from a results DB",
    "--db --out",
    {"--out": {"default": Path("leaderboard/out"), "help": "output folder (default: leaderboard/out)"}},
)
def cmd_leaderboard(args) -> int:
    from clbench.report.leaderboard import build

    out = build(args.db, args.out)
    print(f"wrote {out / 'index.html'}, {out / 'leaderboard.md'}, {out / 'leaderboard.csv'}")
    return 0


@command(
    "report",
    "--paper: the paper's three tables beside clbench's results (Markdown)",
    "--paper --db --out",
    {
        "--paper": {"action": "store_true", "help": "the paper's tables (the one report so far)"},
        "--out": {"help": "write the Markdown to this file (default: print it)"},
    },
)
def cmd_report(args) -> int:
    from clbench.report.paper import report

    if not args.paper:
        raise ClbenchError("report: say which report; the one so far is --paper")
    text = report(args.db, args.out)
    print(f"wrote {args.out}" if args.out else text)
    return 0


@command(
    "lm-eval",
    "score a finished run's base and adapted model with lm-eval tasks (rebuilds the run)",
    "--run --tasks --batch-size --db --task-dir",
    {
        "--run": {"required": True, "metavar": "RUN_ID", "help": "a finished run's id (see the runs table)"},
        "--tasks": {
            "required": True,
            "help": "lm-eval task names, comma-separated, e.g. clbench_old_text,clbench_old_skill",
        },
        "--batch-size": {"type": positive_int, "default": 32},
    },
)
def cmd_lm_eval(args) -> int:
    from clbench.lmeval import check_run, format_rows
    from clbench.records import open_store
    from clbench.session import Session

    store, checker = open_store(args.db), lm_eval_checker(args.tasks, args.batch_size)
    print(format_rows(args.run, check_run(store, args.run, checker, None, Session(), args.task_dir)))
    return 0


@command(
    "rescore",
    "rebuild finished runs from their records and add the metrics they lack (e.g. drift, to runs made before it)",
    "--run --task --method --split --missing --device --db --task-dir",
    {
        "--run": {
            "metavar": "RUN_IDS",
            "help": "these runs, comma-separated (default: every finished run of --split that lacks --missing)",
        },
        "--task": {"required": False, "help": "only these tasks, comma-separated"},
        "--method": {"required": False, "help": "only these methods, comma-separated"},
        "--split": {
            "default": "test",
            "choices": ["test", "validation"],
            "help": "test: the reported runs (default); validation: tuning runs",
        },
        "--missing": {
            "default": "drift_kl_oldvocab",
            "metavar": "METRIC",
            "help": "rescore the runs without this metric (default: drift_kl_oldvocab)",
        },
    },
)
def cmd_rescore(args) -> int:
    from clbench import metrics
    from clbench.distributed import log
    from clbench.records import open_store
    from clbench.rescore import rescore, selected
    from clbench.session import Session

    metrics.METRICS.get(args.missing)  # an undeclared name fails here, with "did you mean"
    store = open_store(args.db)
    ids = selected(
        store,
        runs=names(args.run),
        tasks=names(args.task),
        method_names=names(args.method),
        split=args.split,
        missing=args.missing,
    )
    if not ids:
        print(f"nothing to rescore: no selected finished run of {store.path} lacks {args.missing}")
        return 0
    session, failed = Session(device=args.device), []
    for number, run_id in enumerate(ids, 1):
        log(f"[{number}/{len(ids)}] rescoring run {run_id}")
        try:
            print(f"{run_id}  {rescore(store, run_id, session, args.task_dir)} metrics added")
        except ClbenchError as error:  # one run that does not reproduce leaves the others to do
            failed.append(run_id)
            print(f"{run_id}  not rescored: {error}", file=sys.stderr)
    if failed:
        raise ClbenchError(f"{len(failed)} of {len(ids)} runs not rescored (above); the others were")
    return 0


def names(text: str | None) -> list[str] | None:
    """A comma-separated filter flag → its names; None (no filter) where it is not given."""
    return text.split(",") if text else None


@command(
    "export",
    "write one self-describing record per run (Parquet or JSON Lines)",
    "--format --out --db --task --method",
    {
        "--format": {"choices": ["parquet", "jsonl"], "help": "default: the one --out's suffix names, else parquet"},
        "--out": {"help": "output file (default: clbench-results.parquet or .jsonl here)"},
        "--task": {"required": False, "help": "only these tasks, comma-separated"},
        "--method": {"required": False, "help": "only these methods, comma-separated"},
    },
)
def cmd_export(args) -> int:
    from clbench.export import export, out_format

    out = args.out or Path(f"clbench-results.{out_format(None, args.format)}")
    runs = export(args.db, out, args.format, tasks=names(args.task), methods=names(args.method))
    print(f"wrote {runs} runs to {out}")
    return 0


@command(
    "merge",
    "copy the runs and tuning choices of other results stores into one (what it lacks)",
    "sources --db",
    {"sources": {"nargs": "+", "metavar": "SOURCE", "help": "results DBs or record stores to read (never written)"}},
)
def cmd_merge(args) -> int:
    from clbench.records import merge, open_store
    from clbench.storage import check_merge

    into, sources = open_store(args.db), [open_store(path) for path in args.sources]
    for source in sources:  # every source is checked before the first is copied
        check_merge(into, source)
    for source in sources:
        merged = merge(into, source, combine=merged_search)
        print(
            f"{source.path}: {merged.runs} runs copied, {merged.kept} already in {into.path}; "
            f"{merged.tuned} tuning choices copied or extended, {merged.tuned_kept} kept as they were"
        )
    return 0


@command(
    "push",
    "export every run as Parquet to a Hugging Face hub dataset",
    "--repo --db --private --token-env",
    {
        "--repo": {"required": True, "metavar": "ORG/NAME", "help": "the dataset repo (created if missing)"},
        "--private": {"action": "store_true", "help": "create the repo private (an existing one keeps its)"},
        "--token-env": {
            "metavar": "NAME",
            "help": "read the hub token from $NAME (default: HF_TOKEN or a saved login)",
        },
    },
)
def cmd_push(args) -> int:
    from clbench.export import push

    token = os.environ.get(args.token_env) if args.token_env else None
    if args.token_env and not token:
        raise ClbenchError(f"--token-env {args.token_env}: ${args.token_env} is not set")
    print(f"pushed to {push(args.db, args.repo, private=args.private, token=token)}")
    return 0


@command(
    "build-base",
    "build the arithmetic base's recipe here (builtin:arith-local; --force rebuilds) and compare it with the "
    "shipped base (builtin:arith-llama)",
    "--force",
    {"--force": {"action": "store_true"}},
)
def cmd_build_base(args) -> int:
    from clbench import arith_llama

    model, tokenizer = arith_llama.load_or_build(force=args.force)
    print("\n".join(arith_llama.versus_shipped(model, tokenizer)))
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # our own progress lines suffice
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # files are created with the user's umask, but never world-writable, even under umask 000
    umask = os.umask(0o002)
    os.umask(umask | 0o002)
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command].function(args)
    except ClbenchError as error:
        # distributed.is_main(), read here directly: importing that module imports torch (~2 s on an error path)
        if int(os.environ.get("RANK", "0")) == 0:  # under accelerate launch every process hits it: one line
            print(f"clbench: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("clbench: interrupted", file=sys.stderr)
        return 130
    finally:
        os.umask(umask)


if __name__ == "__main__":
    sys.exit(main())
