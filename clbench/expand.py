"""Adding the new tokens U to the tokenizer and the embedding matrices, and initialising them.

The initialisation is an explicit option because it matters (ASSETS.md: mean initialisation
sometimes stalls where random does not); every run records which one it used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tokenizers import AddedToken

from clbench.errors import ClbenchError
from clbench.sparse import omp

INIT_STRATEGIES = ("random", "mean", "subword-mean", "omp")
OMP_ATOMS = 8  # `omp` init: old rows per new row


@dataclass(frozen=True)
class Expansion:
    old_vocab: int  # |V|: ids below this are the base vocabulary
    new_ids: list[int]  # ids of U, in the order of the task's new_tokens
    tied: bool  # output embeddings share the input matrix

    @property
    def new_vocab(self) -> int:
        return self.old_vocab + len(self.new_ids)

    def part(self, start: int, count: int) -> Expansion:
        """The tokens new_ids[start : start + count] as an expansion of their own: a sequential
        task's stage, for which every token added before it counts as old."""
        return Expansion(self.old_vocab + start, self.new_ids[start : start + count], self.tied)


def check_new_tokens(tokenizer, new_tokens: list[str]) -> None:
    if len(set(new_tokens)) != len(new_tokens):
        dup = sorted({t for t in new_tokens if new_tokens.count(t) > 1})
        raise ClbenchError(f"duplicate new tokens: {dup}")
    vocab = tokenizer.get_vocab()
    clash = [t for t in new_tokens if t in vocab]
    if clash:
        raise ClbenchError(f"new token(s) already in the base vocabulary: {clash[:5]}")
    # a string the base tokenizer already reads as one known token — "times" as "Ġtimes" after a
    # space — is a word of V, not a new one: adding it would shadow that word in every old text
    for token in new_tokens:
        for text in (token, " " + token):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) == 1 and ids[0] != tokenizer.unk_token_id:
                word = tokenizer.convert_ids_to_tokens(ids[0])
                raise ClbenchError(
                    f"new token {token!r} collides with the base vocabulary's word {word!r} ({text!r} is one known token)"
                )


def check_expansion(tokenizer, new_tokens: list[str], init: str) -> None:
    """Everything expand() rejects, checked without changing anything."""
    if init not in INIT_STRATEGIES:
        raise ClbenchError(f"unknown init strategy {init!r}; known: {', '.join(INIT_STRATEGIES)}")
    check_new_tokens(tokenizer, new_tokens)


def spelled(tokenizer, text: str, *, whole_words: bool) -> list[int]:
    """What the tokenizer reads `text` as where a new token stands: a whole-word token absorbs the space
    before it, so the text is read with that space (" glorp", not "glorp")."""
    return tokenizer.encode(" " + text if whole_words else text, add_special_tokens=False)


def add_new_tokens(tokenizer, new_tokens: list[str], *, whole_words: bool) -> list[list[int]]:
    """Adds U to the tokenizer → the pieces the old tokenizer made of each new token."""
    pieces = [spelled(tokenizer, t, whole_words=whole_words) for t in new_tokens]
    if whole_words:
        tokenizer.add_tokens([AddedToken(t, single_word=True, lstrip=True, normalized=False) for t in new_tokens])
    else:
        tokenizer.add_tokens(new_tokens)
    return pieces


def expand(model, tokenizer, new_tokens: list[str], *, init: str, seed: int, whole_words: bool = False) -> Expansion:
    """Mutates model and tokenizer: |V| → |V| + |U|, new rows initialised by `init`.

    whole_words: each new token matches only as a whole word, absorbing the whitespace before it
    (a byte-level BPE marks a word's leading space inside its first token, so the new token
    stands for " word" and its sub-word pieces are those of " word")."""
    check_expansion(tokenizer, new_tokens, init)
    # |V| is the tokenizer's size: models with a padded embedding matrix (Qwen2.5: 151,936 rows
    # for 151,665 tokens) give U the unused rows first and grow the matrix only if needed.
    old_vocab = len(tokenizer)
    rows = model.get_input_embeddings().weight.shape[0]
    if old_vocab > rows:
        raise ClbenchError(f"tokenizer has {old_vocab} tokens but the model only {rows} embedding rows")
    pieces = add_new_tokens(tokenizer, new_tokens, whole_words=whole_words)
    new_ids = tokenizer.convert_tokens_to_ids(new_tokens)
    if new_ids != list(range(old_vocab, old_vocab + len(new_tokens))):
        raise ClbenchError(f"tokenizer gave the new tokens ids {new_ids[:5]}..., expected {old_vocab}...")
    if old_vocab + len(new_tokens) > rows:
        model.resize_token_embeddings(old_vocab + len(new_tokens), mean_resizing=False)
    tied = model.get_output_embeddings() is not None and (
        model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    )
    if not new_ids:  # the control that adds no token (protocol.base_reading): nothing to initialise
        return Expansion(old_vocab, [], tied)
    generator = torch.Generator().manual_seed(seed)
    matrices = [model.get_input_embeddings().weight]
    if not tied and model.get_output_embeddings() is not None:
        matrices.append(model.get_output_embeddings().weight)
    with torch.no_grad():
        for weight in matrices:
            weight[old_vocab : old_vocab + len(new_ids)] = initial_rows(
                weight[:old_vocab], pieces, init, generator
            ).to(weight.dtype)
    return Expansion(old_vocab, list(new_ids), tied)


def initial_rows(old: torch.Tensor, pieces: list[list[int]], init: str, generator: torch.Generator) -> torch.Tensor:
    old = old.detach().float().cpu()
    mean = old.mean(0)
    if init == "mean":
        return mean.expand(len(pieces), -1).clone()
    if init == "random":
        # centred on the mean row, with the spread of the existing rows
        noise = torch.randn((len(pieces), old.shape[1]), generator=generator)
        return mean + noise * old.std()
    # subword-mean: what the old tokenizer made of the token's string
    subword = torch.stack([old[ids].mean(0) if ids else mean for ids in pieces])
    if init == "omp":
        # the best OMP_ATOMS-sparse combination of old rows approximating the subword mean: the
        # paper's token-to-dictionary form from the start (a token of many pieces keeps the few
        # rows that explain most of their mean; one of at most OMP_ATOMS pieces lies in their span)
        return torch.stack([omp(old, row, OMP_ATOMS).reconstruction(old).float() for row in subword])
    return subword
