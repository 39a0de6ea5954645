"""The control that adds no token (nonew): fft's training, on the task's training text as the base tokenizer reads
it, each new token written as what it stands for where the task knows it (pseudowords: the true word; xling: the
language's text, continued training without vocabulary expansion).

The budget, lr search and scoring are every method's: what this run gains on the target text and loses on the old
text is what adapting to the corpus does without learning any new token; a method's gain beyond it is what its new
tokens add (clbench/protocol.py base_reading)."""

from clbench.baselines.fft import FFT, FFTConfig
from clbench.method import register_method

register_method(
    "nonew",
    FFTConfig,
    FFT,
    train_vocab="full",
    adds_tokens=False,
    description="Control: full fine-tuning on the training text as the base tokenizer reads it, no new token",
)
