"""A tiny results database written through Store.record, for the leaderboard tests (no training)."""

from __future__ import annotations

from datetime import datetime

from clbench.store import Store

EVIL = "<script>alert(1)</script>"


def record(
    store: Store,
    run_id: str,
    task: str,
    method: str,
    model: str,
    seed: int,
    metrics: dict[str, float],
    *,
    n_train: int = 200,
    status: str = "finished",
    reason: str | None = None,
    lr: float = 0.01,
    params: dict | None = None,
    profile: str | None = None,
    split: str | None = None,
    generations: list[tuple] = (),
    task_version: int = 1,
) -> None:
    config = {
        "task": task,
        "budget": {"n_train": n_train, "steps": 10},
        "method": method,
        "model": model,
        "method_config": {"lr": lr},
        "init": "random",
        "profile": profile,
        "seed": seed,
        **({"params": params} if params is not None else {}),
        **({"split": split} if split is not None else {}),
    }
    store.record(
        {
            "run_id": run_id,
            "task": task,
            "task_version": task_version,
            "method": method,
            "model": model,
            "seed": seed,
            "status": status,
            "reason": reason,
            "config": config,
            "model_fingerprint": "m",
            "data_fingerprint": "d",
            "versions": {"clbench": "0.1.0"},
            "git_commit": "abc123",
            "started_at": datetime(2026, 1, 2, 3, 4, 5),
            "finished_at": datetime(2026, 1, 2, 3, 5, 0),
        },
        metrics,
        generations=generations,
    )


def tiny_db(path) -> Store:
    """Two tasks; `arith` has et (2 seeds) and fft (1 seed) at n_train 200 and 50; the evil task has
    an evil method and model; one failed run and one finished run without metrics."""
    store = Store(path)
    m = lambda acc, fo, ff: {
        "target_acc": acc,
        "forgetting_oldvocab": fo,
        "forgetting_full": ff,
        "trainable_params": 128,
    }
    record(store, "et0", "arith", "et", "tiny", 0, m(0.8, 0.0, 0.02))
    record(store, "et1", "arith", "et", "tiny", 1, m(0.9, 0.0, 0.04))
    record(store, "fft0", "arith", "fft", "tiny", 0, m(0.95, 0.3, 0.3) | {"trainable_params": 5000})
    record(store, "et0-50", "arith", "et", "tiny", 0, m(0.6, 0.0, 0.01), n_train=50)
    record(store, "fft0-50", "arith", "fft", "tiny", 0, m(0.5, 0.4, 0.4) | {"trainable_params": 5000}, n_train=50)
    record(store, "bad", "arith", "fft", "tiny", 1, {}, status="failed", reason="diverged: loss nan at step 3")
    record(store, "partial", "arith", "et", "tiny", 2, {})
    record(store, "evil0", EVIL, EVIL, EVIL, 0, m(0.5, 0.1, 0.2))
    record(store, "evil1", EVIL, "et", "tiny", 0, m(0.7, 0.0, 0.3))
    return store


# seeds_db: per method and seed, (target_loss, target_loss_se, forgetting_oldvocab, forgetting_full)
SEEDED = {
    ("et", 0.01): [(5.18, 0.010, 0.0, 0.11), (5.27, 0.012, 0.0, 0.12), (5.24, 0.014, 0.0, 0.10)],
    ("lora", 0.001): [(5.10, 0.020, 0.10, 0.13), (5.30, 0.020, 0.12, 0.12), (5.20, 0.026, 0.14, 0.14)],
    ("fft", 0.0001): [(6.00, 0.030, 1.00, 1.03), (6.10, 0.030, 1.10, 1.00), (6.20, 0.030, 0.90, 1.06)],
}


def seeds_db(path) -> Store:
    """One task, `words`: et, lora and fft at their own lr over seeds 0–2, with evaluation noise, and
    pt with one seed. On target_loss lora is best, et not significantly worse (Welch p = 0.67), fft
    significantly worse and pt untestable; pt's forgetting_oldvocab is best beside a forgetting_full of 40."""
    store = Store(path)
    for (method, lr), seeds in SEEDED.items():
        for seed, (loss, se, fo, ff) in enumerate(seeds):
            values = {"target_loss": loss, "target_loss_se": se, "forgetting_oldvocab": fo, "forgetting_full": ff}
            record(store, f"{method}{seed}", "words", method, "tiny", seed, values, lr=lr)
    pt = {"target_loss": 5.9, "forgetting_oldvocab": -0.1, "forgetting_full": 40.0}
    record(store, "pt0", "words", "pt", "tiny", 0, pt, lr=0.1)
    return store
