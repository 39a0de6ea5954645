"""clbench: a benchmark harness for continual learning in language models."""

__version__ = "0.1.0"
