"""Character-level language modelling on a UTF-8 text.

The corpus is ``text_file`` (any UTF-8 file), or a named ``text``: ``pydoc-topics`` (the default,
offline: the English text of the Python documentation topics that ship with every Python,
``pydoc_data.topics``, about 465,000 characters — its exact content depends on the Python version)
or ``tiny-shakespeare`` (Karpathy's 1.1 MB file, downloaded once to ``data_dir``).

With ``text_chars``, only the corpus's first ``text_chars`` characters are used. The first 90 %
of the characters are the training text, the last 10 % the test text. Each is cut into
consecutive windows of ``context`` + 1 characters: a sample's input is a window's first
``context`` tokens, its target the next token at every position (inputs and targets int64
[N, context]). Tokens are the positions of the characters in ``vocabulary`` — by default every
character of the corpus, in code-point order, which is written to the run's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..registry import ConfigError, positive_ints
from .base import DATASETS, Dataset
from .files import FileOptions, Remote, fetch, missing

TRAIN_FRACTION = 0.9
CORPORA = ("pydoc-topics", "tiny-shakespeare")
TINY_SHAKESPEARE = Remote("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
                          "sha256:86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")


@dataclass
class TextOptions(FileOptions):
    text: str | None = None  # a named corpus (pydoc-topics, tiny-shakespeare); None: pydoc-topics
    text_file: str | None = None  # or any UTF-8 file
    text_chars: int | None = None  # use only the corpus's first text_chars characters (None: all)
    context: int = 64  # characters a sample sees (the sequence length)
    vocabulary: str | None = None  # the characters, a token being its position; None: the corpus's

    def validate(self, cfg) -> None:
        super().validate(cfg)
        if self.text is not None and self.text not in CORPORA:
            raise ConfigError(f"unknown text '{self.text[:100]}'; choose one of: {', '.join(CORPORA)} "
                              f"(or give text_file: PATH)")
        if self.text is not None and self.text_file is not None:
            raise ConfigError("give the corpus as text or as text_file, not both")
        if self.data_dir is not None and self.corpus != "tiny-shakespeare":
            raise ConfigError(f"data_dir applies to text: tiny-shakespeare (a downloaded corpus), not to "
                              f"{'text_file' if self.text_file else self.corpus}")
        positive_ints(self, "context", *(["text_chars"] if self.text_chars is not None else []))
        if self.vocabulary is not None and len(set(self.vocabulary)) != len(self.vocabulary):
            raise ConfigError("vocabulary must not repeat a character")

    @property
    def corpus(self) -> str:
        return "text_file" if self.text_file is not None else self.text or "pydoc-topics"


def read_corpus(options: TextOptions) -> str:
    """The text of the chosen corpus."""
    if options.text_file is not None:
        return read_text_file(Path(options.text_file).expanduser())
    if options.corpus == "pydoc-topics":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics))
    path = options.root / "tiny-shakespeare.txt"
    if not path.is_file():
        if not options.download:
            raise missing("tiny-shakespeare.txt", options.root, TINY_SHAKESPEARE)
        fetch(TINY_SHAKESPEARE, path, "tiny-shakespeare.txt")
    return read_text_file(path)


def read_text_file(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"text_file '{path}' does not exist or is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"text_file '{path}' is not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not text:
        raise ConfigError(f"text_file '{path}' is empty")
    return text


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def encode(text: str, vocabulary: str) -> np.ndarray:
    """Each character's position in ``vocabulary`` (int64); every character must be in it."""
    vocab = _codes(vocabulary)
    order = np.argsort(vocab)
    codes = _codes(text)
    pos = np.minimum(np.searchsorted(vocab[order], codes), len(vocab) - 1)
    known = vocab[order][pos] == codes
    if not known.all():
        absent = sorted({chr(c) for c in codes[~known]})
        raise ConfigError(f"the text has {len(absent)} character(s) not in vocabulary, e.g. {absent[:5]!r}")
    return order[pos].astype(np.int64)


def windows(tokens: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Consecutive windows of context + 1 tokens: inputs [N, context] and next-token targets [N, context]."""
    count = (len(tokens) - 1) // context
    t = torch.from_numpy(tokens)
    x = t[: count * context].view(count, context)
    y = t[1 : count * context + 1].view(count, context)
    return x.clone(), y.clone()


def load_text(options: TextOptions) -> Dataset:
    """The data set; its ``resolved`` options hold the vocabulary (for the run's config)."""
    text = read_corpus(options)[: options.text_chars]
    vocabulary = options.vocabulary or "".join(map(chr, np.unique(_codes(text))))
    tokens = encode(text, vocabulary)
    split = int(len(tokens) * TRAIN_FRACTION)
    shortest = min(split, len(tokens) - split)
    if options.context > shortest - 1:
        raise ConfigError(f"context {options.context} is longer than the corpus allows: its {len(tokens)} "
                          f"characters split into {split} (train) and {len(tokens) - split} (test); use "
                          f"context <= {max(shortest - 1, 0)} or a longer text (text_chars {options.text_chars})")
    x_train, y_train = windows(tokens[:split], options.context)
    x_test, y_test = windows(tokens[split:], options.context)
    return Dataset(x_train, y_train, x_test, y_test, len(vocabulary), task="language-model",
                   resolved={"vocabulary": vocabulary})


@DATASETS.register("text", options=TextOptions,
                   help="character-level language modelling on a UTF-8 text (default: pydoc-topics, offline)")
def _text(cfg) -> Dataset:
    return load_text(cfg.options["dataset"])
