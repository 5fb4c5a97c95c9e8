"""Export of a fine-tuned BERT classifier or regressor to Hugging Face's BertForSequenceClassification and to ONNX:
each export, loaded by its own engine, gives attnkit's logits on padded sentences and pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnkit.checkpoint import load_checkpoint, write_checkpoint
from attnkit.cli import main
from attnkit.decode import classify
from attnkit.errors import AttnkitError
from attnkit.export import export
from attnkit.export.classifier import TOLERANCE, export_classifier, hf_state, onnx_feed
from attnkit.models import SequenceClassifier
from attnkit.models.bert import convert_hf_state

transformers = pytest.importorskip("transformers")

SENTENCES = ["a gorgeous , witty , seductive movie .", "dull", "the acting is fine but the script never finds its "
             "footing , and by the end it is simply tiresome to watch", "not bad at all"]
FIRST = ["A man is playing a guitar.", "A woman is slicing an onion on a wooden board in the kitchen.", "Dogs run."]
SECOND = ["Someone plays music.", "A woman cuts an onion.", "Two dogs are running through a very large field."]


def _batches(tokenizer):
    """Padded batches: single sentences, and pairs (token types 1 over the second sentence)."""
    return [tokenizer.sentences(SENTENCES), tokenizer.sentences(FIRST, SECOND)]


def _attnkit(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(batch.tokens, batch.padding_mask, batch.token_types).logits


def _hf_logits(directory: Path, first, second=None) -> torch.Tensor:
    """Logits of the Hugging Face export as a user gets them: AutoTokenizer, AutoModelForSequenceClassification."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    inputs = tokenizer(first, second, padding=True, return_tensors="pt")
    assert inputs["attention_mask"].eq(0).any()  # the batch is padded
    with torch.no_grad():
        return hf(**inputs).logits


def _onnx_session(directory: Path):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(directory / "model.onnx"), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def mean_checkpoint(classifier_run, tmp_path_factory) -> Path:
    """classifier_run's encoder and head with mean pooling (no pooler), written as a checkpoint."""
    model, cfg, tokenizer, path = load_checkpoint(classifier_run)
    cfg.model.pooling = "mean"
    mean = SequenceClassifier(model.encoder, model.n_labels, "mean", model.dropout.p, model.problem,
                              model.labels)
    mean.classifier.load_state_dict(model.classifier.state_dict())
    files = [path / name for name in ("labels.json", "tokenizer_config.json", "vocab.txt")]
    return write_checkpoint(tmp_path_factory.mktemp("mean") / "ckpt", mean, cfg, files, {})


def test_hf_names_are_the_inverse_of_the_import(classifier_run):
    model, *_ = load_checkpoint(classifier_run)
    state = hf_state(model)
    back = convert_hf_state(state, len(model.encoder.layers))
    ours = model.encoder.state_dict()
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)
    assert torch.equal(state["bert.pooler.dense.weight"], model.pooler.weight)
    assert torch.equal(state["classifier.bias"], model.classifier.bias)


def test_huggingface_export_of_a_classifier(classifier_run, tmp_path):
    model, _, tokenizer, _ = load_checkpoint(classifier_run)
    out, gap = export(classifier_run, "huggingface", tmp_path / "hf")
    assert gap <= TOLERANCE
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= {p.name for p in
                                                                                          out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "0", "1": "1"} and config["label2id"] == {"0": 0, "1": 1}
    assert config["problem_type"] == "single_label_classification"
    for batch, (first, second) in zip(_batches(tokenizer), [(SENTENCES, None), (FIRST, SECOND)]):
        assert (_hf_logits(out, first, second) - _attnkit(model, batch)).abs().max() <= TOLERANCE
    # the pipeline names attnkit's labels
    pipe = transformers.pipeline("text-classification", model=str(out), device="cpu")
    assert [r["label"] for r in pipe(SENTENCES)] == [c.label for c in classify(model, tokenizer, SENTENCES)]


def test_huggingface_export_of_a_regressor(regressor_run, tmp_path):
    model, _, tokenizer, _ = load_checkpoint(regressor_run)
    out, gap = export(regressor_run, "huggingface", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert gap <= TOLERANCE and config["problem_type"] == "regression" and config["id2label"] == {"0": "score"}
    logits = _hf_logits(out, FIRST, SECOND)
    assert logits.shape == (3, 1)
    assert (logits - _attnkit(model, tokenizer.sentences(FIRST, SECOND))).abs().max() <= TOLERANCE


@pytest.mark.parametrize("run", ["classifier_run", "regressor_run", "mean_checkpoint"])
def test_onnx_export(run, request, tmp_path):
    checkpoint = request.getfixturevalue(run)
    model, _, tokenizer, _ = load_checkpoint(checkpoint)
    out, gap = export(checkpoint, "onnx", tmp_path / "onnx")
    assert gap <= TOLERANCE
    info = json.loads((out / "onnx.json").read_text())
    assert info["labels"] == list(model.labels) and info["pooling"] == model.pooling
    session = _onnx_session(out)
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    # batch sizes and lengths other than the traced batch's (two sentences, five pieces)
    for batch in _batches(tokenizer):
        assert batch.padding_mask.any() and batch.tokens.shape[1] > 5
        logits = session.run(None, onnx_feed(batch))[0]
        assert logits.shape == (len(batch), model.n_labels)
        assert np.abs(logits - _attnkit(model, batch).numpy()).max() <= TOLERANCE


def test_mean_pooling_has_no_huggingface_export(mean_checkpoint, tmp_path, capsys):
    out = tmp_path / "hf"
    with pytest.raises(AttnkitError, match="pooling = 'mean'"):
        export(mean_checkpoint, "huggingface", out)
    assert main(["export", "--checkpoint", str(mean_checkpoint), "--to", "huggingface", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "mean pooling" in err and "\n" not in err
    assert not out.exists()


def test_ctranslate2_and_a_failed_check_are_refused(classifier_run, tmp_path, capsys):
    assert main(["export", "--checkpoint", str(classifier_run), "--to", "ctranslate2", "-o",
                 str(tmp_path / "ct2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "huggingface" in err and "onnx" in err and "\n" not in err

    class Drifting(SequenceClassifier):
        """A model whose logits move after the export has written it: the check must catch that."""

        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            if not torch.jit.is_tracing():
                out.logits = out.logits + 1e-3
            return out

    model, _, tokenizer, _ = load_checkpoint(classifier_run)
    drifting = Drifting(model.encoder, model.n_labels, model.pooling, model.dropout.p, model.problem, model.labels)
    drifting.load_state_dict(model.state_dict())
    for to in ("huggingface", "onnx"):
        out = tmp_path / to
        with pytest.raises(AttnkitError, match="differ from attnkit's by up to 1.00e-03") as e:
            export_classifier(drifting, tokenizer, to, out)
        assert "\n" not in str(e.value) and not out.exists()
