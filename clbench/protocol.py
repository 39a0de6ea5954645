"""The protocol: one flow, the same for every task and method. This file reads in the order a run goes.

    RunSpec (clbench/spec.py: a run's inputs)
      → plan(): every input checked, the base and data loaded, the config resolved and hashed to the run id: a Plan
      → adapt_and_evaluate(): the run itself, in four phases; it computes only (no store access)
          1. base_references(): the unexpanded base's scores on the run's data
          2. expanded(): a private copy of the base, its vocabulary |V| → |V| + |U|
          3. train_stages(): trained with the plan's method under the task's budget, stage after stage
          4. evaluate_adapted(): the adapted model scored on the same data → the run's metrics (clbench/metrics.py)
      → execute(): skip the run if the store has it finished, leave it if a live process holds it, else claim it,
        compute it (adapt_and_evaluate) under a heartbeat → a RunRecord, which record() hands to the store
        (clbench/storage.py ResultStore: one record per run)
    run_one(): plan(), then execute().

What a process computes once and reuses across runs (base models, task data, base scores) is its Session
(clbench/session.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from clbench import distributed, teacher
from clbench import metrics as M
from clbench.data import Encoded, Example, Stage, TaskData, encode_examples, encode_texts, read_all
from clbench.devices import input_device
from clbench.distributed import log
from clbench.errors import ClbenchError, DivergedError
from clbench.evaluate import Reference, Scores, greedy, score
from clbench.expand import INIT_STRATEGIES, add_new_tokens, check_expansion, expand
from clbench.explain import meaning_recovery, rows_file, save_new_rows
from clbench.memory import PeakMemory
from clbench.method import MethodSpec
from clbench.models import Base
from clbench.provenance import git_commit, hardware, versions
from clbench.samples import example_rows
from clbench.session import Session, old_sets
from clbench.spec import RunSpec, resolve, run_id, task_settings
from clbench.storage import Claim, ResultStore, now
from clbench.taskspec import Budget, Task
from clbench.train import TrainResult, train


@dataclass(frozen=True)
class Plan:
    """A resolved run whose input passed every check: nothing after plan() rejects bad input. Every phase
    reads the run's method here, and nowhere else."""

    spec: RunSpec
    task: Task
    method: MethodSpec
    run_id: str
    config: dict
    method_config: object
    base: Base
    data: TaskData
    budget: Budget
    init: str
    seed: int


@dataclass(frozen=True)
class RunRecord:
    """One attempt at a run, computed and not yet written: what record() hands to the store."""

    run: dict  # the runs row (run_row): what ran, on what, with which code, when, and how it ended
    attempt: int  # the claim's: nothing lands unless this process still holds that attempt (ResultStore.record)
    evaluated: Evaluated  # its metrics and rows; empty for a run that failed

    def outcome(self) -> Outcome:
        return Outcome(self.run["run_id"], self.run["status"], self.evaluated.values, self.run["reason"])


@dataclass(frozen=True)
class Outcome:
    """What execute() answers its caller."""

    run_id: str
    status: str  # finished | failed | skipped (already finished in the store) | busy (another live process runs it)
    metrics: dict[str, float]
    reason: str | None = None


def plan(
    spec: RunSpec,
    task: Task,
    method: MethodSpec,
    *,
    session: Session,
    tuned_choice: Callable[[str], dict | None] | None = None,
) -> Plan:
    """spec's inputs checked and resolved (clbench/spec.py), its base and data loaded: a Plan, or one
    ClbenchError. spec.split "validation" scores the task's validation split instead of its target and old
    text (`clbench tune`; never reported). tuned_choice: the store's stored choice of a tune key (ResultStore.tuned), for spec.tuned."""
    if (task.name, method.name) != (spec.task, spec.method):
        raise ClbenchError(f"spec names {spec.task} × {spec.method}, given {task.name} × {method.name}")
    settings = task_settings(spec, task)
    default_model, budget, params = settings
    init = spec.init or task.spec.init
    if init not in INIT_STRATEGIES:
        raise ClbenchError(f"unknown init strategy {init!r}; known: {', '.join(INIT_STRATEGIES)}")
    method.config(spec.option_dict)  # bad options are refused before a model loads
    base = session.base(spec.model or default_model)
    full = session.data(task, params, base)
    data = validation_data(task, full) if spec.split == "validation" else full
    if not method.adds_tokens:
        data = base_reading(task, method, data)
    config, method_config = resolve(
        spec,
        task,
        method,
        base_ref=base.ref,
        model_fingerprint=base.fingerprint,
        data_fingerprint=full.fingerprint(),
        tuned_choice=tuned_choice,
        # what its teacher reads for a new token (clbench/teacher.py), or a refusal: from the whole data, since
        # the validation split drops the oracle text
        teacher=teacher.source(full, task.name) if method.reads_teacher_text else None,
        settings=settings,
    )
    if budget.n_train > len(data.train):
        raise ClbenchError(
            f"task {task.name!r}: n_train {budget.n_train} exceeds the {len(data.train)} training examples"
        )
    check_method(method, task, data)
    preflight(base, data, budget, init, allow_unknown=task.spec.allow_unknown_tokens)
    return Plan(spec, task, method, run_id(config), config, method_config, base, data, budget, init, spec.seed)


def check_method(method: MethodSpec, task: Task, data: TaskData) -> None:
    """What a method needs of the task and the launch, checked before the run is claimed."""
    if method.reads_old_text and not data.replay_text:
        # the hook hands a method the task's old text (replay rehearses it, ewc estimates its Fisher on it)
        raise ClbenchError(
            f"method {method.name!r} reads old text through its training_examples hook, "
            f"and task {task.name!r} has no replay_text"
        )
    if distributed.launched() and distributed.fsdp_requested():
        # FSDP replaces the model's parameters with shards (distributed.DataParallel): the ET family and pt
        # train rows outside them, and a penalty (ewc) holds its own references to the unsharded ones
        if method.trains_rows_outside_model:
            raise ClbenchError(
                f"method {method.name!r} trains new rows outside the model and needs no sharding: "
                "launch it without --use_fsdp (DDP); FSDP is for methods that train the model's weights"
            )
        if method.penalty:
            raise ClbenchError(
                f"method {method.name!r} computes its penalty on references to the unsharded weights, "
                "which FSDP replaces: launch it without --use_fsdp (DDP)"
            )


def validation_data(task: Task, data: TaskData) -> TaskData:
    """The task with its validation split in place of what is reported: target and old text."""
    if not data.validation or not data.validation_old_text:
        raise ClbenchError(
            f"task {task.name!r} has no validation split (its generator gives no validation examples or "
            "validation_old_text): its learning rates cannot be tuned"
        )
    return dataclasses.replace(
        data, target_test=data.validation, old_text=data.validation_old_text, target_oracle=[], validation=[]
    )


def base_reading(task: Task, method: MethodSpec, data: TaskData) -> TaskData:
    """The task as the control that adds no token reads it: no new token, so the base tokenizer reads every set
    (the target's new tokens as their old sub-word pieces, as learning nothing does); it trains on the training
    text with each new token written as what it stands for where the task knows it (train_oracle: pseudowords'
    true words), else on the training text as it is (xling: continued training on the language)."""
    if data.stages:
        raise ClbenchError(
            f"method {method.name!r} adds no token, and the stages of task {task.name!r} are defined by theirs"
        )
    return dataclasses.replace(data, new_tokens=[], train=data.train_oracle or data.train, train_oracle=[], meaning={})


def preflight(base: Base, data: TaskData, budget: Budget, init: str, *, allow_unknown: bool = False) -> None:
    """Every check that can reject a run's input, before the store is touched: bad input leaves it as it was.
    allow_unknown: the task's `allow_unknown_tokens`; otherwise text that becomes <unk> is refused."""
    if budget.batch_size < distributed.processes():
        raise ClbenchError(
            f"batch_size {budget.batch_size} is smaller than the {distributed.processes()} processes launched"
        )
    problems = data_problems(base.tokenizer, data, budget.n_train, init, base.max_length, allow_unknown=allow_unknown)
    if problems:
        raise ClbenchError(problems[0])


def data_problems(tokenizer, data: TaskData, n_train: int, init: str, max_length: int, *, allow_unknown: bool):
    """preflight's checks of the data, which need the base's tokenizer and not its weights (`clbench validate`
    makes them too): raises where the new tokens cannot be added or a stage has too few training examples;
    → one line per set a run would read as <unk> (data.read_all)."""
    expanded = copy.deepcopy(tokenizer)
    check_expansion(expanded, data.new_tokens, init)
    add_new_tokens(expanded, data.new_tokens, whole_words=data.whole_word_tokens)
    check_training_examples(data, n_train)
    return read_all(tokenizer, expanded, data, n_train, max_length, allow_unknown=allow_unknown)


def check_training_examples(data: TaskData, n_train: int) -> None:
    for stage in stages_of(data):
        if n_train > len(stage.train):
            where = f"stage {stage.name!r}" if data.stages else "the task"
            raise ClbenchError(f"n_train {n_train} exceeds the {len(stage.train)} training examples of {where}")


def stages_of(data: TaskData) -> list[Stage]:
    """A plain task is a sequential one of a single stage."""
    return data.stages or [Stage("", data.new_tokens, data.train, data.target_test)]


@dataclass(frozen=True)
class References:
    """The unexpanded base's scores on the run's data (cached per process: clbench/session.py)."""

    old: Scores  # old text
    skill: Scores  # old skill
    target: Scores  # the target set under the base tokenizer: the no-learning reference
    oracle: Scores | None  # the target set's oracle version (each new token replaced by its meaning), where it has one
    drift: Reference  # the base on old text, what the adapted model's transition drift there is measured against


def base_references(planned: Plan, session: Session) -> References:
    """Phase 1: the base's scores, before its weights are handed to the run (a model placed with device_map is
    handed over, and the base reloaded on its next use)."""
    base, data, batch = planned.base, planned.data, planned.budget.eval_batch_size
    old, skill = session.scores_of_base(base, data, batch)
    target = session.target_of_base(base, data, batch)
    oracle = session.target_of_base(base, data, batch, oracle=True) if data.target_oracle else None
    return References(old, skill, target, oracle, session.old_reference(base, data, batch))


@dataclass
class Expanded:
    """The run's private model, |V| → |V| + |U|, with its tokenizer, encoded sets and scorers."""

    model: object
    tokenizer: object
    expansion: object
    old_vocab: int
    target_set: list[Encoded]
    old_set: list[Encoded]
    skill_set: list[Encoded]
    scored: Callable  # (model, examples) → Scores
    scored_old: Callable  # model → its Scores on old text
    at_init: Scores  # the target set scored by the expanded model before any training


def expanded(planned: Plan, session: Session, references: References) -> Expanded:
    """Phase 2: expand a private copy of the base (a sequential task adds every stage's tokens here, each stage's rows
    staying at their initialisation until its stage)."""
    base, data, budget, seed = planned.base, planned.data, planned.budget, planned.seed
    old_vocab, pad, batch = len(base.tokenizer), base.tokenizer.pad_token_id, budget.eval_batch_size
    model = base.own_model()  # before seeding: a reload (device_map) must not shift the run's random stream
    torch.manual_seed(seed)
    tokenizer = copy.deepcopy(base.tokenizer)
    expansion = expand(
        model, tokenizer, data.new_tokens, init=planned.init, seed=seed, whole_words=data.whole_word_tokens
    )
    target_set = encode_examples(tokenizer, data.target_test, base.max_length, data.scoring)
    old_set, skill_set = old_sets(base, data)
    scored = lambda m, examples: score(m, examples, old_vocab=old_vocab, pad_id=pad, batch_size=batch)
    # a frozen backbone's hidden states on old text are the base's: only its head is scored there
    kept = session.old_positions(base, data, batch) if planned.method.frozen_backbone else None
    drift = references.drift
    scored_old = lambda m: score(
        m, old_set, old_vocab=old_vocab, pad_id=pad, batch_size=batch, at=kept, reference=drift
    )
    # the expanded model before any training is the same for every method (expand() precedes setup())
    init_key = (base.fingerprint, data.fingerprint(), planned.init, seed, batch)
    if init_key not in session.init_scores:
        session.init_scores[init_key] = scored(model, target_set)
    return Expanded(
        model, tokenizer, expansion, old_vocab, target_set, old_set, skill_set, scored, scored_old,
        session.init_scores[init_key],
    )  # fmt: skip


@dataclass(frozen=True)
class Trained:
    result: TrainResult  # summed over stages (final_loss: the last stage's)
    results: list[TrainResult]  # per stage
    trainable: int  # the most parameters trained in one stage
    matrix: list[tuple]  # a sequential task's stage × task matrix; empty for a plain task


def train_stages(planned: Plan, run: Expanded, on_step) -> Trained:
    """Phase 3: train under the task's budget, stage after stage; the method decides only what is trainable.
    run.model is replaced by what each stage's adapter finalizes."""
    base, data, budget, seed, method = planned.base, planned.data, planned.budget, planned.seed, planned.method
    stages = stages_of(data)
    matrix = []
    if data.stages:
        matrix += stage_row(0, run, stages, base.max_length, data.scoring)
    results, trainable, first_new = [], 0, 0
    for number, stage in enumerate(stages, 1):
        adapter = setup(planned, run.model, run.expansion.part(first_new, len(stage.new_tokens)))
        first_new += len(stage.new_tokens)
        trainable = max(trainable, sum(p.numel() for group in adapter.param_groups for p in group["params"]))
        train_set = encode_examples(run.tokenizer, stage.train[: budget.n_train], base.max_length)
        if method.reads_old_text:  # the training_examples hook (clbench/method.py): old text (replay, ewc)
            train_set = adapter.training_examples(
                train_set, encode_texts(run.tokenizer, data.replay_text, base.max_length)
            )
        if method.reads_teacher_text:  # the teacher hook (clbench/method.py): the base's reading of the same examples
            adapter.teacher(
                teacher.readings(base.tokenizer, data, stage, train_set, base.max_length), base.tokenizer.pad_token_id
            )
        results.append(
            train(
                run.model,
                adapter.param_groups,
                train_set,
                steps=budget.steps,
                batch_size=budget.batch_size,
                lr=planned.method_config.lr,
                seed=seed,
                pad_id=base.tokenizer.pad_token_id,
                vocab_limit=run.old_vocab if method.train_vocab == "old" else None,
                on_step=progress(budget.steps, number, f"{stage.name} " if data.stages else "", on_step),
                penalty=adapter.penalty if method.penalty else None,
            )
        )
        run.model = adapter.finalize()
        if data.stages:
            matrix += stage_row(number, run, stages, base.max_length, data.scoring)
    total = TrainResult(
        sum(r.steps for r in results),
        results[-1].final_loss,
        sum(r.tokens_seen for r in results),
        sum(r.seconds for r in results),
    )
    return Trained(total, results, trainable, matrix)


def setup(planned: Plan, model, expansion):
    """The plan's method.setup, where weights that device_map offloaded to cpu/disk cannot be made trainable; the
    adapter is held to the method's declared capabilities."""
    method = planned.method
    try:
        adapter = method.setup(model, expansion, planned.method_config)
    except RuntimeError as error:
        if not any(p.is_meta for p in model.parameters()):
            raise
        raise ClbenchError(
            f"method {method.name!r} trains weights that device_map offloaded to cpu/disk "
            f"({str(error).splitlines()[0]}); only methods that train new rows or adapters run there"
        ) from None
    method.check_adapter(adapter, model)
    return adapter


def progress(steps: int, stage: int, prefix: str, on_step):
    """The training loop's per-step callback: a log line five times a stage, and on_step with steps counted
    across stages."""
    every, before = max(1, steps // 5), (stage - 1) * steps

    def report(step, loss, lr, grad_norm):
        if (step + 1) % every == 0:
            log(f"  {prefix}step {step + 1}/{steps}  loss {loss:.4f}")
        if on_step:
            on_step(before + step, loss, lr, grad_norm)

    return report


def stage_row(after: int, run: Expanded, stages: list[Stage], max_length: int, scoring) -> list[tuple]:
    """(after_stage, eval_stage, metric, value) for the old text (eval_stage 0) and every stage's target set,
    the metrics as clbench/metrics.py stage_cells names them."""
    old = run.scored_old(run.model)
    targets = [
        run.scored(run.model, encode_examples(run.tokenizer, stage.target_test, max_length, scoring))
        for stage in stages
    ]
    return [(after, *cell) for cell in M.stage_cells(old, targets)]


def evaluate_adapted(planned: Plan, session: Session, run: Expanded, trained: Trained, references, memory):
    """Phase 4: the adapted model on the same data the base was scored on → (metrics, target scores, old-text
    scores); a DivergedError where a metric declared `diverges` is not finite."""
    base, data = planned.base, planned.data
    target, old = run.scored(run.model, run.target_set), run.scored_old(run.model)
    scores = M.RunScores(
        target=target,
        old=old,
        skill=run.scored(run.model, run.skill_set),
        base_old=references.old,
        base_skill=references.skill,
        at_init=run.at_init,
        no_learning=references.target,
        oracle=references.oracle,
        adapted_oracle=adapted_oracle(planned, session, run),
        groups=tuple(e.group for e in data.target_test),
        train=trained.result,
        trainable=trained.trainable,
        exact_match=data.exact_match,
        emits_new=planned.method.train_vocab == "full",
        memory=memory.metrics(),
        recovery=meaning_recovery(base, run.model, data),  # where the task knows what each new token stands for
    )
    values = M.scored(scores)  # every built-in metric, by its declaration (clbench/metrics.py)
    if data.stages:
        values.update(M.transfer(trained.matrix, [s.name for s in stages_of(data)]))
    distributed.log_items([f"{k} {values[k]:.4g}" for k in M.logged() if k in values])
    for name in M.divergence_checked():
        if not math.isfinite(values[name]):
            raise DivergedError(f"non-finite {name} ({values[name]}) after training")
    return values, target, old


def adapted_oracle(planned: Plan, session: Session, run: Expanded) -> Scores | None:
    """The adapted model on the target set's oracle version, where the task has one."""
    base, data, batch = planned.base, planned.data, planned.budget.eval_batch_size
    if not data.target_oracle:
        return None
    oracle_set = encode_examples(run.tokenizer, data.target_oracle, base.max_length, data.scoring)
    # the base's hidden states serve only where the expanded tokenizer reads the oracle text as the base's does
    reuse = planned.method.frozen_backbone and oracle_set == session.oracle_encoded(base, data)
    return score(
        run.model,
        oracle_set,
        old_vocab=run.old_vocab,
        pad_id=base.tokenizer.pad_token_id,
        batch_size=batch,
        at=session.oracle_positions(base, data, batch) if reuse else None,
    )


GENERATED_TARGETS, GENERATED_OLD, GENERATED_TOKENS = 3, 2, 8  # stored continuations per run, and their length


def sample_generations(
    model,
    tokenizer,
    target_set: list[Encoded],
    old_set: list[Encoded],
    *,
    old_vocab: int,
    emits_new: bool,
    max_length: int,
) -> list[tuple]:
    """(number, source, prompt, generated, reference, new_tokens_generated) for a few free-running greedy
    continuations, to read beside the numbers: of the first target examples holding a new token after
    their first position, the reference cut right before its first one (where new_token_recall asks,
    carried on); of the first old texts, their first half. reference: the text's next GENERATED_TOKENS
    tokens. A method trained under the old softmax decodes over V (as new_token_recall: clbench/metrics.py)."""
    first_new = lambda ids: next((i for i, t in enumerate(ids) if i and t >= old_vocab), None)
    cuts = [("target", e.ids, first_new(e.ids)) for e in target_set]
    cuts = [c for c in cuts if c[2] is not None][:GENERATED_TARGETS]
    cuts += [("old_text", e.ids, max(1, len(e.ids) // 2)) for e in old_set[:GENERATED_OLD]]
    rows = []
    for number, (source, ids, cut) in enumerate(cuts):
        steps = min(GENERATED_TOKENS, max_length - cut)
        out = greedy(
            model, ids[:cut], steps=steps, vocab=None if emits_new else old_vocab, eos_id=tokenizer.eos_token_id
        )
        reference = ids[cut : cut + GENERATED_TOKENS]
        text = tokenizer.decode
        rows.append((number, source, text(ids[:cut]), text(out), text(reference), sum(t >= old_vocab for t in out)))
    return rows


@dataclass(frozen=True)
class Evaluated:
    values: dict[str, float]  # the run's metrics
    matrix: list[tuple]  # a sequential task's stage × task matrix (stage_row); empty for a plain task
    curves: list[tuple] = ()  # (stage, step, loss, lr, grad_norm) per training step (the curves table)
    samples: list[tuple] = ()  # per-example rows (clbench/samples.py), with log_samples only
    generations: list[tuple] = ()  # sample_generations: a few greedy continuations


def adapt_and_evaluate(
    planned: Plan,
    *,
    session: Session,
    rows_path: Path | None = None,
    on_adapted=None,
    log_samples: bool = False,
    on_step: Callable[[int, float, float, float], None] | None = None,
) -> Evaluated:
    """The run itself, its four phases in order: the base's references, expansion, training, evaluation. No store
    access.

    rows_path: where the learned new rows go (None: not kept); on_adapted, log_samples: as in execute(); on_step(step,
    loss, lr, grad_norm) after every training step, steps counted across stages."""
    base, data = planned.base, planned.data
    references = base_references(planned, session)
    run = expanded(planned, session, references)
    memory = PeakMemory(input_device(run.model))  # this run's peak, from here to the end of its evaluation
    trained = train_stages(planned, run, on_step)
    if rows_path is not None:  # the learned new rows, for `clbench explain`
        save_new_rows(rows_path, run.model, run.old_vocab, data.new_tokens, data.meaning, data.whole_word_tokens)
    values, target, old = evaluate_adapted(planned, session, run, trained, references, memory)
    generations = sample_generations(
        run.model,
        run.tokenizer,
        run.target_set,
        run.old_set,
        old_vocab=run.old_vocab,
        emits_new=planned.method.train_vocab == "full",
        max_length=base.max_length,
    )
    if on_adapted is not None:
        on_adapted(base, data, run.model, run.tokenizer)
    curves = [(stage, step, *p) for stage, r in enumerate(trained.results, 1) for step, p in enumerate(r.curve)]
    samples = example_samples(data, run, references, target, old) if log_samples else []
    return Evaluated(values, trained.matrix, curves, samples, generations)


def example_samples(data: TaskData, run: Expanded, references: References, target: Scores, old: Scores):
    """Per-example rows of the target set and old text (clbench/samples.py): the samples table."""
    old_examples = [Example("", t) for t in data.old_text]
    return example_rows("target", data.target_test, run.target_set, target, run.tokenizer) + example_rows(
        "old_text", old_examples, run.old_set, old, run.tokenizer, references.old
    )


def execute(
    planned: Plan, *, store: ResultStore, session: Session, on_adapted=None, log_samples: bool = False, live=None
) -> Outcome:
    """Run a plan unless the store has it finished or a live process holds it; the result is recorded.

    on_adapted(base, data, adapted_model, tokenizer), if given, sees the adapted model in memory
    after evaluation (lm-eval checks); it is not called for skipped or failed runs. log_samples: also
    record per-example scores (the samples table); live: a clbench.live.LiveLog the training curves
    go to as they come. Neither changes a result, so neither is in the config the run_id hashes: a
    finished run is not rerun to add its samples."""
    # launched as several processes, only the main one touches the store; its claim decides for all
    claim = distributed.main_decides(lambda: claim_unless_finished(store, planned.run_id))
    if claim.state == "finished":
        return Outcome(planned.run_id, "skipped", {})
    if claim.state == "busy":
        log(
            f"{planned.task.name} × {planned.method.name} (seed {planned.seed}): running in {claim.holder}; left to it"
        )
        return Outcome(planned.run_id, "busy", {})
    made = attempt(planned, claim, store, session, on_adapted=on_adapted, log_samples=log_samples, live=live)
    if distributed.is_main():
        record(store, made)
    return made.outcome()


def claim_unless_finished(store: ResultStore, run_id: str) -> Claim:
    """The claim makes an interruption visible to the next command, which retries the run."""
    if store.status(run_id) == "finished":  # read-only: no write lock for a run already done
        return Claim("finished")
    return store.claim(run_id)  # "finished" too if another process finished it since


def attempt(planned: Plan, claim: Claim, store: ResultStore, session: Session, *, on_adapted, log_samples, live):
    """The claimed run computed (adapt_and_evaluate), its attempt kept alive in the store by a heartbeat and its
    curves sent to `live` meanwhile → its record, not yet written. A diverged run is a failed one."""
    if claim.attempt > 1:
        log(f"retrying run {planned.run_id} (attempt {claim.attempt}; the previous attempt was interrupted or failed)")
    size = f"n_train {planned.budget.n_train}, {planned.budget.steps} steps"
    log(f"{planned.task.name} × {planned.method.name} (seed {planned.seed}, model {planned.base.ref}, {size})")
    started = now()
    # the code this process runs is the checkout's as it is now: read at the end, a checkout moved meanwhile
    # would label the run with code it did not run
    commit = git_commit()
    # read before the run: a base placed with device_map is handed to the run and reloaded on its next use
    where = versions() | hardware(planned.base.model, planned.budget.batch_size)
    main = distributed.is_main()
    try:
        with (
            store.heartbeat(planned.run_id, claim.attempt) if main else contextlib.nullcontext(),
            live.run(planned.run_id, planned.config) if live and main else contextlib.nullcontext() as tracked,
        ):
            evaluated = adapt_and_evaluate(
                planned,
                session=session,
                rows_path=rows_file(planned.run_id) if main else None,
                on_adapted=on_adapted,
                log_samples=log_samples,
                on_step=tracked.step if tracked else None,
            )
            evaluated.values.update(M.computed(planned.task.metrics, evaluated.values))  # the task's own
            if tracked:
                tracked.result(evaluated.values)
        status, reason = "finished", None
    except DivergedError as error:
        evaluated, status, reason = Evaluated({}, []), "failed", str(error)
        log(f"  failed: {reason}")
    row = run_row(planned, status, reason, commit=commit, started=started, versions=where)
    return RunRecord(row, claim.attempt, evaluated)


def run_row(planned: Plan, status: str, reason: str | None, *, commit: str | None, started, versions: dict) -> dict:
    """The self-describing part of a run's record: what ran, on what, with which code, when, and how it ended."""
    return {
        "run_id": planned.run_id,
        "task": planned.task.name,
        "task_version": planned.task.spec.version,
        "method": planned.method.name,
        "model": planned.base.ref,
        "seed": planned.seed,
        "status": status,
        "reason": reason,
        "config": planned.config,
        "model_fingerprint": planned.base.fingerprint,
        "data_fingerprint": planned.config["data_fingerprint"],
        "versions": versions,
        "git_commit": commit,
        "started_at": started,
        "finished_at": now(),
        "spec": planned.spec.to_dict(),
    }


def record(store: ResultStore, made: RunRecord) -> None:
    """One run written whole: its runs row, metrics and rows (clbench/storage.py ResultStore.record)."""
    evaluated = made.evaluated
    store.record(
        made.run,
        evaluated.values,
        attempt=made.attempt,
        stage_matrix=evaluated.matrix,
        curves=evaluated.curves,
        samples=evaluated.samples,
        generations=evaluated.generations,
    )


def run_one(
    task: Task,
    method: MethodSpec,
    *,
    seed: int = 0,
    store: ResultStore,
    session: Session,
    tuned_choice: Callable[[str], dict | None] | None = None,
    on_adapted=None,
    log_samples: bool = False,
    live=None,
    **how,
) -> Outcome:
    """One run from its inputs: `how` is RunSpec.make's (options, model, profile, init, n_train, param_overrides,
    budget_overrides, split, tuned); planned, then executed."""
    spec = RunSpec.make(task.name, method.name, seed=seed, **how)
    planned = plan(spec, task, method, session=session, tuned_choice=tuned_choice)
    return execute(planned, store=store, session=session, on_adapted=on_adapted, log_samples=log_samples, live=live)
