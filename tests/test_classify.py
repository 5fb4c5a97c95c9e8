"""Using a fine-tuned classifier: `attnkit classify` on plain lines, tab-separated pairs and GLUE files (each
output line in input order, equal to the core model's attnkit.decode.classify), streaming through a pipe; `attnkit
evaluate --data` against scikit-learn's and SciPy's scores; ``attnkit.load(run).classify``; the fast copy that
classifies against the core; and the one-line errors."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

import attnkit
from attnkit.checkpoint import load_checkpoint
from attnkit.cli import main
from attnkit.data import read_glue
from attnkit.decode import classify
from attnkit.errors import AttnkitError

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# the fast copy against the core, both fp32: the fused attention sums in another order, so outputs agree to within
# a few ulps of the logits' size; tests/test_fast.py bounds logits, probabilities and scores by the same 1e-5
FP32_TOLERANCE = 1e-5


def expected(run, texts, pairs=None):
    """What the CLI must print: the core's classifications, of the plain module the checkpoint loads into (the
    commands classify with ``attnkit.load``'s fast copy, which :func:`test_the_fast_copy_classifies_as_the_core`
    holds to the core)."""
    model = attnkit.load(run)
    return classify(model.module, model.tokenizers, texts, pairs)


def assert_same_classifications(got, want) -> None:
    """Classifications of the fast copy against the core's: the same labels, probabilities and scores to fp32's
    tolerance."""
    assert [c.label for c in got] == [c.label for c in want]
    for a, b in zip(got, want, strict=True):
        if b.probabilities is None:
            assert a.probabilities is None and math.isclose(a.score, b.score, rel_tol=FP32_TOLERANCE,
                                                            abs_tol=FP32_TOLERANCE), (a, b)
            continue
        assert a.score is None and list(a.probabilities) == list(b.probabilities), (a, b)
        assert all(math.isclose(a.probabilities[k], p, abs_tol=FP32_TOLERANCE) for k, p in b.probabilities.items()), \
            (a, b)


def check_lines(lines: list[str], results) -> None:
    """Output lines against Classifications: the label and each probability (4 decimals), or the score."""
    assert len(lines) == len(results)
    for line, c in zip(lines, results):
        if c.probabilities is None:
            assert float(line) == pytest.approx(c.score, abs=5e-5), (line, c)
            continue
        label, probabilities = line.split("\t")
        assert label == c.label
        values = json.loads(probabilities)
        assert list(values) == list(c.probabilities)
        assert all(values[k] == pytest.approx(p, abs=5e-5) for k, p in c.probabilities.items()), (line, c)


def run_cli(capsys, *argv) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


@pytest.fixture(scope="module")
def sst2_dev(data_dir):
    return read_glue("sst2", "dev", data_dir)


@pytest.fixture(scope="module")
def stsb_dev(data_dir):
    return read_glue("stsb", "dev", data_dir)


# --- batching


def test_batches_sort_by_length_hold_at_most_batch_size_inputs_and_change_no_answer(classifier_run, sst2_dev):
    model, _, tokenizer, _ = load_checkpoint(classifier_run)
    texts = list(sst2_dev.texts[:40])
    seen = []
    handle = model.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    try:
        one_by_one = [classify(model, tokenizer, [t])[0] for t in texts]
        seen.clear()
        batched = classify(model, tokenizer, texts, batch_tokens=10**9, batch_size=8)
    finally:
        handle.remove()
    assert [s[0] for s in seen] == [8] * 5
    widths = [s[1] for s in seen]
    assert widths == sorted(widths)  # shortest first: each batch pads only to inputs of about its own length
    assert [c.label for c in batched] == [c.label for c in one_by_one]
    for a, b in zip(batched, one_by_one):
        assert all(a.probabilities[k] == pytest.approx(b.probabilities[k], abs=1e-5) for k in a.probabilities)


def test_a_loaded_classifier_classifies_with_the_fast_runtime_and_explains_with_the_core(classifier_run, sst2_dev):
    import torch

    from attnkit.nn.attention import reference_attention

    model = attnkit.load(classifier_run)
    assert model.classifier is not model.module
    assert all(m.kernel is reference_attention for m in model.module.modules() if hasattr(m, "kernel"))
    core = classify(model.module, model.tokenizers, list(sst2_dev.texts[:64]))
    fast = model.classify(list(sst2_dev.texts[:64]))
    assert [c.label for c in fast] == [c.label for c in core]
    for a, b in zip(fast, core):
        assert all(a.probabilities[k] == pytest.approx(b.probabilities[k], abs=1e-5) for k in a.probabilities)
    assert all(p.dtype == torch.float32 for p in model.classifier.parameters())


def _counted(monkeypatch, module, name: str) -> list:
    """Count the calls of ``module.name`` (a kernel the fast runtime looks up when it runs)."""
    calls, original = [], getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("run, problem", [("classifier_run", "classification"), ("regressor_run", "regression")])
def test_the_fast_copy_classifies_as_the_core(run, problem, sst2_dev, stsb_dev, request, monkeypatch):
    """``attnkit.load``'s fast copy (fused attention, fp32), which the commands classify with, against the plain
    module the checkpoint loads into, over inputs of many lengths, padded: the encoder's states of real tokens (which
    the head's near-constant outputs would hide a difference in), the logits, and so the labels, probabilities and
    scores, to fp32's tolerance. Both fused kernels run: the short-keys one, and SDPA past SHORT_KEYS tokens."""
    from attnkit.data.wordpiece import collate_sentences
    from attnkit.decode.classify import classify_logits
    from attnkit.fast import attention as fast_attention

    kernels = [_counted(monkeypatch, fast_attention, name) for name in ("short_attention", "_sdpa")]
    model = attnkit.load(request.getfixturevalue(run))
    assert model.classifier is not model.module and model.module.problem == problem
    dev = stsb_dev if model.takes_pairs else sst2_dev
    texts = [" ".join(dev.texts[:4]), *dev.texts[4:48]]  # the first input longer than SHORT_KEYS tokens
    pairs = None if dev.pairs is None else [" ".join(dev.pairs[:4]), *dev.pairs[4:48]]
    examples = [model.tokenizers.example(t, None if pairs is None else pairs[i]) for i, t in enumerate(texts)]
    lengths = [len(ids) for ids, _ in examples]
    assert lengths[0] > fast_attention.SHORT_KEYS and len(set(lengths)) > 8
    batch = collate_sentences(examples, model.tokenizers.pad_id)
    with torch.no_grad():
        fast, core = (m.encoder(batch.tokens, batch.padding_mask, batch.token_types).states
                      for m in (model.classifier, model.module))
    real = ~batch.padding_mask
    torch.testing.assert_close(fast[real], core[real], rtol=FP32_TOLERANCE, atol=FP32_TOLERANCE)
    fast = classify_logits(model.classifier, model.tokenizers, texts, pairs, batch_tokens=600)
    core = classify_logits(model.module, model.tokenizers, texts, pairs, batch_tokens=600)
    assert torch.isfinite(fast).all()
    assert float((fast - core).abs().max()) <= FP32_TOLERANCE
    assert all(kernels), [len(k) for k in kernels]
    assert_same_classifications(classify(model.classifier, model.tokenizers, texts, pairs),
                                classify(model.module, model.tokenizers, texts, pairs))


@pytest.mark.parametrize("precision, tolerance", [("bf16", 0.05), ("int8", 0.1)])
def test_classifying_at_lower_precision_stays_close_to_fp32(classifier_run, sst2_dev, precision, tolerance):
    from attnkit.fast.precision import NEEDS, cpu_flags

    if not set(NEEDS[precision]) & cpu_flags():
        pytest.skip(f"{precision} needs a CPU with {' or '.join(NEEDS[precision])}")
    texts = list(sst2_dev.texts[:200])
    full = attnkit.load(classifier_run).classify(texts)
    low = attnkit.load(classifier_run, precision=precision).classify(texts)
    agree = sum(a.label == b.label for a, b in zip(low, full)) / len(texts)
    gap = max(abs(a.probabilities[k] - b.probabilities[k]) for a, b in zip(low, full) for k in a.probabilities)
    assert agree >= 0.97 and gap <= tolerance, (agree, gap)


def test_classify_refuses_a_precision_the_cpu_lacks_in_one_line(classifier_run, capsys, monkeypatch):
    from attnkit.fast import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    code, out, err = run_cli(capsys, "classify", "--checkpoint", classifier_run, "--precision", "bf16")
    assert code == 2 and not out
    assert err.strip().count("\n") == 0 and "bf16 needs a CPU with avx512_bf16 or amx_bf16" in err


# --- attnkit classify


def test_classify_lines_in_input_order_equal_decode_classify(classifier_run, sst2_dev, tmp_path, capsys):
    texts = sst2_dev.texts[:9]
    path = tmp_path / "in.txt"
    path.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    want = expected(classifier_run, texts)
    code, lines, err = run_cli(capsys, "classify", "--checkpoint", classifier_run, "--input", path)
    assert code == 0, err
    check_lines(lines, want)
    # chunks of 2 (the last one short) and --format lines: the same lines, in the same order
    code, chunked, err = run_cli(capsys, "classify", "--checkpoint", classifier_run, "--input", path,
                                 "--batch-size", "2", "--format", "lines")
    assert code == 0, err
    assert chunked == lines
    out = tmp_path / "out.txt"
    code, printed, err = run_cli(capsys, "classify", "--checkpoint", classifier_run, "--input", path, "-o", out)
    assert code == 0 and printed == [], err
    assert out.read_text(encoding="utf-8").splitlines() == lines


def test_classify_reads_stdin(classifier_run, sst2_dev, capsys, monkeypatch):
    texts = sst2_dev.texts[:5]
    r, w = os.pipe()
    os.write(w, "".join(t + "\n" for t in texts).encode("utf-8"))
    os.close(w)
    monkeypatch.setattr("sys.stdin", os.fdopen(r, "rb"))
    code, lines, err = run_cli(capsys, "classify", "--checkpoint", classifier_run)
    assert code == 0, err
    check_lines(lines, expected(classifier_run, texts))


def test_classify_pairs_tsv_with_a_regressor(regressor_run, stsb_dev, tmp_path, capsys):
    texts, pairs = stsb_dev.texts[:7], stsb_dev.pairs[:7]
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{a}\t{b}\n" for a, b in zip(texts, pairs)), encoding="utf-8")
    code, lines, err = run_cli(capsys, "classify", "--checkpoint", regressor_run, "--input", path,
                               "--batch-size", "3")
    assert code == 0, err
    want = expected(regressor_run, texts, pairs)
    assert all(c.probabilities is None and c.label == "score" for c in want)
    check_lines(lines, want)


def test_classify_a_file_with_named_columns(regressor_run, stsb_dev, tmp_path, capsys):
    texts, pairs = stsb_dev.texts[:4], stsb_dev.pairs[:4]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"a": a, "b": b, "id": i}) + "\n" for i, (a, b) in enumerate(zip(texts, pairs))),
                    encoding="utf-8")
    code, lines, err = run_cli(capsys, "classify", "--checkpoint", regressor_run, "--input", path,
                               "--text-column", "a", "--pair-column", "b")
    assert code == 0, err
    check_lines(lines, expected(regressor_run, texts, pairs))


def test_classify_a_glue_test_file_with_its_index_column(classifier_run, data_dir, tmp_path, capsys):
    test = read_glue("sst2", "test", data_dir)
    order = [5, 0, 3, 1, 4, 2]  # an index column that is not the line order: the output follows the lines
    path = tmp_path / "test.tsv"
    path.write_text("index\tsentence\n" + "".join(f"{test.index[i]}\t{test.texts[i]}\n" for i in order),
                    encoding="utf-8")
    want = expected(classifier_run, [test.texts[i] for i in order])
    for more in ((), ("--format", "glue")):  # recognised by its header, or named
        code, lines, err = run_cli(capsys, "classify", "--checkpoint", classifier_run, "--input", path, *more)
        assert code == 0, err
        check_lines(lines, want)


def test_classify_streams_through_a_pipe(classifier_run):
    """A line written to stdin comes back classified while stdin is still open."""
    from test_cli import LineReader, end

    texts = ["a gorgeous , witty film", "a tedious , joyless mess"]
    want = expected(classifier_run, texts)
    proc = subprocess.Popen([sys.executable, "-m", "attnkit", "classify", "--checkpoint", str(classifier_run),
                             "--threads", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=ENV)
    try:
        reader = LineReader(proc.stdout)
        lines = []
        for i, text in enumerate(texts):
            proc.stdin.write((text + "\n").encode("utf-8"))
            proc.stdin.flush()
            lines.append(reader.readline(timeout=300 if i == 0 else 60))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
        check_lines(lines, want)
    finally:
        end(proc)


# --- attnkit evaluate --data


def test_evaluate_data_prints_the_classification_scores(classifier_run, sst2_dev, tmp_path, capsys):
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    n = 80
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{g}\n" for t, g in zip(sst2_dev.texts[:n],
                                                                                 sst2_dev.labels[:n])),
                    encoding="utf-8")
    code, lines, err = run_cli(capsys, "evaluate", "--checkpoint", classifier_run, "--data", path)
    assert code == 0, err
    assert len(lines) == 1
    result = json.loads(lines[0])
    predicted = [c.label for c in expected(classifier_run, sst2_dev.texts[:n])]
    gold = sst2_dev.labels[:n]
    assert result["n"] == n
    assert result["accuracy"] == pytest.approx(100 * accuracy_score(gold, predicted))
    assert result["f1"] == pytest.approx(100 * f1_score(gold, predicted, pos_label="1"))
    assert result["matthews"] == pytest.approx(100 * matthews_corrcoef(gold, predicted))
    # the same file with the columns named, as CSV with other names
    csv = tmp_path / "dev.csv"
    csv.write_text("review,stars\n" + "".join(f'"{t.replace(chr(34), 2 * chr(34))}",{g}\n'
                                             for t, g in zip(sst2_dev.texts[:n], gold)), encoding="utf-8")
    code, lines, err = run_cli(capsys, "evaluate", "--checkpoint", classifier_run, "--data", csv,
                               "--text-column", "review", "--label-column", "stars")
    assert code == 0, err
    assert {k: v for k, v in json.loads(lines[0]).items() if k != "data"} == \
        {k: v for k, v in result.items() if k != "data"}


def test_evaluate_data_on_the_validation_file_gives_the_scores_its_validation_recorded(classifier_run, tmp_path,
                                                                                         capsys):
    """`attnkit evaluate --data` and the trainer's validation score predictions with the task's one scoring, so the
    best checkpoint evaluated on its run's validation file prints the figures recorded with it."""
    from attnkit.config import load_config
    from attnkit.data.labelled import read_labelled

    cfg = load_config(classifier_run / "config.toml")
    dev = read_labelled(cfg.data.valid_file, cfg.data.text_column, None, cfg.data.label_column)
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{g}\n" for t, g in zip(dev.texts, dev.labels)),
                    encoding="utf-8")
    recorded = json.loads((classifier_run / "checkpoints" / "best" / "meta.json").read_text(encoding="utf-8"))
    code, lines, err = run_cli(capsys, "evaluate", "--checkpoint", classifier_run, "--data", path)
    assert code == 0, err
    result = json.loads(lines[0])
    assert result["n"] == len(dev.texts)
    assert {k: result[k] for k in ("accuracy", "f1", "matthews")} == \
        {k: recorded["scores"][f"valid_{k}"] for k in ("accuracy", "f1", "matthews")}


def test_evaluate_data_prints_the_regression_scores(regressor_run, data_dir, tmp_path, capsys):
    """On the STS benchmark's own layout (no header, the score 5th), as GLUE's STS-B dev comes."""
    from scipy.stats import pearsonr, spearmanr

    rows = (data_dir / "glue" / "STS-B" / "sts-dev.tsv").read_text(encoding="utf-8").splitlines()[:40]
    path = tmp_path / "sts-dev.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    fields = [row.split("\t") for row in rows]
    gold = [float(f[4]) for f in fields]
    code, lines, err = run_cli(capsys, "evaluate", "--checkpoint", regressor_run, "--data", path,
                               "--output", tmp_path / "predictions.txt")
    assert code == 0, err
    result = json.loads(lines[0])
    predicted = [c.score for c in expected(regressor_run, [f[5] for f in fields], [f[6] for f in fields])]
    assert result["n"] == 40
    assert result["pearson"] == pytest.approx(100 * pearsonr(predicted, gold).statistic, abs=1e-4)
    assert result["spearman"] == pytest.approx(100 * spearmanr(predicted, gold).statistic, abs=1e-4)
    assert len((tmp_path / "predictions.txt").read_text().splitlines()) == 40


# --- Python


def test_load_and_classify_from_python(classifier_run, regressor_run, sst2_dev, stsb_dev, trained_checkpoint):
    model = attnkit.load(classifier_run)
    assert model.family == "bert_classifier" and model.capabilities == {"classify", "attention"}
    assert "bert_classifier" in repr(model) and model.decoder is None and not model.takes_pairs
    texts = sst2_dev.texts[:6]
    assert_same_classifications(model.classify(texts), expected(classifier_run, texts))
    assert_same_classifications([model.classify(texts[0])], expected(classifier_run, texts[:1]))
    attention = model.attention(texts[0])
    assert attention.source[0] == "[CLS]" and attention.text == model.classify(texts[0]).label
    assert attention.encoder[0].shape[-1] == len(attention.source)
    with pytest.raises(AttnkitError, match=f"^{re.escape(str(model.path))}: a bert_classifier model cannot translate"):
        model.translate("a film")
    with pytest.raises(AttnkitError, match="pair given to a model of single sentences"):
        model.classify(texts[:1], ["a second sentence"])

    regressor = attnkit.load(regressor_run)
    assert regressor.takes_pairs
    got = regressor.classify(stsb_dev.texts[:3], stsb_dev.pairs[:3])
    assert_same_classifications(got, expected(regressor_run, stsb_dev.texts[:3], stsb_dev.pairs[:3]))
    with pytest.raises(AttnkitError, match="single sentence given to a model of sentence pairs"):
        regressor.classify(stsb_dev.texts[:3])

    translator = attnkit.load(trained_checkpoint)
    with pytest.raises(AttnkitError, match=f"^{re.escape(str(translator.path))}: a transformer model cannot classify"):
        translator.classify(["1 May 2000"])


# --- one-line errors


def one_line_error(capsys, *argv) -> str:
    code, _, err = run_cli(capsys, *argv)
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: ") and "Traceback" not in err, err
    return lines[0]


def test_a_missing_checkpoint_is_one_line(tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("a film\n", encoding="utf-8")
    assert "nowhere" in one_line_error(capsys, "classify", "--checkpoint", tmp_path / "nowhere", "--input", path)


def test_a_pair_for_a_single_sentence_model_is_one_line(classifier_run, tmp_path, capsys):
    path = tmp_path / "pairs.tsv"
    path.write_text("a film\tanother film\nfine\tgood\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    line = one_line_error(capsys, "classify", "--checkpoint", classifier_run, "--input", path, "-o", out)
    assert f"{path}:1" in line and "single sentences" in line
    assert not out.exists()  # refused before the output was opened


def test_an_unknown_label_in_the_data_file_is_one_line(classifier_run, tmp_path, capsys):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\na fine film\t1\na dull film\tnegative\n", encoding="utf-8")
    line = one_line_error(capsys, "evaluate", "--checkpoint", classifier_run, "--data", path)
    assert f"{path}:3" in line and "'negative'" in line and "(column label)" in line
