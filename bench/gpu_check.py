"""A short GPU check (≤ 5 min on one H100/H200) of clbench's own CUDA path: ET and FFT through
clbench's method registry and training loop (bf16 autocast, float32 masters, SDPA attention) and an
evaluation pass through clbench.evaluate.score, on a random-initialised model of Llama-3.2-1B's shape
(no weights needed), printing tokens/s, model FLOPs utilisation (MFU) and peak memory.

    python bench/gpu_check.py [--batch 16 --seq 1024 --steps 10 --peak-tflops 989]
    python bench/gpu_check.py --shape tiny --device cpu --steps 1     # smoke test of the script itself

The model is built in bf16, as clbench.models.load_base loads hub models on CUDA; its last 8 rows
play the new tokens U. MFU counts 6·N per trained token (2·N forward, 4·N backward) with N the
non-embedding parameters plus the output head, 2·N per scored token, plus attention. ET skips
weight gradients (≈ 4N → 2N backward); its MFU is against the FFT formula, i.e. "FFT-equivalent".
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from clbench.data import Encoded
from clbench.evaluate import score
from clbench.expand import Expansion
from clbench.method import methods
from clbench.train import train

SHAPES = {
    "llama-3.2-1b": {
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "rope_theta": 500000.0,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    },
}
N_NEW = 8


def flops_per_token(model, seq: int, train: bool) -> float:
    config = model.config
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    n += config.vocab_size * config.hidden_size  # the (tied) output head still does its matmul
    attention = 2 * config.num_hidden_layers * seq * config.hidden_size
    return (6 if train else 2) * n + (3 if train else 1) * attention * 2


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_memory(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def train_seconds_per_step(model, method: str, expansion: Expansion, examples, args) -> float:
    spec = methods().get(method)
    adapter = spec.setup(model, expansion, spec.config())
    vocab_limit = expansion.old_vocab if spec.train_vocab == "old" else None
    run = lambda steps: train(
        model,
        adapter.param_groups,
        examples,
        steps=steps,
        batch_size=args.batch,
        lr=1e-5,
        seed=0,
        pad_id=0,
        vocab_limit=vocab_limit,
    )
    run(1)  # warm-up: kernels, allocator, optimizer state
    result = run(args.steps)  # train() reads the loss every step, so its clock sees finished work
    adapter.finalize()
    return result.seconds / args.steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=list(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM: 989)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: torch sees no CUDA GPU (use --shape tiny --device cpu for a smoke test)")
    if args.shape == "tiny":
        args.seq = min(args.seq, 64)
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[args.shape], attn_implementation="sdpa")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # as load_base
    model = LlamaForCausalLM(config).to(device, dtype).eval()
    vocab = config.vocab_size
    expansion = Expansion(vocab - N_NEW, list(range(vocab - N_NEW, vocab)), tied=config.tie_word_embeddings)
    generator = torch.Generator().manual_seed(0)
    # every sequence holds new tokens, so ET's rows get gradients; 4 batches' worth of examples
    examples = [
        Encoded(torch.randint(1, vocab, (args.seq,), generator=generator).tolist(), 1) for _ in range(4 * args.batch)
    ]
    tokens = args.batch * args.seq
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"{name}, torch {torch.__version__}, {args.shape} shape, batch {args.batch} × seq {args.seq}, {args.steps} steps"
    )

    results = {}
    for method in ("et", "fft"):  # ET first: FFT turns the model into float32 masters
        reset_peak(device)
        seconds = train_seconds_per_step(model, method, expansion, examples, args)
        results[method] = (seconds, tokens, peak_memory(device))
    model.eval()
    reset_peak(device)
    score(model, examples[: args.batch], old_vocab=expansion.old_vocab, pad_id=0, batch_size=args.batch)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    scored = score(model, examples, old_vocab=expansion.old_vocab, pad_id=0, batch_size=args.batch)
    synchronize(device)
    results["eval"] = (time.perf_counter() - start, scored.n_full, peak_memory(device))
    for name, (seconds, count, memory) in results.items():
        per_token = flops_per_token(model, args.seq, train=name != "eval")
        mfu = per_token * count / seconds / (args.peak_tflops * 1e12)
        print(
            f"{name:>5}: {seconds * 1e3:9.1f} ms/{'pass' if name == 'eval' else 'step'}  {count / seconds:10.0f} tokens/s  "
            f"MFU {mfu:6.1%}  peak {memory:6.1f} GiB"
        )
    print(f"ET/FFT time per step: {results['et'][0] / results['fft'][0]:.2f}")


if __name__ == "__main__":
    main()
