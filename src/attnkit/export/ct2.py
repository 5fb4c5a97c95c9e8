"""attnkit -> CTranslate2, through the Marian export (see :mod:`attnkit.export.huggingface`).

CTranslate2's own Marian loader assumes an Opus-MT model: it drops the last vocabulary entry
(Opus-MT's added ``<pad>``) and starts the decoder from a zero embedding. attnkit's model starts
from BOS's embedding and its last entry is a real word, so the loader here is BART's (the same
layers) with Marian's settings (post-LN, no embedding layer norm), the decoder starting from
``<s>``, and separate source and target vocabularies when the model has them. Everything else
(the fused QKV, the position table Marian rebuilds, the sqrt(d_model) scale) comes from
CTranslate2's converter unchanged.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.export.huggingface import empty_output, export_huggingface, load_marian


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise AttnkitError("exporting to CTranslate2 needs the ctranslate2 package (pip install ctranslate2)") \
            from None
    return ctranslate2


def _converter(marian_dir: Path):
    ctranslate2 = _ctranslate2()
    from ctranslate2.converters.transformers import BartLoader

    class AttnkitMarianLoader(BartLoader):
        @property
        def architecture_name(self):
            return "MarianMTModel"

        def get_model_spec(self, model):
            model.config.normalize_before = False  # post-LN
            model.config.normalize_embedding = False  # Marian has no layer norm on the embeddings
            return super().get_model_spec(model)

        def get_vocabulary(self, model, tokenizer):
            """(source pieces, target pieces) in id order: two vocabularies when the model has them."""
            def by_id(vocab: dict) -> list[str]:
                return sorted(vocab, key=vocab.get)

            source = by_id(tokenizer.encoder)
            return source, by_id(tokenizer.target_encoder) if tokenizer.separate_vocabs else source

        def set_vocabulary(self, spec, tokens):
            spec.register_source_vocabulary(tokens[0])
            spec.register_target_vocabulary(tokens[1])

        def set_config(self, config, model, tokenizer):
            config.bos_token = "<s>"
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

    class Converter(ctranslate2.converters.Converter):
        def _load(self):
            from transformers import MarianTokenizer

            with warnings.catch_warnings():  # "Recommended: pip install sacremoses": only the vocabulary is read here
                warnings.simplefilter("ignore", UserWarning)
                tokenizer = MarianTokenizer.from_pretrained(marian_dir)
            return AttnkitMarianLoader()(load_marian(marian_dir), tokenizer)

    return Converter()


def export_ctranslate2(checkpoint: str | Path, out: str | Path, quantization: str | None = None,
                       vmap: str | Path | None = None) -> Path:
    """Write a CTranslate2 model directory (model.bin, shared_vocabulary.json or source/target vocabularies,
    config.json) plus the SentencePiece models, source.spm and target.spm, to tokenize with; with ``vmap`` (a
    vocabulary map, :mod:`attnkit.data.shortlist`) its copy, which ``translate_batch(..., use_vmap=True)`` reads."""
    out = empty_output(out)
    with tempfile.TemporaryDirectory() as tmp:
        marian = export_huggingface(checkpoint, Path(tmp) / "marian")
        _converter(marian).convert(str(out), vmap=None if vmap is None else str(vmap), quantization=quantization,
                                   force=True)
        for name in ("source.spm", "target.spm"):
            shutil.copyfile(marian / name, out / name)
    return out


def translator(directory: str | Path, compute_type: str = "float32", threads: int = 1):
    return _ctranslate2().Translator(str(directory), device="cpu", compute_type=compute_type, intra_threads=threads,
                                     inter_threads=1)


def ct2_generate(translator, toks, src_ids: list[list[int]], max_lens: list[int], beam_size: int = 1,
                 len_penalty: float = 1.0, batch_size: int = 64, use_vmap: bool = False) -> list[list[int]]:
    """Decode id sequences (each ending in EOS) with CTranslate2; returns output ids without EOS.

    A batch runs to its longest limit and each output is cut to its own (at most max_lens[i] tokens counting
    EOS): for greedy decoding that is exactly attnkit's limit, since a greedy prefix never depends on the
    length allowed. CTranslate2 works on pieces: the ids go through them. ``use_vmap``: each batch scores only the
    candidates of the model's vocabulary map (exported with ``vmap``)."""
    pieces = [toks.src.id_to_piece(s) for s in src_ids]
    out = []
    for i in range(0, len(pieces), batch_size):
        limits = max_lens[i:i + batch_size]
        results = translator.translate_batch(pieces[i:i + batch_size], beam_size=beam_size,
                                             length_penalty=len_penalty, max_decoding_length=max(limits),
                                             max_batch_size=batch_size, use_vmap=use_vmap)
        for r, limit in zip(results, limits):
            out.append([toks.tgt.sp.piece_to_id(p) for p in r.hypotheses[0]][:limit - 1])
    return out


def log_prob_gap(model, translator, toks, src_ids: list[list[int]], tgt_ids: list[list[int]]) -> float:
    """max |log p_attnkit - log p_CTranslate2| of each target token (and the final EOS), teacher-forced."""
    import torch

    from attnkit.data import collate
    from attnkit.models import PAD

    scores = translator.score_batch([toks.src.id_to_piece(s) for s in src_ids],
                                    [toks.tgt.id_to_piece(t) for t in tgt_ids])
    b = collate([s[:-1] for s in src_ids], tgt_ids, list(range(len(src_ids))))
    with torch.no_grad():
        ours = model(b.src, b.tgt_in).logits.log_softmax(-1).gather(-1, b.tgt_out[..., None])[..., 0]
    gap = 0.0
    for i, s in enumerate(scores):
        n = int(b.tgt_out[i].ne(PAD).sum())
        gap = max(gap, float((ours[i, :n] - torch.tensor(s.log_probs[:n])).abs().max()))
    return gap
