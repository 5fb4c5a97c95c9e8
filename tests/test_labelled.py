"""Labelled sentences and sentence pairs: GLUE's SST-2, MRPC and STS-B, and a user's own CSV, TSV and JSONL files,
with every bad row ending as one line that names the file, the line and the column."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from attnkit.data import Labelled, check_labels, label_set, read_glue, read_labelled
from attnkit.errors import AttnkitError


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _one_line_error(call, *needles: str, absent: tuple[str, ...] = ()) -> str:
    with pytest.raises(AttnkitError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    for needle in absent:
        assert needle not in message, (needle, message)
    return message


# --- the real GLUE files


@pytest.fixture(scope="module")
def glue_dir(data_dir) -> Path:
    glue = data_dir / "glue"
    if not glue.is_dir():
        pytest.skip(f"no GLUE data in {glue}")
    return glue


def test_sst2(glue_dir, data_dir):
    train = read_glue("sst2", "train", data_dir)
    dev = read_glue("SST-2", "dev", data_dir)
    assert (len(train), len(dev)) == (67_349, 872)
    assert train.pairs is None and train.label_names == ["0", "1"] and train.label_column == "label"
    assert set(train.labels) == set(dev.labels) == {"0", "1"}
    assert label_set(train) == ["0", "1"]
    check_labels(dev, label_set(train), train.origin)
    assert train.texts[0] == "hide new secretions from the parental units " and train.labels[0] == "0"
    assert train.lines[:2] == [2, 3] and train.origin == str(glue_dir / "SST-2" / "train.tsv")
    test = read_glue("SST2", "test", data_dir)
    assert len(test) == 1_821 and test.labels is None and test.label_names is None
    assert test.index == [str(i) for i in range(1_821)]
    assert test.texts[0] == "uneasy mishmash of styles and genres ."


def test_mrpc(glue_dir, data_dir):
    train, dev = read_glue("mrpc", "train", data_dir), read_glue("MRPC", "dev", data_dir)
    assert (len(train), len(dev)) == (3_668, 408)
    assert len(train.pairs) == 3_668 and len(dev.pairs) == 408
    assert set(train.labels) == set(dev.labels) == {"0", "1"} and train.label_column == "Quality"  # BOM gone
    assert train.texts[0].startswith("Amrozi accused his brother") and train.labels[0] == "1"
    # quotes are text in GLUE's TSVs: this dev pair's second sentence opens a quote it never closes
    assert dev.pairs[0] == '"The foodservice pie business does not fit our long-term growth strategy.'
    test = read_glue("mrpc", "test", data_dir)
    assert len(test) == len(test.pairs) == len(test.index) == 1_725 and test.labels is None
    assert test.index[:2] == ["0", "1"]


def test_stsb(glue_dir, data_dir):
    train, dev = read_glue("stsb", "train", data_dir), read_glue("STS-B", "dev", data_dir)
    assert (len(train), len(dev)) == (5_749, 1_500)
    for split in (train, dev):
        assert len(split.pairs) == len(split) and split.label_names is None
        assert all(isinstance(s, float) and 0.0 <= s <= 5.0 for s in split.labels)
    assert train.labels[:2] == [5.0, 3.8] and train.texts[0] == "A plane is taking off."
    # dev is in the STS benchmark's own format: no header, and two source columns more on some lines
    assert dev.origin.endswith("sts-dev.tsv") and dev.lines[0] == 1
    assert (dev.texts[0], dev.pairs[0], dev.labels[0]) == ("A man with a hard hat is dancing.",
                                                          "A man wearing a hard hat is dancing.", 5.0)
    assert min(train.labels) == 0.0 and max(train.labels) == 5.0
    with pytest.raises(AttnkitError):
        label_set(train)  # scores have no label set
    # the STS-B here has no test split: one line naming the file it looked for and what is there
    _one_line_error(lambda: read_glue("stsb", "test", data_dir), str(glue_dir / "STS-B" / "test.tsv"), "not found",
                    "sts-dev.tsv")


def test_glue_names(tmp_path):
    _one_line_error(lambda: read_glue("cola", "train", tmp_path), "'cola'", "sst2", "mrpc", "stsb")
    _one_line_error(lambda: read_glue("sst2", "validation", tmp_path), "'validation'", "dev")
    _one_line_error(lambda: read_glue("sst2", "train", tmp_path), str(tmp_path / "SST-2" / "train.tsv"), "not found")


def test_glue_layout_in_tmp(tmp_path):
    """read_glue on GLUE-format files of its own: STS-B's GLUE dev.tsv and test.tsv, and labels GLUE never has."""
    sts = tmp_path / "glue" / "STS-B"
    sts.mkdir(parents=True)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    _write(sts / "dev.tsv", f"{head}\tscore\n0\tg\tf\t2012\t1\tnone\tnone\tA b.\tA c.\t2.5\n")
    _write(sts / "test.tsv", f"{head}\n0\tg\tf\t2012\t1\tnone\tnone\tA b.\tA c.\n1\tg\tf\t2012\t2\tn\tn\tD.\tE.\n")
    dev = read_glue("stsb", "dev", tmp_path)
    assert dev.labels == [2.5] and dev.pairs == ["A c."]
    test = read_glue("stsb", "test", tmp_path)
    assert test.labels is None and test.index == ["0", "1"] and test.texts == ["A b.", "D."]
    _write(sts / "dev.tsv", f"{head}\tscore\n0\tg\tf\t2012\t1\tnone\tnone\tA b.\tA c.\t5.5\n")
    _one_line_error(lambda: read_glue("stsb", "dev", tmp_path), f"{sts / 'dev.tsv'}:2:", "5.5", "(column score)")
    sst = tmp_path / "glue" / "SST-2"
    sst.mkdir()
    _write(sst / "train.tsv", "sentence\tlabel\ngood .\t1\nbad .\t2\n")
    _one_line_error(lambda: read_glue("sst2", "train", tmp_path), f"{sst / 'train.tsv'}:3:", "'2'",
                    "(column label)")


# --- a user's own files


def test_csv_quotes_and_commas(tmp_path):
    path = _write(tmp_path / "own.csv", 'text,label\n"Hello, world",pos\n"She said ""no"".",neg\n'
                                        '"two\nlines",pos\nplain,neg\n')
    data = read_labelled(path, text="text", label="label")
    assert data.texts == ["Hello, world", 'She said "no".', "two\nlines", "plain"]
    assert data.labels == ["pos", "neg", "pos", "neg"] and data.label_names == ["neg", "pos"]
    assert data.lines == [2, 3, 4, 6] and data.pairs is None and data.origin == str(path)


def test_tsv_keeps_quote_characters(tmp_path):
    path = _write(tmp_path / "own.tsv", 'sentence\tother\tscore\n"an open quote\tand "another"\t3\n'
                                        "it's\tfine\t0.5\n")
    data = read_labelled(path, text="sentence", text_pair="other", label="score", regression=True)
    assert data.texts == ['"an open quote', "it's"] and data.pairs == ['and "another"', "fine"]
    assert data.labels == [3.0, 0.5] and data.label_names is None


def test_jsonl(tmp_path):
    rows = [{"q": "first?", "a": "yes", "y": 1}, {"q": "second?", "a": "no", "y": 0, "extra": [1]}]
    path = _write(tmp_path / "own.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    data = read_labelled(path, text="q", text_pair="a", label="y")
    assert data.texts == ["first?", "second?"] and data.pairs == ["yes", "no"] and data.labels == ["1", "0"]
    assert label_set(data) == ["0", "1"]
    scores = read_labelled(path, text="q", label="y", regression=True)
    assert scores.labels == [1.0, 0.0]
    unlabelled = read_labelled(path, text="q")
    assert unlabelled.labels is None and unlabelled.label_names is None


@pytest.mark.parametrize("name,fmt", [("own.csv", None), ("own.tsv", None), ("own.jsonl", None),
                                      ("own.txt", "csv")])
def test_bom_and_format(tmp_path, name, fmt):
    body = {"csv": "text,label\nhi,a\n", "tsv": "text\tlabel\nhi\ta\n", "jsonl": '{"text": "hi", "label": "a"}\n'}
    kind = fmt or name.rsplit(".", 1)[1]
    path = _write(tmp_path / name, b"\xef\xbb\xbf" + body[kind].encode())
    data = read_labelled(path, text="text", label="label", format=fmt)
    assert data.texts == ["hi"] and data.labels == ["a"]


def test_gzip_and_unknown_extension(tmp_path):
    path = tmp_path / "own.tsv.gz"
    path.write_bytes(gzip.compress(b"text\tlabel\nhi\ta\n"))
    assert read_labelled(path, label="label").texts == ["hi"]
    other = _write(tmp_path / "own.txt", "text\nhi\n")
    _one_line_error(lambda: read_labelled(other), str(other), "format")
    _one_line_error(lambda: read_labelled(other, format="xml"), str(other), "'xml'")
    _one_line_error(lambda: read_labelled(tmp_path / "nope.csv"), str(tmp_path / "nope.csv"), "not found")


def test_label_set_and_check_labels(tmp_path):
    train = read_labelled(_write(tmp_path / "train.csv", "text,label\na,10\nb,2\nc,2\n"), label="label")
    assert label_set(train) == ["2", "10"]  # integers in numeric order
    dev = read_labelled(_write(tmp_path / "dev.csv", "text,label\na,2\nb,10\n"), label="label")
    check_labels(dev, label_set(train), train.origin)
    unlabelled = read_labelled(tmp_path / "dev.csv")
    check_labels(unlabelled, label_set(train), train.origin)  # nothing to check
    _one_line_error(lambda: label_set(unlabelled), str(tmp_path / "dev.csv"), "unlabelled")
    assert isinstance(train, Labelled)


# --- every bad row: one line naming the file, the line and the column; the first problem wins

def _labels(path, **kw):
    return read_labelled(path, text="text", label="label", **kw)


def _pairs(path, **kw):
    return read_labelled(path, text="text", text_pair="other", label="label", **kw)


def _scores(path):
    return read_labelled(path, text="text", label="score", regression=True)


def _dev_against_train(path):
    check_labels(_labels(path), ["neg", "pos"], "train.csv")


# name, file, content (a second bad row after the first), read, the line, the column, words of the message
BAD_ROWS = [
    ("tsv missing column", "d.tsv", "text\tlabel\nok\t1\nno label\nalso no label\n", _labels, 3, "label",
     "missing column"),
    ("csv missing column", "d.csv", 'text,label\n"a, b",1\nonly text\n,\n', _labels, 3, "label", "missing column"),
    ("jsonl missing key", "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n{"label": 1}\n', _labels, 2, "label",
     "missing column"),
    ("tsv empty text", "d.tsv", "text\tlabel\nok\t1\n   \t0\n\t1\n", _labels, 3, "text", "empty text"),
    ("csv empty pair", "d.csv", 'text,other,label\na,b,1\na,"",0\n,,\n', _pairs, 3, "other", "empty text"),
    ("jsonl empty text", "d.jsonl", '{"text": "a", "label": 1}\n{"text": " ", "label": 1}\n{"text": ""}\n',
     _labels, 2, "text", "empty text"),
    ("jsonl text not a string", "d.jsonl", '{"text": 3, "label": 1}\n{"text": null}\n', _labels, 1, "text",
     "not a string"),
    ("tsv empty label", "d.tsv", "text\tlabel\nok\t1\nno\t \nx\n", _labels, 3, "label", "empty label"),
    ("jsonl null label", "d.jsonl", '{"text": "a", "label": null}\n{"text": "b"}\n', _labels, 1, "label", "null"),
    ("tsv score not a number", "d.tsv", "text\tscore\na\t4.5\nb\thigh\nc\tlow\n", _scores, 3, "score",
     "'high' is not a number"),
    ("csv score not finite", "d.csv", "text,score\na,nan\nb,x\n", _scores, 2, "score", "not a finite number"),
    ("jsonl score a boolean", "d.jsonl", '{"text": "a", "score": true}\n{"text": "b", "score": "x"}\n', _scores, 1,
     "score", "not a number"),
    ("dev label training never saw", "dev.csv", "text,label\na,pos\nb,neutral\nc,other\n", _dev_against_train, 3,
     "label", "'neutral' is not among the labels of train.csv"),
    ("header without the column", "d.tsv", "sentence\tscore\na\t1\n", _labels, 1, "text", "'sentence', 'score'"),
    ("csv header without the column", "d.csv", "text,Label\na,1\n", _labels, 1, "label", "'text', 'Label'"),
    ("tsv extra column", "d.tsv", "text\tlabel\nok\t1\na\tb\t1\nc\td\t1\n", _labels, 3, "3", "extra value '1'"),
    ("tsv empty line", "d.tsv", "text\tlabel\nok\t1\n\nx\n", _labels, 3, "text", "empty line"),
    ("jsonl empty line", "d.jsonl", '{"text": "a", "label": 1}\n\n{"text": "b"}\n', _labels, 2, "text",
     "empty line"),
]


@pytest.mark.parametrize("name,file,content,read,line,column,words", BAD_ROWS, ids=[row[0] for row in BAD_ROWS])
def test_bad_row(tmp_path, name, file, content, read, line, column, words):
    path = _write(tmp_path / file, content)
    message = _one_line_error(lambda: read(path), f"{path}:{line}: ", f"(column {column}", words,
                              absent=(f"{path}:{line + 1}:",))
    assert message.startswith(f"{path}:{line}: "), message


# bad files and rows that have no column to name: the file and, where there is one, the line
BAD_FILES = [
    ("empty csv", "d.csv", "", None, "empty file"),
    ("empty tsv with a BOM only", "d.tsv", b"\xef\xbb\xbf", None, "empty file"),
    ("header and no rows", "d.tsv", "text\tlabel\n", 1, "a header and no rows"),
    ("empty jsonl", "d.jsonl", "", None, "no rows"),
    ("invalid UTF-8, before a bad row", "d.tsv", b"text\tlabel\nok\t1\nbad \xff\t0\n\t\n", 3, "invalid UTF-8"),
    ("invalid UTF-8 in csv", "d.csv", b"text,label\nok,1\n\xc3\x28,0\n,\n", 3, "invalid UTF-8"),
    ("csv quote never closed", "d.csv", 'text,label\na,1\n"never closed,2\nb,3\n', 3, "csv module"),
    ("not valid JSON", "d.jsonl", '{"text": "a", "label": 1}\n{"text": "b",\n[]\n', 2, "not valid JSON"),
    ("JSON that is not an object", "d.jsonl", '["a", 1]\n{"text": 1}\n', 1, "a list where a JSON object"),
]


@pytest.mark.parametrize("name,file,content,line,words", BAD_FILES, ids=[row[0] for row in BAD_FILES])
def test_bad_file(tmp_path, name, file, content, line, words):
    path = _write(tmp_path / file, content)
    where = f"{path}:{line}: " if line else f"{path}: "
    message = _one_line_error(lambda: _labels(path), where, words)
    assert message.startswith(where), message


def test_first_problem_wins_over_a_later_undecodable_line(tmp_path):
    """A reader stops at its first problem: bytes that are not UTF-8 further down are never reached."""
    path = _write(tmp_path / "d.tsv", b"text\tlabel\nok\t1\n\t0\nbad \xff\t0\n")
    _one_line_error(lambda: _labels(path), f"{path}:3: empty text (column text)", absent=("UTF-8",))
