"""A short GPU check (≤ 5 min on one H100/H200): ET and FFT steps and an eval pass on a
random-initialised model of Llama-3.2-1B's shape (no weights needed), printing tokens/s and
model FLOPs utilisation (MFU).

    python bench/gpu_check.py [--batch 16 --seq 1024 --steps 10 --peak-tflops 989]

MFU counts 6·N·tokens for a training step (2·N forward, 4·N backward) with N the non-embedding
parameters plus the output head, and 2·N·tokens for evaluation; attention FLOPs are added
(12·layers·seq·d per token for training). ET skips weight gradients (≈ 4N → 2N backward);
its MFU is reported against the FFT formula so the two are comparable as "useful FFT-equivalent".
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from clbench.rows import NewRows

LLAMA_32_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                   tie_word_embeddings=True, rope_theta=500000.0)


def flops_per_token(model, seq: int, train: bool) -> float:
    config = model.config
    n = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    n += config.vocab_size * config.hidden_size  # the (tied) output head still does its matmul
    attention = 2 * config.num_hidden_layers * seq * config.hidden_size
    return (6 if train else 2) * n + (3 if train else 1) * attention * 2


def timed(fn, steps: int) -> float:
    fn()  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this check needs a CUDA GPU"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_32_1B, attn_implementation="sdpa")).to("cuda", torch.bfloat16)
    old_vocab = model.config.vocab_size - 8
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device="cuda")
    tokens = args.batch * args.seq
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {args.batch} × seq {args.seq}")

    def step(optimizer, vocab_limit=None):
        logits = model(input_ids=ids).logits[:, :-1]
        if vocab_limit:
            logits = logits[..., :vocab_limit]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1).clamp(max=(vocab_limit or 10**9) - 1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    results = {}
    # ET: fp32 master rows outside the frozen bf16 matrix, as clbench.rows.NewRows keeps them
    model.requires_grad_(False)
    rows = NewRows(model, old_vocab, 8)
    et_opt = torch.optim.AdamW([rows.weight], lr=1e-3, weight_decay=0.0)
    torch.cuda.reset_peak_memory_stats()
    results["et"] = (timed(lambda: step(et_opt, old_vocab), args.steps), torch.cuda.max_memory_allocated())
    rows.materialise()
    model.requires_grad_(True)
    fft_opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    torch.cuda.reset_peak_memory_stats()
    results["fft"] = (timed(lambda: step(fft_opt), args.steps), torch.cuda.max_memory_allocated())
    model.eval()
    with torch.inference_mode():
        torch.cuda.reset_peak_memory_stats()
        results["eval"] = (timed(lambda: model(input_ids=ids).logits, args.steps), torch.cuda.max_memory_allocated())
    for name, (seconds, memory) in results.items():
        per_token = flops_per_token(model, args.seq, train=name != "eval")
        mfu = per_token * tokens / seconds / (args.peak_tflops * 1e12)
        print(f"{name:>5}: {seconds * 1e3:8.1f} ms/step  {tokens / seconds:10.0f} tokens/s  MFU {mfu:6.1%}  peak {memory / 2**30:6.1f} GiB")
    print(f"ET/FFT time per step: {results['et'][0] / results['fft'][0]:.2f}")


if __name__ == "__main__":
    main()
