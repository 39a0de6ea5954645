"""Generator for tasks/pseudowords.yaml: invented words that stand for existing ones.

100 pseudo-words are made from syllables by a seeded generator and kept only if they are neither a
word of the task's English corpora nor a single token of the base tokenizer. Each of the first
n_words gets a dictionary of `dictionary_size` existing words (s in the paper; the ground truth is
TaskData.meaning). An example is a window of a real English sentence in which one occurrence of a
dictionary word is replaced by its pseudo-word: the prompt ends with the pseudo-word, the
completion is the words after it, so loss and accuracy measure what the pseudo-word tells about
its continuation. Train and target sentences come from different documents; the old text is
English Wikipedia-like text that contains no pseudo-word.
"""

import random
import re
from collections import Counter

from pydantic import Field, PositiveInt

from clbench import corpora
from clbench.data import Example, TaskData

N_PSEUDOWORDS = 100
ONSETS = [
    "b",
    "bl",
    "br",
    "d",
    "dr",
    "f",
    "fl",
    "fr",
    "g",
    "gl",
    "gr",
    "k",
    "kl",
    "kr",
    "m",
    "n",
    "p",
    "pl",
    "pr",
    "s",
    "sk",
    "sl",
    "sn",
    "sp",
    "st",
    "t",
    "tr",
    "v",
    "z",
    "zw",
]
NUCLEI = ["a", "e", "i", "o", "u", "oo", "ee", "ai"]
CODAS = ["", "b", "d", "g", "k", "m", "n", "p", "rp", "sh", "t", "x", "z", "nk"]
WORD = re.compile(r"[a-z]+")
COMMON_WORDS_SKIPPED = 150  # the most frequent words are function words: no meaning to map


class Params(corpora.TextParams):
    n_words: int = Field(100, ge=1, le=N_PSEUDOWORDS, description="pseudo-words used, the first n of the 100")
    dictionary_size: PositiveInt = Field(2, description="s: existing words each pseudo-word stands for")
    corpus: str = "dataset-build:eng"
    context_words: PositiveInt = Field(10, description="words of the sentence kept before the pseudo-word")
    continuation_words: PositiveInt = Field(8, description="words after it: the completion")


def pseudowords(tokenizer, known_words: set[str], seed: int) -> list[str]:
    """N_PSEUDOWORDS invented words, in a fixed order for a given (tokenizer, known words, seed)."""
    rng = random.Random(seed)
    vocab = tokenizer.get_vocab()
    chosen: list[str] = []
    while len(chosen) < N_PSEUDOWORDS:
        word = rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS)
        single_token = any(len(tokenizer.encode(form, add_special_tokens=False)) <= 1 for form in (word, " " + word))
        if word in known_words or word in chosen or word in vocab or single_token:
            continue
        chosen.append(word)
    return chosen


def words_of(docs: list[str]) -> Counter:
    return Counter(w for doc in docs for w in WORD.findall(doc.lower()))


def occurrences(sentences: list[str], dictionary: dict[str, str]) -> dict[str, list[tuple[str, int]]]:
    """dictionary word → [(sentence, index of the word in sentence.split())], mid-sentence only."""
    found: dict[str, list[tuple[str, int]]] = {w: [] for w in dictionary}
    for sentence in sentences:
        tokens = sentence.split()
        for i, token in enumerate(tokens[1:-1], 1):  # not first (no leading space), not last (no continuation)
            if token in dictionary:
                found[token].append((sentence, i))
                break  # one replacement per sentence
    return found


def examples(
    found: dict[str, list[tuple[str, int]]], dictionary: dict[str, str], params: Params, rng: random.Random
) -> tuple[list[Example], list[Example]]:
    """Round-robin over pseudo-words and, within one, over its dictionary words: the first n
    examples cover every pseudo-word and meaning about equally. → (examples, their oracles: the
    same windows with the word each pseudo-word replaced)."""
    queues = {w: rng.sample(found[w], len(found[w])) for w in sorted(found)}
    by_pseudo: dict[str, list[str]] = {}
    for word in sorted(dictionary):
        by_pseudo.setdefault(dictionary[word], []).append(word)
    out: list[Example] = []
    oracle: list[Example] = []
    while any(queues.values()):
        for pseudo in sorted(by_pseudo):
            for word in by_pseudo[pseudo]:
                if queues[word]:
                    sentence, i = queues[word].pop()
                    tokens = sentence.split()
                    context = tokens[max(0, i - params.context_words) : i]
                    completion = " " + " ".join(tokens[i + 1 : i + 1 + params.continuation_words])
                    out.append(Example(" ".join(context + [pseudo]), completion, group=None))
                    oracle.append(Example(" ".join(context + [word]), completion, group=None))
                    break  # next pseudo-word; this one's next meaning comes next round
    return out, oracle


def build(params: Params, tokenizer) -> TaskData:
    rng = random.Random(params.data_seed)
    docs = corpora.documents(params.corpus, params.corpus_documents)
    old_docs = corpora.documents(params.old_corpus, params.corpus_documents)
    counts = words_of(docs)
    pseudo = pseudowords(tokenizer, set(counts) | set(words_of(old_docs)), params.data_seed)[: params.n_words]

    # dictionaries: frequent content words (the commonest are skipped), s per pseudo-word
    candidates = [w for w, _ in counts.most_common() if len(w) >= 4][
        COMMON_WORDS_SKIPPED : COMMON_WORDS_SKIPPED + params.n_words * params.dictionary_size
    ]
    rng.shuffle(candidates)
    meaning = {
        p: sorted(candidates[i * params.dictionary_size : (i + 1) * params.dictionary_size])
        for i, p in enumerate(pseudo)
    }
    dictionary = {w: p for p, words in meaning.items() for w in words}

    train_docs, test_docs = corpora.split(docs, params.test_fraction, salt="pseudowords")
    sentences = lambda ds: [s for d in ds for s in corpora.sentences(d)]
    train, train_oracle = examples(occurrences(sentences(train_docs), dictionary), dictionary, params, rng)
    held_out, oracle = examples(occurrences(sentences(test_docs), dictionary), dictionary, params, rng)
    # validation: the held-out examples after the target set (other sentences of the test documents)
    validation = held_out[params.n_target : params.n_target + params.n_validation]

    old_eval, old_replay = corpora.split(old_docs, 0.5, salt="pseudowords-old")
    old_text = corpora.leads(old_eval, params.n_old_text, params.old_text_chars, rng)
    return TaskData(
        new_tokens=pseudo,
        train=train,
        target_test=held_out[: params.n_target],
        old_text=old_text,
        replay_text=corpora.leads(old_replay, params.n_replay, params.old_text_chars, rng),
        whole_word_tokens=True,
        meaning=meaning,
        validation=validation,
        validation_old_text=corpora.validation_leads(old_eval, params, old_text),
        target_oracle=oracle[: params.n_target],
        train_oracle=train_oracle,  # each training sentence with the word its pseudo-word replaced
        exact_match=False,  # a continuation of several words: next-token top-1 instead (target_top1)
    )
