"""attnkit's BERT classifier or regressor (``model.family = "bert_classifier"``) -> Hugging Face or ONNX.

- ``huggingface``: a ``BertForSequenceClassification`` directory (config.json with the labels as id2label and
  label2id and the problem_type, model.safetensors, vocab.txt and tokenizer_config.json, so ``AutoTokenizer``,
  ``AutoModelForSequenceClassification`` and ``pipeline("text-classification")`` load it). ``pooling = "cls"`` is
  that architecture weight for weight; attnkit's single ``in_proj`` [3 d, d] is split back into query, key and
  value. ``pooling = "mean"`` has no equivalent there (it always reads BERT's pooler over [CLS]) and is refused.
- ``onnx``: one graph, ``model.onnx``::

      input_ids [B, T] int64, attention_mask [B, T] int64 (1 = token, 0 = padding), token_type_ids [B, T] int64
        -> logits [B, n_labels] float32

  the inputs Hugging Face's tokenizers return, batch and length dynamic; both poolings. ``onnx.json`` describes
  it (labels, problem, pad id, length limit) beside the tokenizer files and labels.json.

Each export checks itself before it returns: the written model is loaded back (transformers, onnxruntime) and
run on padded batches of single sentences and of sentence pairs (for ONNX of other sizes than the one traced).
The largest |logit difference| to attnkit is returned; past :data:`TOLERANCE` the export is removed and refused,
as is a Hugging Face tokenizer whose ids differ from attnkit's WordPiece.
"""

from __future__ import annotations

import copy
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from attnkit.checkpoint import write_labels
from attnkit.data.wordpiece import SentenceBatch, WordPiece
from attnkit.errors import AttnkitError
from attnkit.models.classifier import SequenceClassifier

TOLERANCE = 1e-4  # the largest |logit difference| an export may show on the probe batches
OPSET = 18
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

# probes of different lengths, so every batch pads some rows
PROBE_SENTENCES = ("a gorgeous, witty, seductive movie.",
                   "the plot is nothing but boilerplate clichés from start to finish, and the script assumes "
                   "that not only would subtlety be lost on the target audience, but that it's also too stupid "
                   "to realize that they've already seen this exact same movie a hundred times",
                   "dull",
                   "it's a charming and often affecting journey.")
PROBE_PAIRS = (("A man is playing a guitar.", "A man plays the guitar on stage in front of a small crowd."),
               ("The cat sat on the mat.", "A dog barked."),
               ("Stocks fell sharply on Monday after the report.", "Markets dropped."))


def probe_inputs(tokenizer: WordPiece, pairs: bool = True) -> list[tuple[list[str], list[str] | None]]:
    """(first sentences, second sentences or None) of each probe batch: single sentences, and pairs unless
    ``pairs`` is False (a BERT with one token type)."""
    out = [(list(PROBE_SENTENCES), None)]
    if pairs:
        out.append(([a for a, _ in PROBE_PAIRS], [b for _, b in PROBE_PAIRS]))
    return out


def _has_pairs(model: SequenceClassifier) -> bool:
    return model.encoder.token_types.num_embeddings > 1


@torch.no_grad()
def attnkit_logits(model: SequenceClassifier, batch: SentenceBatch) -> Tensor:
    """attnkit's logits [B, n_labels] of a batch, in eval mode, float32 on the CPU."""
    return model(batch.tokens, batch.padding_mask, batch.token_types).logits.float().cpu()


# --- Hugging Face


def _transformers():
    from attnkit.export.huggingface import _transformers

    return _transformers()


def check_huggingface_exportable(model: SequenceClassifier) -> None:
    """One-line refusal for what ``BertForSequenceClassification`` cannot express."""
    if model.pooling != "cls":
        raise AttnkitError(f"model.pooling = {model.pooling!r}: Hugging Face's BertForSequenceClassification reads "
                           "BERT's pooler over [CLS] and has no mean pooling, so this model cannot export to it "
                           "exactly (export --to onnx keeps it)")
    activation = model.encoder.cfg.activation
    if activation not in ("gelu", "relu"):
        raise AttnkitError(f"model.activation = {activation!r} has no BertForSequenceClassification equivalent")


def hf_state(model: SequenceClassifier) -> dict[str, Tensor]:
    """The model's weights under ``BertForSequenceClassification``'s names: the inverse of
    :func:`attnkit.models.bert.convert_hf_state`, plus the pooler (``bert.pooler.dense``) and the head
    (``classifier``)."""
    enc = {k: v.detach() for k, v in model.encoder.state_dict().items()}
    d = model.encoder.cfg.d_model
    out = {
        "bert.embeddings.word_embeddings.weight": enc["tokens.weight"],
        "bert.embeddings.position_embeddings.weight": enc["positions.embedding.weight"],
        "bert.embeddings.token_type_embeddings.weight": enc["token_types.weight"],
        "bert.embeddings.LayerNorm.weight": enc["embed_norm.weight"],
        "bert.embeddings.LayerNorm.bias": enc["embed_norm.bias"],
    }
    for i in range(len(model.encoder.layers)):
        hf, ours = f"bert.encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            for name, part in zip(("query", "key", "value"), enc[ours + f"self_attn.in_proj.{kind}"].split(d)):
                out[hf + f"attention.self.{name}.{kind}"] = part
            out[hf + f"attention.output.dense.{kind}"] = enc[ours + f"self_attn.out_proj.{kind}"]
            out[hf + f"attention.output.LayerNorm.{kind}"] = enc[ours + f"attn_res.norm.{kind}"]
            out[hf + f"intermediate.dense.{kind}"] = enc[ours + f"ffn.linear1.{kind}"]
            out[hf + f"output.dense.{kind}"] = enc[ours + f"ffn.linear2.{kind}"]
            out[hf + f"output.LayerNorm.{kind}"] = enc[ours + f"ffn_res.norm.{kind}"]
    if model.pooler is not None:
        out["bert.pooler.dense.weight"] = model.pooler.weight.detach()
        out["bert.pooler.dense.bias"] = model.pooler.bias.detach()
    out["classifier.weight"] = model.classifier.weight.detach()
    out["classifier.bias"] = model.classifier.bias.detach()
    return {k: v.clone().contiguous() for k, v in out.items()}


def hf_config(model: SequenceClassifier):
    """The ``BertConfig`` of the model: its encoder's sizes, its labels (id2label, label2id), its problem_type."""
    c, encoder = model.encoder.cfg, model.encoder
    labels = list(model.labels)
    return _transformers().BertConfig(
        vocab_size=encoder.tokens.num_embeddings, hidden_size=c.d_model, num_hidden_layers=len(encoder.layers),
        num_attention_heads=c.n_heads, intermediate_size=c.d_ff, hidden_act=c.activation,
        hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.attention_dropout,
        max_position_embeddings=encoder.positions.embedding.num_embeddings,
        type_vocab_size=encoder.token_types.num_embeddings, layer_norm_eps=c.layer_norm_eps,
        pad_token_id=encoder.tokens.padding_idx if encoder.tokens.padding_idx is not None else 0,
        classifier_dropout=model.dropout.p, num_labels=model.n_labels,
        id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)},
        problem_type="regression" if model.problem == "regression" else "single_label_classification")


def write_tokenizer(tokenizer: WordPiece, out: Path) -> None:
    """vocab.txt and a tokenizer_config.json naming ``BertTokenizer`` with attnkit's casing and length limit."""
    shutil.copyfile(tokenizer.path, out / "vocab.txt")
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lowercase,
              "model_max_length": tokenizer.max_len, "unk_token": "[UNK]", "sep_token": "[SEP]",
              "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenize_chinese_chars": True,
              "strip_accents": None}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")


def write_huggingface(model: SequenceClassifier, tokenizer: WordPiece, out: str | Path) -> Path:
    """Write ``model`` as a ``BertForSequenceClassification`` directory (safetensors) with its tokenizer files."""
    check_huggingface_exportable(model)
    hf = _transformers().BertForSequenceClassification(hf_config(model)).eval()
    missing, unexpected = hf.load_state_dict(hf_state(model), strict=False)
    if missing or unexpected:
        raise AttnkitError(f"BertForSequenceClassification's weights do not map onto attnkit's (missing "
                           f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out, safe_serialization=True)
    write_tokenizer(tokenizer, out)
    return out


def load_huggingface(directory: str | Path):
    """-> (``AutoModelForSequenceClassification`` in eval mode, ``AutoTokenizer``) of a directory."""
    transformers = _transformers()
    directory = Path(directory)
    return (transformers.AutoModelForSequenceClassification.from_pretrained(directory).eval(),
            transformers.AutoTokenizer.from_pretrained(directory))


@torch.no_grad()
def huggingface_gap(model: SequenceClassifier, tokenizer: WordPiece, hf, hf_tokenizer) -> float:
    """max |logit difference| between attnkit and the Hugging Face model on the probe batches, each side
    tokenizing with its own tokenizer (refused where the ids differ)."""
    gap = 0.0
    for first, second in probe_inputs(tokenizer, _has_pairs(model)):
        ours = tokenizer.sentences(first, second)
        theirs = hf_tokenizer(first, second, padding=True, truncation="longest_first",
                              max_length=tokenizer.max_len, return_tensors="pt")
        if not torch.equal(theirs["input_ids"], ours.tokens) \
                or not torch.equal(theirs["token_type_ids"], ours.token_types):
            raise AttnkitError("the exported tokenizer's ids differ from attnkit's WordPiece on the probe sentences")
        logits = hf(input_ids=theirs["input_ids"], attention_mask=theirs["attention_mask"],
                    token_type_ids=theirs["token_type_ids"]).logits.float()
        gap = max(gap, float((attnkit_logits(model, ours) - logits).abs().max()))
    return gap


# --- ONNX


class ClassifierGraph(nn.Module):
    """The classifier with Hugging Face's input names and conventions (``attention_mask`` 1 = token)."""

    def __init__(self, model: SequenceClassifier):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        """input_ids, attention_mask, token_type_ids [B, T] int64 -> logits [B, n_labels]."""
        return self.model(input_ids, attention_mask.eq(0), token_type_ids).logits


def onnx_feed(batch: SentenceBatch) -> dict[str, np.ndarray]:
    """A :class:`SentenceBatch` as the graph's inputs."""
    return {"input_ids": batch.tokens.numpy(), "attention_mask": (~batch.padding_mask).long().numpy(),
            "token_type_ids": batch.token_types.numpy()}


def write_onnx(model: SequenceClassifier, tokenizer: WordPiece, out: str | Path) -> Path:
    """Write model.onnx (weights inside), onnx.json, labels.json and the tokenizer files."""
    from attnkit import fast

    try:
        import onnx  # noqa: F401  (torch.onnx.export writes with it)
    except ImportError:
        raise AttnkitError("exporting to ONNX needs the onnx package (pip install onnx onnxruntime)") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # the core's kernels (a model may carry the fast runtime's), in eval mode, the caller's model untouched
    graph = ClassifierGraph(fast.reference(copy.deepcopy(model)).eval())
    # traced on two short sentences, one padded: verify_onnx then runs other batch sizes and lengths
    example = tokenizer.sentences(["a gorgeous film", "dull"])
    args = tuple(torch.from_numpy(a) for a in onnx_feed(example).values())
    axes = {name: {0: "batch", 1: "length"} for name in ONNX_INPUTS}
    axes["logits"] = {0: "batch"}
    # TorchScript tracing (dynamo=False), as attnkit's other ONNX export: the sequence length stays symbolic
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(graph, args, str(out / "model.onnx"), input_names=list(ONNX_INPUTS),
                          output_names=["logits"], dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    encoder = model.encoder
    (out / "onnx.json").write_text(json.dumps({
        "model": "model.onnx", "opset": OPSET, "inputs": list(ONNX_INPUTS), "outputs": ["logits"],
        "problem": model.problem, "labels": list(model.labels), "pooling": model.pooling,
        "pad_id": tokenizer.pad_id, "max_len": tokenizer.max_len,
        "max_positions": encoder.positions.embedding.num_embeddings}, indent=1) + "\n", encoding="utf-8")
    write_labels(out, model.problem, list(model.labels))
    write_tokenizer(tokenizer, out)
    return out


class OnnxClassifier:
    """An exported classifier in onnxruntime: ``logits(batch)`` for attnkit's batches, ``run(feed)`` for arrays.

    ``labels``, ``problem`` and ``tokenizer`` come from the directory's onnx.json and vocab.txt."""

    def __init__(self, directory: str | Path, threads: int = 1):
        from attnkit.export.onnx_export import onnx_session

        directory = Path(directory)
        try:
            self.info = json.loads((directory / "onnx.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AttnkitError(f"{directory}/onnx.json: missing (not an exported classifier)") from None
        self.labels, self.problem = tuple(self.info["labels"]), self.info["problem"]
        self.tokenizer = WordPiece.from_pretrained(directory, max_len=self.info["max_len"])
        self.session = onnx_session(directory / self.info["model"], threads)

    def run(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's inputs (see the module docstring) -> logits [B, n_labels]."""
        return self.session.run(None, feed)[0]

    def logits(self, batch: SentenceBatch) -> Tensor:
        return torch.from_numpy(self.run(onnx_feed(batch)))


def onnx_gap(model: SequenceClassifier, tokenizer: WordPiece, onnx_model: OnnxClassifier) -> float:
    """max |logit difference| between attnkit and onnxruntime on the probe batches (other batch sizes and
    lengths than the traced one)."""
    return max(float((attnkit_logits(model, b) - onnx_model.logits(b)).abs().max())
               for b in (tokenizer.sentences(first, second)
                         for first, second in probe_inputs(tokenizer, _has_pairs(model))))


# --- the export


def _remove(out: Path, existed: bool) -> None:
    """Remove what an export wrote into ``out`` (and ``out`` itself where the export made it)."""
    for child in out.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    if not existed:
        out.rmdir()


def export_classifier(model: SequenceClassifier, tokenizer: WordPiece, to: str, out: str | Path,
                      threads: int = 1) -> tuple[Path, float]:
    """Write ``model`` ``--to`` huggingface or onnx into ``out`` (new or empty) and check it: -> (the directory,
    max |logit difference| to attnkit on the probe batches), refused past :data:`TOLERANCE`."""
    from attnkit.export.huggingface import empty_output

    if to == "ctranslate2":
        raise AttnkitError("--to ctranslate2 converts encoder-decoders; a bert_classifier exports --to "
                           "huggingface or --to onnx")
    if to not in ("huggingface", "onnx"):
        raise AttnkitError(f"--to {to}: a bert_classifier exports to huggingface or onnx")
    if to == "huggingface":
        check_huggingface_exportable(model)  # before anything is written
    out = empty_output(out)
    existed = out.exists()
    model = model.eval()
    try:
        if to == "huggingface":
            write_huggingface(model, tokenizer, out)
            hf, hf_tokenizer = load_huggingface(out)
            gap = huggingface_gap(model, tokenizer, hf, hf_tokenizer)
        else:
            write_onnx(model, tokenizer, out)
            gap = onnx_gap(model, tokenizer, OnnxClassifier(out, threads))
        if not gap <= TOLERANCE:  # NaN too
            raise AttnkitError(f"--to {to}: the exported model's logits differ from attnkit's by up to {gap:.2e} "
                               f"(over {TOLERANCE:.0e}) on the probe batches")
    except BaseException as e:
        if out.exists():
            _remove(out, existed)
        if isinstance(e, AttnkitError):
            raise AttnkitError(f"{e}; removed what it wrote to {out}") from None
        raise
    return out, gap
