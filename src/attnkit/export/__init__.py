"""Export a trained Transformer or BERT classifier to other engines, and import Hugging Face Marian models.

A Transformer:

- ``huggingface``: a ``MarianMTModel`` directory (the same architecture; see :mod:`.huggingface`),
- ``ctranslate2``: converted from that directory with CTranslate2's converter (:mod:`.ct2`),
- ``onnx``: the encoder and one decoder step, the key/value cache explicit (:mod:`.onnx_export`).

A BERT classifier or regressor (``bert_classifier``; :mod:`.classifier`):

- ``huggingface``: a ``BertForSequenceClassification`` directory (``pooling = "cls"`` only),
- ``onnx``: one graph from the tokenizer's arrays to the logits.

Each export checks itself: :func:`export` returns the largest log-probability difference to attnkit
on a small teacher-forced batch (ONNX: over a few decoding steps); for a classifier the largest logit
difference on padded batches of sentences and pairs, and past 1e-4 the export is refused.
"""

from __future__ import annotations

from pathlib import Path

import torch

from attnkit import registry
from attnkit.errors import AttnkitError
from attnkit.export.huggingface import empty_output, export_huggingface, import_marian, marian_order

FORMATS = ("huggingface", "ctranslate2", "onnx")


def _probe_batch(model, n: int = 4, src_len: int = 9, tgt_len: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    """A random teacher-forced batch (ids of real words, the second half of the rows padded)."""
    from attnkit.data import collate

    g = torch.Generator().manual_seed(0)

    def ids(length, embedding):
        return torch.randint(4, embedding.tokens.num_embeddings, (length,), generator=g).tolist()

    src = [ids(src_len if i < n // 2 else src_len - 3, model.src_embed) for i in range(n)]
    tgt = [ids(tgt_len if i < n // 2 else tgt_len - 2, model.tgt_embed) for i in range(n)]
    b = collate(src, tgt, list(range(n)))
    return b.src, b.tgt_in


def export(checkpoint: str | Path, to: str, out: str | Path, vmap: str | Path | None = None) -> tuple[Path, float]:
    """-> (the output directory, max |log p difference| to attnkit on a probe batch; a classifier's: max |logit
    difference|). ``vmap``: a vocabulary map (``attnkit shortlist``) that a CTranslate2 export carries, for
    ``use_vmap``."""
    from attnkit.checkpoint import load_checkpoint

    if to not in FORMATS:
        raise AttnkitError(f"--to {to}: expected one of {', '.join(FORMATS)}")
    if vmap is not None and to != "ctranslate2":
        raise AttnkitError(f"--vmap: only a CTranslate2 export carries a vocabulary map, not --to {to}")
    empty_output(out)  # before the minutes of work, not after
    model, cfg, toks, _ = load_checkpoint(checkpoint)
    if vmap is not None:  # read as attnkit reads it: a line CTranslate2 would misread is named here
        from attnkit.data.shortlist import VocabularyMap

        if not hasattr(toks, "tgt"):
            raise AttnkitError(f"--vmap: a {cfg.model.family} model has no target vocabulary to map")
        VocabularyMap.read(vmap, toks.src, toks.tgt)
    exports = registry.family(cfg.model.family).exports
    if to not in exports:
        raise AttnkitError(f"{checkpoint}: a model.family = {cfg.model.family!r} model exports "
                           f"{'to ' + ' or '.join(exports) if exports else 'to nothing'}, not to {to}")
    if not registry.family(cfg.model.family).decodes:  # a classifier or regressor
        from attnkit.export.classifier import export_classifier

        return export_classifier(model, toks, to, out)
    src, tgt_in = _probe_batch(model)
    if to == "huggingface":
        from attnkit.export.huggingface import load_marian, log_prob_gap

        path = export_huggingface(checkpoint, out)
        return path, log_prob_gap(model, load_marian(path), src, tgt_in)
    if to == "ctranslate2":
        from attnkit.export import ct2

        path = ct2.export_ctranslate2(checkpoint, out, vmap=vmap)
        src_ids = [[int(i) for i in row if i] for row in src]
        tgt_ids = [[int(i) for i in row[1:] if i] for row in tgt_in]
        return path, ct2.log_prob_gap(model, ct2.translator(path), toks, src_ids, tgt_ids)
    from attnkit.export.onnx_export import OnnxTransformer, export_onnx, step_gap

    path = export_onnx(checkpoint, out)
    return path, step_gap(model, OnnxTransformer(path), src)


__all__ = ["FORMATS", "export", "export_huggingface", "import_marian", "marian_order"]
