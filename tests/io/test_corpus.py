"""Document-collection converters: UCI bag-of-words and plain text -> corpus stores."""

import gzip

import numpy as np
import pytest

from dmp.cli import main
from dmp.io import DatasetError, convert_corpus, open_dataset, read_text_corpus, read_uci_bow

DOCWORD = "3\n5\n6\n1 1 2\n1 3 1\n2 2 4\n2 5 1\n3 1 1\n3 4 3\n"
VOCAB = "apple\nbanana\ncherry\ndate\nelder\n"


def _uci(tmp_path, docword=DOCWORD, vocab=VOCAB, gz=False):
    d = tmp_path / ("docword.t.txt.gz" if gz else "docword.t.txt")
    if gz:
        with gzip.open(d, "wt") as f:
            f.write(docword)
    else:
        d.write_text(docword)
    v = tmp_path / "vocab.t.txt"
    v.write_text(vocab)
    return d, v


@pytest.mark.parametrize("gz", [False, True])
def test_uci_bag_of_words_roundtrip(tmp_path, gz):
    d, v = _uci(tmp_path, gz=gz)
    X, vocab = read_uci_bow(d, v)
    expected = np.array([[2, 0, 1, 0, 0], [0, 4, 0, 0, 1], [1, 0, 0, 3, 0]], dtype=float)
    np.testing.assert_array_equal(X.toarray(), expected)
    assert vocab == ["apple", "banana", "cherry", "date", "elder"]
    ds = convert_corpus(d, tmp_path / "c.zarr", vocab=v, n_shards=2)
    Xs, _ = ds.load_row_shards([0, 1])
    np.testing.assert_array_equal(Xs.toarray(), expected)
    assert list(open_dataset(ds.path).load_vocabulary()) == vocab


@pytest.mark.parametrize("docword, vocab, match", [
    ("3\n5\n", VOCAB, "three header lines"),
    ("3\nfive\n6\n", VOCAB, "header line W must be an integer"),
    (DOCWORD.replace("2 5 1", "2 6 1"), VOCAB, r"wordID 6 outside 1\.\.5"),
    (DOCWORD.replace("3 1 1", "4 1 1"), VOCAB, r"docID 4 outside 1\.\.3"),
    (DOCWORD.replace("3 4 3", "3 4 0"), VOCAB, "count 0 must be >= 1"),
    (DOCWORD.replace("3 4 3", "3 4 x"), VOCAB, r"docword.t.txt:9: expected 'docID wordID"),
    (DOCWORD.replace("3 4 3", "3 4 3 7"), VOCAB, "docword.t.txt:9"),
    (DOCWORD.rsplit("3 4 3", 1)[0], VOCAB, "NNZ = 6, the file has 5 entries"),
    (DOCWORD.replace("3 4 3", "1 1 3"), VOCAB, "listed more than once"),
    (DOCWORD, "apple\nbanana\n", "2 words, the docword header says W = 5"),
])
def test_uci_errors_name_the_problem(tmp_path, docword, vocab, match):
    d, v = _uci(tmp_path, docword, vocab)
    with pytest.raises(DatasetError, match=match):
        convert_corpus(d, tmp_path / "c.zarr", vocab=v)
    assert not (tmp_path / "c.zarr").exists()


def test_uci_huge_declared_sizes_allocate_nothing(tmp_path):
    d, v = _uci(tmp_path, "1000000000000\n1000000000000\n1000000000000\n1 1 1\n", "a\n")
    with pytest.raises(DatasetError, match="beyond int64"):
        read_uci_bow(d)
    d, v = _uci(tmp_path, "3\n5\n1000000000000\n1 1 1\n", VOCAB)
    with pytest.raises(DatasetError, match="NNZ = 1000000000000, the file has 1 entries"):
        read_uci_bow(d)
    d, v = _uci(tmp_path, "1000000000000\n5\n1\n1 1 1\n", VOCAB)
    with pytest.raises(DatasetError, match=r"D = 1000000000000 documents declares [\d,.]+ GiB"):
        read_uci_bow(d)


def test_text_corpus_per_line_and_per_file(tmp_path):
    lines = ["The cat sat on the mat, the cat!", "Dogs and cats: a dog's life.",
             "", "cat dog cat dog mat", "zebra"]
    f = tmp_path / "docs.txt"
    f.write_text("\n".join(lines) + "\n")
    X, vocab, kept = read_text_corpus(f, min_count=2)
    # sklearn's tokeniser and English stop words, then words seen >= 2 times in all
    from sklearn.feature_extraction.text import CountVectorizer

    cv = CountVectorizer(stop_words="english")
    C = cv.fit_transform(lines)
    keep = np.asarray(C.sum(axis=0)).ravel() >= 2
    ref = C[:, keep].toarray()
    ref_kept = np.flatnonzero(ref.sum(axis=1) > 0)
    assert vocab == list(cv.get_feature_names_out()[keep])
    np.testing.assert_array_equal(X.toarray(), ref[ref_kept])
    np.testing.assert_array_equal(kept, ref_kept)
    d = tmp_path / "dir"
    d.mkdir()
    for i, text in enumerate(lines):
        (d / f"doc{i:02d}.txt").write_text(text)
    X2, vocab2, _ = read_text_corpus(d, per="file", min_count=2)
    assert vocab2 == vocab and (X2 != X).nnz == 0


def test_text_errors(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DatasetError, match="not UTF-8"):
        read_text_corpus(bad)
    only_stop = tmp_path / "stop.txt"
    only_stop.write_text("the and of\nit is\n")
    with pytest.raises(DatasetError, match="no words left"):
        read_text_corpus(only_stop)
    rare = tmp_path / "rare.txt"
    rare.write_text("alpha beta\ngamma\n")
    with pytest.raises(DatasetError, match="min_count=5"):
        read_text_corpus(rare)
    with pytest.raises(FileNotFoundError):
        read_text_corpus(tmp_path / "nope", per="file")
    with pytest.raises(ValueError, match="min_count"):
        read_text_corpus(rare, min_count=0)


def test_cli_converts_uci_and_text(tmp_path, capsys):
    d, v = _uci(tmp_path)
    assert main(["data", "convert", "uci", str(d), str(tmp_path / "u.zarr"), "--vocab",
                 str(v), "--shards", "2"]) == 0
    assert open_dataset(tmp_path / "u.zarr").shape == (3, 5)
    f = tmp_path / "docs.txt"
    f.write_text("red green blue\ngreen blue\nblue red red\n")
    assert main(["data", "convert", "text", str(f), str(tmp_path / "t.zarr"),
                 "--min-count", "2", "--stop-words", "none"]) == 0
    ds = open_dataset(tmp_path / "t.zarr")
    assert list(ds.load_vocabulary()) == ["blue", "green", "red"]
    with pytest.raises(SystemExit) as exc:   # an argparse error
        main(["data", "convert", "text", str(f), str(tmp_path / "x.zarr"), "--vocab", "v.txt"])
    assert exc.value.code == 2
    assert "--vocab: not an option of text conversion" in capsys.readouterr().err


def test_document_names_round_trip_through_the_store(tmp_path, capsys):
    d = tmp_path / "letters"
    d.mkdir()
    texts = {"b.txt": "cat dog cat", "a.txt": "dog mat mat", "c.txt": "the and of",
             "d.txt": "cat mat"}   # c.txt holds stop words only: dropped
    for name, text in texts.items():
        (d / name).write_text(text)
    dest = tmp_path / "c.zarr"
    assert main(["data", "convert", "text", str(d), str(dest), "--per", "file",
                 "--min-count", "1", "--shards", "2"]) == 0
    ds = open_dataset(dest)
    names = ds.load_names()
    assert names.tolist() == ["a.txt", "b.txt", "d.txt"]
    # row i is the document names[i]: its words are the file's
    X, _ = ds.load_row_shards(list(range(ds.n_shards)))
    vocab = ds.load_vocabulary()
    for i, name in enumerate(names):
        words = {vocab[j] for j in X[i].indices}
        assert words == set(texts[name].split()) - {"the", "and", "of"}
    assert ds.validate() is ds
    capsys.readouterr()
    assert main(["data", "info", str(dest)]) == 0
    assert "names: 3 (a.txt, b.txt, d.txt)" in capsys.readouterr().out
    # one document per line: the source line; UCI: the docID
    f = tmp_path / "docs.txt"
    f.write_text("cat dog\n\nthe of\ndog mat\n")
    ds = convert_corpus(f, tmp_path / "l.zarr", format="text", min_count=1)
    assert ds.load_names().tolist() == ["line 1", "line 4"]
    assert ds.load_names(1).tolist() == ["line 4"] and ds.load_names(0, 1).tolist() == \
        ["line 1"]
    doc, v = _uci(tmp_path, "4\n5\n3\n1 1 2\n3 3 1\n4 2 4\n")
    ds = convert_corpus(doc, tmp_path / "u.zarr", vocab=v)
    assert ds.load_names().tolist() == ["docID 1", "docID 3", "docID 4"]


def test_stores_without_names_and_corrupt_names(tmp_path):
    import zarr

    from dmp.io import write_sparse_rows

    X = np.eye(3)
    assert write_sparse_rows(tmp_path / "n.zarr", X, np.zeros(3)).load_names() is None
    ds = write_sparse_rows(tmp_path / "w.zarr", X, np.zeros(3), names=["x", "y", "z"])
    assert open_dataset(ds.path).load_names().tolist() == ["x", "y", "z"]
    with pytest.raises(DatasetError, match="names has 2 entries, X has 3 rows"):
        write_sparse_rows(tmp_path / "bad.zarr", X, np.zeros(3), names=["x", "y"])
    del zarr.open_group(ds.path)["names"]
    with pytest.raises(DatasetError, match="array 'names' is missing"):
        open_dataset(ds.path).validate()
