"""Side-by-side speed and memory ratios for clbench, medians over repeats.

    python bench/bench.py                 # all sections, 5 repeats
    python bench/bench.py --only overhead --repeats 7
    python bench/bench.py --only optimizer    # fused vs default AdamW, an FFT step on SmolLM2-135M's shape
    python bench/bench.py --only ewc-fisher   # ewc's Fisher on SmolLM2-135M: peak RSS vs the weights
    python bench/bench.py --only et-eval      # an ET run's old-text evaluation: forward pass vs the base's kept states
    python bench/bench.py --only drift        # what transition drift adds to the old-text evaluation
    python bench/bench.py --only store        # recording a run and `clbench results` over 1,000: records vs one file
    python bench/bench.py --only et-vs-fft    # a step's time and peak memory: et, fft and distill (its teacher's pass)

Each ratio is measured within one run, configurations interleaved, so machine noise hits both sides.
Memory is a child process's peak resident set (a fresh process per configuration), since on CPU
there is no allocator counter to reset between configurations in one process.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from transformers import LlamaConfig, LlamaForCausalLM

import clbench.train
from clbench import teacher
from clbench.data import Example, Stage, TaskData, collate, encode_examples
from clbench.expand import expand
from clbench.method import methods
from clbench.train import epoch_batches, train


def arith_setup(n_train: int = 200):
    """The arithmetic base and task data, as a run of the arithmetic task sees them."""
    from clbench.arith_llama import load_shipped
    from clbench.taskspec import load_tasks

    model, tokenizer = load_shipped()
    task = load_tasks().get("arithmetic")
    data = task.build(task.resolved()[2], tokenizer)
    return model, tokenizer, data.new_tokens, data.train[:n_train]


def expanded(model, tokenizer, new_tokens):
    model, tokenizer = copy.deepcopy(model), copy.deepcopy(tokenizer)
    expansion = expand(model, tokenizer, new_tokens, init="random", seed=0)
    return model, tokenizer, expansion


def clbench_et(model, tokenizer, new_tokens, examples, steps, batch_size) -> float:
    """tokens/s of ET through clbench's method registry and training loop."""
    model, tokenizer, expansion = expanded(model, tokenizer, new_tokens)
    encoded = encode_examples(tokenizer, examples, 64)
    spec = methods().get("et")
    adapter = spec.setup(model, expansion, spec.config())
    result = train(
        model,
        adapter.param_groups,
        encoded,
        steps=steps,
        batch_size=batch_size,
        lr=3e-2,
        seed=0,
        pad_id=tokenizer.pad_token_id,
        vocab_limit=expansion.old_vocab,
    )
    return result.tokens_seen / result.seconds


def hand_written_et(model, tokenizer, new_tokens, examples, steps, batch_size) -> float:
    """The minimal loop a researcher would write: the same rows, batches, optimizer and loss."""
    model, tokenizer, expansion = expanded(model, tokenizer, new_tokens)
    encoded = encode_examples(tokenizer, examples, 64)
    batches = [
        collate([encoded[i] for i in b], tokenizer.pad_token_id)
        for b in epoch_batches(len(encoded), batch_size, steps, torch.Generator().manual_seed(0))
    ]
    model.requires_grad_(False)
    table = model.get_input_embeddings().weight
    V = expansion.old_vocab
    rows = torch.nn.Parameter(table[V:].clone())
    optimizer = torch.optim.AdamW([rows], lr=3e-2, weight_decay=0.0)
    tokens = 0
    start = time.perf_counter()
    for ids, attention, target in batches:
        embeds = torch.where((ids >= V)[..., None], rows[(ids - V).clamp(min=0)], F.embedding(ids, table))
        logits = model(inputs_embeds=embeds, attention_mask=attention).logits[:, :-1, :V]
        loss = F.cross_entropy(logits[target], ids[:, 1:][target])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tokens += int(attention.sum())
    return tokens / (time.perf_counter() - start)


def section_overhead(args) -> dict:
    model, tokenizer, new_tokens, examples = arith_setup()
    ours, hand = [], []
    for _ in range(args.repeats):
        ours.append(clbench_et(model, tokenizer, new_tokens, examples, args.steps, 32))
        hand.append(hand_written_et(model, tokenizer, new_tokens, examples, args.steps, 32))
    return {
        "clbench_et_tokens_per_s": statistics.median(ours),
        "hand_loop_tokens_per_s": statistics.median(hand),
        "ratio": statistics.median(ours) / statistics.median(hand),
        "target": ">= 0.95",
    }


SMOLLM2_135M_PARAMS = 134_515_008  # tied embeddings counted once

SMOL_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


def smol_shape():
    """A random-weight model of SmolLM2-135M's shape (the cost does not depend on the weights), char tokenizer."""
    from clbench.arith import char_tokenizer

    model, tokenizer = LlamaForCausalLM(LlamaConfig(**SMOL_SHAPE)), char_tokenizer()
    model.resize_token_embeddings(len(tokenizer))  # keep ids valid; the width is what costs
    model.resize_token_embeddings(SMOL_SHAPE["vocab_size"])
    return model, tokenizer


def child_step_cost(method: str, shape: str, steps: int) -> dict:
    """Runs in a fresh process: median seconds per step and this process's peak RSS."""
    torch.manual_seed(0)
    if shape == "arith":
        model, tokenizer, new_tokens, examples = arith_setup()
        batch = 32
    else:
        model, tokenizer = smol_shape()
        digits = "0123456789" * 13
        examples, new_tokens, batch = [Example(digits[:64] + "<spec>", digits[:64])] * 8, ["<spec>"], 4
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    base_tokenizer = tokenizer
    model, tokenizer, expansion = expanded(model, tokenizer, new_tokens)
    encoded = encode_examples(tokenizer, examples, 512)
    spec = methods().get(method)
    adapter = spec.setup(model, expansion, spec.config())
    if spec.reads_teacher_text:  # distill: the teacher reads <spec>'s own 6 pieces (no train_oracle here)
        data = TaskData(new_tokens, examples, examples, ["0"])
        stage = Stage("", new_tokens, examples, examples)
        adapter.teacher(teacher.readings(base_tokenizer, data, stage, encoded, 512), tokenizer.pad_token_id)
    times = []
    step = lambda seed: train(
        model,
        adapter.param_groups,
        encoded,
        steps=1,
        batch_size=batch,
        lr=1e-4,
        seed=seed,
        pad_id=tokenizer.pad_token_id,
        vocab_limit=expansion.old_vocab if spec.train_vocab == "old" else None,
        penalty=adapter.penalty if spec.penalty else None,
    )
    step(0)  # warm-up
    for seed in range(steps):
        result = step(seed)
        times.append(result.seconds)
    state = sum(p.numel() for g in adapter.param_groups for p in g["params"])
    return {
        "seconds_per_step": statistics.median(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_training_mb": rss_before,
        "trainable_params": state,
    }


def section_et_vs_fft(args) -> dict:
    out = {}
    for shape in ("arith", "smollm2-shape"):
        runs = {"et": [], "fft": [], "distill": []}
        for _ in range(max(1, args.repeats // 2)):
            for method in runs:
                child = subprocess.run(
                    [sys.executable, __file__, "--child", method, shape, str(args.steps if shape == "arith" else 3)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[method].append(json.loads(child.stdout.strip().splitlines()[-1]))
        med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
        out[shape] = {
            **{f"{m}_{k}": v for m, d in med.items() for k, v in d.items()},
            "time_ratio_et_over_fft": med["et"]["seconds_per_step"] / med["fft"]["seconds_per_step"],
            "peak_rss_ratio_et_over_fft": med["et"]["peak_rss_mb"] / med["fft"]["peak_rss_mb"],
            # distill's price over et's: its teacher's forward pass at every step (baselines/distill.py)
            "time_ratio_distill_over_et": med["distill"]["seconds_per_step"] / med["et"]["seconds_per_step"],
            "peak_rss_ratio_distill_over_et": med["distill"]["peak_rss_mb"] / med["et"]["peak_rss_mb"],
            "target": "time ratio <= 0.7",
        }
    return out


def fft_steps(model, tokenizer, examples: list[Example], steps: int, *, fused: bool) -> dict:
    """`steps` fft steps through clbench's train() from `model`'s weights (a copy), with the fused AdamW or
    torch's default implementation (clbench's optimizer before issue 12) → losses, seconds, weights."""
    model, tokenizer, expansion = expanded(model, tokenizer, ["<spec>"])
    encoded = encode_examples(tokenizer, examples, 64)
    spec = methods().get("fft")
    adapter = spec.setup(model, expansion, spec.config())
    losses, ends, optimizer_seconds = [], [], []
    started = {}
    # torch's global optimizer-step hooks time optimizer.step() alone, inside train()'s own loop
    pre = register_optimizer_step_pre_hook(lambda *_: started.update(t=time.perf_counter()))
    post = register_optimizer_step_post_hook(lambda *_: optimizer_seconds.append(time.perf_counter() - started["t"]))
    devices = clbench.train.FUSED_ADAMW_DEVICES
    clbench.train.FUSED_ADAMW_DEVICES = devices if fused else ()  # no fused device: torch's default choice
    try:
        train(
            model,
            adapter.param_groups,
            encoded,
            steps=steps,
            batch_size=len(encoded),
            lr=1e-4,
            seed=0,
            pad_id=tokenizer.pad_token_id,
            on_step=lambda step, loss, lr, grad_norm: (losses.append(loss), ends.append(time.perf_counter())),
        )
    finally:
        clbench.train.FUSED_ADAMW_DEVICES = devices
        pre.remove()
        post.remove()
    # the first step also allocates AdamW's state: the timings start at the second
    return {
        "losses": losses,
        "step_seconds": [b - a for a, b in zip(ends, ends[1:])],
        "optimizer_seconds": optimizer_seconds[1:],
        "weights": {name: p.detach().clone() for name, p in model.named_parameters()},
    }


def section_optimizer(args) -> dict:
    """One FFT step on SmolLM2-135M's shape (8 × 64 tokens) with torch's default AdamW (clbench's before
    issue 12) and the fused one (after): the same init and batches, repeats interleaved, medians."""
    model, tokenizer = smol_shape()
    digits = "0123456789" * 7
    examples = [Example(digits[:31] + "<spec>", digits[:30])] * 8  # bos + 31 + <spec> + 30 + eos = 64 tokens
    runs = {"default": [], "fused": []}
    for repeat in range(args.repeats):
        for name in ("default", "fused") if repeat % 2 == 0 else ("fused", "default"):
            runs[name].append(fft_steps(model, tokenizer, examples, args.smol_steps, fused=name == "fused"))
    median = lambda name, key: statistics.median(t for run in runs[name] for t in run[key])
    # every repeat starts from the same weights and batches: paired runs are the same training
    loss_gaps = [abs(a - b) for d, f in zip(runs["default"], runs["fused"]) for a, b in zip(d["losses"], f["losses"])]
    last_default, last_fused = runs["default"][-1]["weights"], runs["fused"][-1]["weights"]
    return {
        "shape": "SmolLM2-135M (random weights), fp32, batch 8 x 64 tokens",
        "steps_timed": f"{args.repeats} repeats x {args.smol_steps - 1} steps each (the first step of a run allocates state)",
        **{f"{name}_step_seconds": median(name, "step_seconds") for name in runs},
        **{f"{name}_optimizer_step_seconds": median(name, "optimizer_seconds") for name in runs},
        "step_ratio_fused_over_default": median("fused", "step_seconds") / median("default", "step_seconds"),
        "default_losses": runs["default"][0]["losses"],
        "fused_losses": runs["fused"][0]["losses"],
        "max_abs_loss_difference": max(loss_gaps),
        "max_abs_weight_difference": max((last_default[n] - last_fused[n]).abs().max().item() for n in last_default),
        "target": "losses equal to float rounding; the optimizer step 0.854 s -> ~0.11 s (issue 12)",
    }


def rss_mb() -> float:
    """This process's resident set now (ru_maxrss is only the peak)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def child_fisher(examples: int) -> dict:
    """Runs in a fresh process: ewc's training_examples hook (the Fisher on `examples` replay texts, θ*) on
    pseudowords' SmolLM2-135M, as `clbench run --task pseudowords --method ewc` calls it."""
    from clbench.data import encode_texts
    from clbench.models import load_base
    from clbench.taskspec import load_tasks

    torch.manual_seed(0)
    base = load_base("builtin:smollm2-135m", log=lambda *_: None)
    task = load_tasks().get("pseudowords")
    data = task.build(task.resolved()[2], base.tokenizer)
    expansion = expand(base.model, base.tokenizer, data.new_tokens, init="random", seed=0)  # in place: no copy
    spec = methods().get("ewc")
    adapter = spec.setup(base.model, expansion, spec.config({"fisher_examples": examples}))
    replay = encode_texts(base.tokenizer, data.replay_text, base.max_length)
    before = rss_mb()
    start = time.perf_counter()
    adapter.training_examples([], replay)
    seconds = time.perf_counter() - start
    weights_mb = sum(p.numel() * p.element_size() for p in base.model.parameters()) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "fisher_examples": min(examples, len(replay)),
        "replay_tokens_mean": statistics.mean(len(e.ids) for e in replay[:examples]),
        "seconds_per_example": seconds / min(examples, len(replay)),
        "weights_mb": weights_mb,
        "rss_before_fisher_mb": before,
        "peak_rss_mb": peak,
        "fisher_and_anchor_extra_over_weights": (peak - before) / weights_mb,
        "peak_rss_over_weights": peak / weights_mb,
    }


def section_ewc_fisher(args) -> dict:
    """ewc's Fisher in a fresh process: its peak RSS against the model's weight bytes (F and θ* are one copy each)."""
    child = subprocess.run(
        [sys.executable, __file__, "--child-fisher", str(args.fisher_examples)], capture_output=True, text=True
    )
    if child.returncode != 0:
        raise RuntimeError(child.stderr[-2000:])
    return {
        **json.loads(child.stdout.strip().splitlines()[-1]),
        "before": "15.1 GB resident at pseudowords x ewc in `clbench run --task all --method all` (issue 12)",
        "target": "extra <= ~2 x weights (F, θ*, one gradient at a time)",
    }


def peak_rss_mb_of(command: list[str], env: dict) -> tuple[float, float]:
    """→ (peak RSS in MiB, wall seconds) of `command` run as a child: wait4 gives that child's own rusage."""
    import os
    import tempfile

    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        _, status, usage = os.wait4(process.pid, 0)
        if status != 0:
            log.seek(0)
            raise RuntimeError(log.read()[-2000:].decode(errors="replace"))
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def section_ewc_run(args) -> dict:
    """The whole `clbench run --task pseudowords` for fft and ewc, each a fresh process and DB: peak RSS
    against SmolLM2-135M's float32 weight bytes; ewc holds fft's memory plus F and θ* (a copy each)."""
    import os
    import tempfile

    out = {"weights_mb": SMOLLM2_135M_PARAMS * 4 / 2**20}
    for method in ("fft", "ewc"):
        db = Path(tempfile.mkdtemp()) / f"{method}.duckdb"
        command = [sys.executable, "-m", "clbench.cli", "run", "--task", "pseudowords", "--method", method]
        peak, seconds = peak_rss_mb_of([*command, "--db", str(db)], {**os.environ, "CLBENCH_DB": str(db)})
        out |= {f"{method}_peak_rss_mb": peak, f"{method}_wall_seconds": seconds}
        out[f"{method}_peak_over_weights"] = peak / out["weights_mb"]
    out["ewc_minus_fft_over_weights"] = (out["ewc_peak_rss_mb"] - out["fft_peak_rss_mb"]) / out["weights_mb"]
    out["target"] = "ewc - fft ~ 2 x weights (F, θ*); issue 12: the ewc process within ~2.5 x weights"
    return out


def matmul_peak_gflops() -> float:
    """What this machine's float32 matmul reaches: the ceiling for any scorer of a compute-bound model."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 4096)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * 1024 * 1024 * 4096 / statistics.median(times) / 1e9


def forward_flops_per_token(model) -> float:
    """2 × the multiply-accumulates per token: every matrix but the input embedding (a lookup), the head counted
    once even where tied; attention's score/value products are left out (short texts)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2 and p is not embedding and p is not head)
    return 2.0 * (matrices + head.numel())


def section_eval(args) -> dict:
    """clbench's scoring vs lm-eval's rolling log-likelihood: same model, same texts, one batch size."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from clbench.data import Encoded, encode_texts
    from clbench.evaluate import score
    from clbench.session import Session

    session = Session(device="cpu")
    base = session.base(args.eval_model)
    if args.eval_corpus:  # leads of a corpus, as a task's old text is drawn, but as many and as long as asked
        from clbench.corpora import documents, leads

        texts = leads(documents(args.eval_corpus), args.eval_texts, args.eval_chars, random.Random(0))
    else:
        task = __import__("clbench.taskspec", fromlist=["load_tasks"]).load_tasks().get(args.eval_task)
        texts = task.build(task.resolved()[2], base.tokenizer).old_text[: args.eval_texts]
    tokenizer, model = base.tokenizer, base.model
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.eval_batch, device="cpu", logits_cache=False)
    requests = [Instance("loglikelihood_rolling", {}, (text,), i) for i, text in enumerate(texts)]
    ours, theirs = [], []
    scored = lambda encoded: score(
        model, encoded, old_vocab=len(tokenizer), pad_id=tokenizer.pad_token_id, batch_size=args.eval_batch
    )
    scored(
        encode_texts(tokenizer, texts, base.max_length)
    )  # warm-up for both: first-call allocations and kernel choices
    for _ in range(args.repeats):
        start = time.perf_counter()  # tokenizing is inside both timings: lm-eval's includes its own
        encoded = encode_texts(tokenizer, texts, base.max_length)
        scores = scored(encoded)
        ours.append(scores.n_full / (time.perf_counter() - start))
        start = time.perf_counter()
        loglik = lm.loglikelihood_rolling(requests, disable_tqdm=True)
        seconds = time.perf_counter() - start
        # lm-eval scores the text's tokens after its prefix token; clbench also scores eos
        theirs.append((scores.n_full - len(texts)) / seconds)
    # agreement on exactly lm-eval's tokens: [bos] text, every text token scored, no eos
    without_eos = [Encoded(e.ids[:-1], e.loss_from) for e in encoded]
    same = scored(without_eos)
    lm_eval_nll = -sum(loglik)
    peak, flops = matmul_peak_gflops(), forward_flops_per_token(model)
    utilisation = lambda tokens_per_s: tokens_per_s * flops / 1e9 / peak
    return {
        "model": args.eval_model,
        "text": args.eval_corpus or f"old_text of {args.eval_task}",
        "texts": len(texts),
        "scored_tokens": scores.n_full,
        "batch_size": args.eval_batch,
        "clbench_tokens_per_s": statistics.median(ours),
        "lm_eval_tokens_per_s": statistics.median(theirs),
        "ratio": statistics.median(ours) / statistics.median(theirs),
        "target": ">= 1.5",
        "ratio_per_repeat": [round(a / b, 3) for a, b in zip(ours, theirs)],
        "lm_eval_nll_sum": lm_eval_nll,
        "clbench_nll_sum": same.nll_full,
        "tokens_compared": same.n_full,
        "relative_difference": abs(same.nll_full - lm_eval_nll) / lm_eval_nll,
        "matmul_peak_gflops": peak,
        "forward_gflop_per_token": flops / 1e9,
        "clbench_fraction_of_matmul_peak": utilisation(statistics.median(ours)),
        "lm_eval_fraction_of_matmul_peak": utilisation(statistics.median(theirs)),
    }


def section_reuse(args) -> dict:
    """An identical rerun of `clbench run` against a filled DB vs the first run (subprocesses)."""
    import tempfile

    db = Path(tempfile.mkdtemp()) / "reuse.duckdb"
    command = [
        sys.executable,
        "-m",
        "clbench.cli",
        "run",
        "--task",
        "arithmetic",
        "--method",
        "et,fft",
        "--seeds",
        "0,1",
        "--db",
        str(db),
    ]
    timings = []
    for _ in range(2):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        timings.append(time.perf_counter() - start)
    return {"first_run_seconds": timings[0], "identical_rerun_seconds": timings[1], "ratio": timings[1] / timings[0]}


def section_front_door(args) -> dict:
    """Item 5: the README's main command on the offline defaults, a fresh DB (base models already cached)."""
    import tempfile

    db = Path(tempfile.mkdtemp()) / "all.duckdb"
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "clbench.cli", "run", "--task", "all", "--method", "et", "--db", str(db)],
        capture_output=True,
        check=True,
    )
    return {
        "command": "clbench run --task all --method et",
        "wall_seconds": time.perf_counter() - start,
        "target": "minutes",
    }


def section_et_eval(args) -> dict:
    """An ET run's old-text evaluation on pseudowords' `--profile cpu` data (SmolLM2-135M): the forward pass
    over old text, as before issue 12, against the head alone over the base's kept hidden states (what a
    frozen backbone gets now). Repeats interleaved; the two must give the same numbers, bit for bit."""
    from clbench.evaluate import positions, score
    from clbench.session import Session, old_sets

    session = Session(device="cpu")
    task = __import__("clbench.taskspec", fromlist=["load_tasks"]).load_tasks().get("pseudowords")
    model_ref, budget, params = task.resolved("cpu")
    base = session.base(model_ref)
    data = session.data(task, params, base)
    old, _ = old_sets(base, data)
    model = copy.deepcopy(base.model)
    tokenizer = copy.deepcopy(base.tokenizer)
    expand(model, tokenizer, data.new_tokens, init="random", seed=0)
    bs, pad, vocab = budget.eval_batch_size, base.tokenizer.pad_token_id, len(base.tokenizer)
    kept = list(positions(base.model, old, pad_id=pad, batch_size=bs))
    timed = {"forward": [], "head_only": []}
    for repeat in range(min(args.repeats, 3)):
        for name in ("forward", "head_only") if repeat % 2 == 0 else ("head_only", "forward"):
            start = time.perf_counter()
            scores = score(
                model, old, old_vocab=vocab, pad_id=pad, batch_size=bs, at=kept if name == "head_only" else None
            )
            timed[name].append(time.perf_counter() - start)
            if name == "forward":
                fresh = scores
            else:
                reused = scores
    return {
        "data": f"pseudowords --profile cpu old text: {len(old)} passages, {fresh.n_full} scored tokens, eval batch {bs}",
        "forward_seconds": statistics.median(timed["forward"]),
        "head_only_seconds": statistics.median(timed["head_only"]),
        "ratio_head_only_over_forward": statistics.median(timed["head_only"]) / statistics.median(timed["forward"]),
        "identical": (fresh.nll_old, fresh.nll_full) == (reused.nll_old, reused.nll_full),
        "target": "ET-family runs skip the old-text forward pass, metrics bit-identical (issue 12)",
    }


def section_drift(args) -> dict:
    """What measuring transition drift adds to a run's old-text evaluation (pseudowords `--profile cpu` data,
    SmolLM2-135M): score() without and with the base's reference (its head over its kept hidden states, and the
    KLs), for a frozen backbone (head only) and for a trained one (the forward pass too). Repeats interleaved."""
    from clbench.evaluate import Reference, head_of, positions, score
    from clbench.session import Session, old_sets

    session = Session(device="cpu")
    task = __import__("clbench.taskspec", fromlist=["load_tasks"]).load_tasks().get("pseudowords")
    model_ref, budget, params = task.resolved("cpu")
    base = session.base(model_ref)
    old, _ = old_sets(base, session.data(task, params, base))
    model, tokenizer = copy.deepcopy(base.model), copy.deepcopy(base.tokenizer)
    expand(model, tokenizer, session.data(task, params, base).new_tokens, init="random", seed=0)
    bs, pad, vocab = budget.eval_batch_size, base.tokenizer.pad_token_id, len(base.tokenizer)
    kept = list(positions(base.model, old, pad_id=pad, batch_size=bs))
    reference = Reference(kept, head_of(base.model, vocab))
    cases = {
        (backbone, drift): {"at": kept if backbone == "frozen" else None, "reference": reference if drift else None}
        for backbone in ("frozen", "trained")
        for drift in (False, True)
    }
    timed = {case: [] for case in cases}
    for repeat in range(min(args.repeats, 3)):
        for case in cases if repeat % 2 == 0 else reversed(cases):
            start = time.perf_counter()
            score(model, old, old_vocab=vocab, pad_id=pad, batch_size=bs, **cases[case])
            timed[case].append(time.perf_counter() - start)
    median = {case: statistics.median(seconds) for case, seconds in timed.items()}
    return {
        "data": f"pseudowords --profile cpu old text: {len(old)} passages, eval batch {bs}",
        **{f"{b}_backbone_{'with' if d else 'without'}_drift_seconds": median[b, d] for b, d in median},
        "ratio_frozen_with_over_without": median["frozen", True] / median["frozen", False],
        "ratio_trained_with_over_without": median["trained", True] / median["trained", False],
    }


def store_record(step: int, *, curves: int = 200) -> tuple[dict, dict, list[tuple]]:
    """One run's record as the protocol writes it: ~60 metrics and a 200-step training curve."""
    from datetime import datetime

    run_id = f"{step:016x}"
    run = {
        "run_id": run_id, "task": "pseudowords", "task_version": 1, "method": ["et", "fft", "lora"][step % 3],
        "model": "builtin:smollm2-135m", "seed": step % 3, "status": "finished", "reason": None,
        "config": {"seed": step % 3, "budget": {"steps": curves}, "split": "test"}, "model_fingerprint": "m" * 16,
        "data_fingerprint": "d" * 16, "versions": {"torch": torch.__version__}, "git_commit": None,
        "started_at": datetime(2026, 1, 1), "finished_at": datetime(2026, 1, 1), "spec": {"task": "pseudowords"},
    }  # fmt: skip
    metrics = {f"metric_{i:02d}": random.random() for i in range(60)}
    return run, metrics, [(1, i, random.random(), 1e-3, 1.0) for i in range(curves)]


def section_store(args) -> dict:
    """Recording one run and `clbench results` over N records: the record store (a directory, one record per
    run) against the single-file DuckDB store, side by side in one process, interleaved."""
    import tempfile

    from clbench.cli import summary
    from clbench.records import RecordStore
    from clbench.store import Store

    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        stores = {"file": Store(Path(scratch) / "r.duckdb"), "records": RecordStore(Path(scratch) / "records")}
        times = {name: [] for name in stores}
        for step in range(args.store_runs):
            run, metrics, curves = store_record(step)
            for name, store in stores.items():  # interleaved: machine noise hits both
                start = time.perf_counter()
                store.record(run, metrics, curves=curves)
                times[name].append(time.perf_counter() - start)
        for name in stores:
            out[f"record_ms_median_{name}"] = round(1000 * statistics.median(times[name]), 2)
        queries = {name: [] for name in stores}
        for _ in range(args.repeats):
            for name, store in stores.items():
                start = time.perf_counter()
                summary(store)
                queries[name].append(time.perf_counter() - start)
        for name in stores:
            out[f"results_s_median_{name}"] = round(statistics.median(queries[name]), 3)
    out["records"] = args.store_runs
    out["record_ratio_records_vs_file"] = round(out["record_ms_median_records"] / out["record_ms_median_file"], 2)
    out["results_ratio_records_vs_file"] = round(out["results_s_median_records"] / out["results_s_median_file"], 2)
    return out


SECTIONS = {
    "overhead": section_overhead,
    "et-vs-fft": section_et_vs_fft,
    "eval": section_eval,
    "reuse": section_reuse,
    "front-door": section_front_door,
    "optimizer": section_optimizer,
    "ewc-fisher": section_ewc_fisher,
    "ewc-run": section_ewc_run,
    "et-eval": section_et_eval,
    "drift": section_drift,
    "store": section_store,
}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, method, shape, steps = sys.argv
        print(json.dumps(child_step_cost(method, shape, int(steps))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-fisher":
        print(json.dumps(child_fisher(int(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--only", choices=list(SECTIONS))
    parser.add_argument("--eval-model", default="builtin:arith-llama")
    parser.add_argument("--eval-task", default="arithmetic", help="whose old_text the eval section scores")
    parser.add_argument("--eval-corpus", help="score leads of this corpus instead (e.g. wiki-offline:en-us)")
    parser.add_argument("--eval-texts", type=int, default=500)
    parser.add_argument("--eval-chars", type=int, default=1000, help="with --eval-corpus: characters per lead at most")
    parser.add_argument("--eval-batch", type=int, default=32)
    parser.add_argument("--smol-steps", type=int, default=5, help="optimizer: fft steps per run (the first untimed)")
    parser.add_argument("--fisher-examples", type=int, default=32, help="ewc-fisher: replay texts the Fisher takes")
    parser.add_argument("--store-runs", type=int, default=1000, help="store: records written, then queried")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, repeats {args.repeats}")
    for name, section in SECTIONS.items():
        if args.only in (None, name):
            print(f"== {name}")
            print(json.dumps(section(args), indent=1))


if __name__ == "__main__":
    main()
