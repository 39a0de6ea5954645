"""Generator for tasks/xling-*.yaml: vocabulary expansion to a new language.

The target-language corpus is split by document. A BPE (the `tokenizers` library) is trained on
the training documents only; its pieces that are whole words, and that the base tokenizer does not
have as one token, are counted over the training text, and the k most frequent become the new
tokens (whole-word tokens: " palabra" is one token, "palabras" is not matched). The model trains
on training-document chunks; target = held-out documents' chunks (target_loss, and target_bpb,
which compares across tokenizers); old text = English, which the new tokens never touch.
"""

import random
from collections import Counter

from pydantic import Field, PositiveInt
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from clbench import corpora
from clbench.data import Example, TaskData


class Params(corpora.TextParams):
    corpus: str = Field(description="target-language text, e.g. dataset-build:spa")
    k: PositiveInt = Field(100, description="new tokens: the k most frequent whole-word BPE pieces the base lacks")
    bpe_vocab_size: PositiveInt = 4000
    chunk_chars: PositiveInt = Field(300, description="examples are runs of whole words up to this many characters")


def train_bpe(texts: list[str], vocab_size: int) -> Tokenizer:
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    # split on whitespace and punctuation: a piece never spans two words
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    bpe.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False)
    )
    return bpe


def new_words(texts: list[str], base_tokenizer, k: int, vocab_size: int) -> list[str]:
    """The k most frequent whole-word pieces of a BPE trained on texts that the base splits."""
    bpe = train_bpe(texts, vocab_size)
    counts: Counter = Counter()
    for encoding in bpe.encode_batch(texts):
        words = encoding.word_ids
        for i, piece in enumerate(encoding.tokens):
            whole = (i == 0 or words[i - 1] != words[i]) and (i + 1 == len(words) or words[i + 1] != words[i])
            if whole and piece.isalpha() and len(piece) >= 2:
                counts[piece] += 1
    vocab = base_tokenizer.get_vocab()
    lacking = lambda w: w not in vocab and len(base_tokenizer.encode(" " + w, add_special_tokens=False)) > 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return [w for w in ranked if lacking(w)][:k]


def build(params: Params, tokenizer) -> TaskData:
    rng = random.Random(params.data_seed)
    train_docs, test_docs = corpora.split(
        corpora.documents(params.corpus, params.corpus_documents), params.test_fraction, salt="xling"
    )
    chunks = lambda docs: [c for d in docs for c in corpora.chunks(d, params.chunk_chars)]
    train_text, test_text = chunks(train_docs), chunks(test_docs)
    rng.shuffle(train_text)
    rng.shuffle(test_text)
    new = new_words(train_text, tokenizer, params.k, params.bpe_vocab_size)
    # English text can hold a new word ("de" in "Charles de Gaulle"): such passages are left out
    old_eval, old_replay = corpora.split(
        corpora.documents(params.old_corpus, params.corpus_documents), 0.5, salt="xling-old"
    )
    old_text = corpora.leads(old_eval, params.n_old_text, params.old_text_chars, rng, avoid=new)
    held_out = [Example("", t) for t in test_text]
    return TaskData(
        new_tokens=new,
        train=[Example("", t) for t in train_text],
        target_test=held_out[: params.n_target],
        old_text=old_text,
        replay_text=corpora.leads(old_replay, params.n_replay, params.old_text_chars, rng, avoid=new),
        whole_word_tokens=True,
        # the held-out chunks after the target set: other chunks of the test documents
        validation=held_out[params.n_target : params.n_target + params.n_validation],
        validation_old_text=corpora.validation_leads(old_eval, params, old_text, avoid=new),
        exact_match=False,  # a chunk of running text: next-token top-1 instead (target_top1)
    )
