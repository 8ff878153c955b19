"""The character-level text data set: corpora, windows, vocabulary, download, bad input."""

import hashlib
import re

import pytest
import torch
import yaml

from test_bad_input import one_line_error, sets

from gossamer.cli import main
from gossamer.config import ConfigError, load_config
from gossamer.data import load_dataset, text
from gossamer.data.files import Remote
from gossamer.data.text import encode


def text_cfg(*overrides):
    return load_config(None, ["dataset=text", "model=transformer", *overrides])


def test_default_corpus_is_the_offline_pydoc_topics():
    from pydoc_data.topics import topics

    corpus = "\n\n".join(topics[k] for k in sorted(topics))
    data = load_dataset(text_cfg("context=64"))
    assert data.task == "language-model" and data.num_classes == len(set(corpus))
    split = int(0.9 * len(corpus))
    assert data.x_train.shape == ((split - 1) // 64, 64) and data.x_test.shape == ((len(corpus) - split - 1) // 64, 64)
    vocabulary = data.resolved["vocabulary"]
    assert vocabulary == "".join(sorted(set(corpus)))
    # window i: the characters [64 i, 64 i + 64), targets shifted by one
    decoded = "".join(vocabulary[t] for t in data.x_train[3].tolist())
    assert decoded == corpus[192:256]
    assert torch.equal(data.y_train[3, :-1], data.x_train[3, 1:]) and data.y_train[3, -1] == data.x_train[4, 0]


def test_text_file_split_by_position(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abcdefghij" * 10 + "é" * 11, encoding="utf-8")  # 111 characters, one of them non-ASCII
    data = load_dataset(text_cfg(f"text_file={path}", "context=4"))
    assert data.num_classes == 11 and data.resolved["vocabulary"] == "abcdefghijé"
    assert len(data.x_train) == (99 - 1) // 4 and len(data.x_test) == (12 - 1) // 4
    assert data.x_test[0, 0] == 9 and (data.x_test.flatten()[1:] == 10).all()  # the last 12: "j", then "é"s
    short = load_dataset(text_cfg(f"text_file={path}", "context=4", "text_chars=50"))
    assert len(short.x_train) == (45 - 1) // 4 and short.num_classes == 10


def test_vocabulary_is_recorded_and_can_be_pinned(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_text("hello world, " * 40)
    out = tmp_path / "run"
    args = ["train", "--quiet", "--out", str(out), "--set", "dataset=text", "--set", f"text_file={path}",
            "--set", "context=8", "--set", "model=transformer", "--set", "width=8", "--set", "heads=2",
            "--set", "layers=1", "--set", "workers=2", "--set", "epochs=1", "--set", "batch_size=4",
            "--set", "optimizer=adam", "--set", "lr=0.01"]
    assert main(args) == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["vocabulary"] == " ,dehlorw" and config["context"] == 8
    summary = yaml.safe_load((out / "summary.json").read_text())
    assert {"test_loss", "test_perplexity", "test_loss_local_mean"} <= summary.keys() and "test_accuracy" not in summary
    assert summary["test_perplexity"] == pytest.approx(2.718281828 ** summary["test_loss"])
    assert main(["train", str(out / "config.yaml"), "--quiet", "--out", str(tmp_path / "again")]) == 0  # reloads
    pinned = load_dataset(text_cfg(f"text_file={path}", "context=8", "vocabulary=dlrowehx ,"))
    assert pinned.num_classes == 10 and pinned.x_train[0, 0] == "dlrowehx ,".index("h")
    assert torch.equal(torch.as_tensor(encode("hole", "leho")), torch.tensor([2, 3, 0, 1]))


def test_tiny_shakespeare_download_is_checked(tmp_path, monkeypatch):
    source = tmp_path / "input.txt"
    source.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    monkeypatch.setattr(text, "TINY_SHAKESPEARE", Remote(source.as_uri(), "sha256:" + "f" * 64))
    with pytest.raises(ConfigError, match="has SHA256 .*, expected f{64}"):
        load_dataset(text_cfg("text=tiny-shakespeare", f"data_dir={tmp_path / 'data'}"))
    monkeypatch.setattr(text, "TINY_SHAKESPEARE", Remote(source.as_uri(), "sha256:" + digest))
    data = load_dataset(text_cfg("text=tiny-shakespeare", f"data_dir={tmp_path / 'data'}", "context=16"))
    assert (tmp_path / "data" / "tiny-shakespeare.txt").read_bytes() == source.read_bytes()
    assert data.resolved["vocabulary"] == "".join(sorted(set(source.read_text())))


@pytest.mark.parametrize("content, overrides, fragment", [
    (b"", [], r"text_file '.*' is empty"),
    (b"caf\xe9 au lait", [], r"text_file '.*' is not UTF-8 text \(byte 3"),
    (b"x" * 100, ["context=10"], r"context 10 is longer than the corpus allows: its 100 characters split into "
                                 r"90 \(train\) and 10 \(test\); use context <= 9"),
    (b"abc" * 50, ["vocabulary=ab"], r"1 character\(s\) not in vocabulary, e.g. \['c'\]"),
    (b"abc" * 50, ["vocabulary=abca"], "vocabulary must not repeat a character"),
    (b"abc" * 50, ["text=pydoc-topics"], "give the corpus as text or as text_file, not both"),
    (b"abc" * 50, ["data_dir=/tmp"], "data_dir applies to text: tiny-shakespeare .*not to text_file"),
    (None, [], r"text_file '.*missing.txt' does not exist"),
])
def test_bad_text_input_is_one_line(tmp_path, capsys, content, overrides, fragment):
    path = tmp_path / ("missing.txt" if content is None else "t.txt")
    if content is not None:
        path.write_bytes(content)
    err = one_line_error(capsys, ["train", "--quiet", "--out", str(tmp_path / "never"),
                                  *sets("dataset=text", "model=transformer", f"text_file={path}", *overrides)])
    assert re.search(fragment, err), err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("overrides, fragment", [
    (["text=war-and-peace"], "unknown text 'war-and-peace'; choose one of: pydoc-topics, tiny-shakespeare"),
    (["context=0"], "context must be a positive integer"),
    (["data_dir=/tmp"], "data_dir applies to text: tiny-shakespeare (a downloaded corpus), not to pydoc-topics"),
    (["heads=3"], "heads must divide width: 3 does not divide 128"),
    (["partition=dirichlet"], "partition 'dirichlet' splits classes among workers"),
])
def test_bad_text_options(capsys, overrides, fragment):
    one_line_error(capsys, ["train", "--quiet", "--out", "/nonexistent/never",
                            *sets("dataset=text", "model=transformer", *overrides)], fragment)
