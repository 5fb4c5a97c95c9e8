"""attnkit's Transformer <-> Hugging Face ``MarianMTModel``: the same architecture, weight for weight.

Both are the paper's post-LN encoder-decoder with sinusoidal positions and token embeddings
scaled by ``sqrt(d_model)`` and tied with the output projection. One difference is not in the
weights: attnkit's position table interleaves ``[sin, cos, sin, cos, ...]`` (the paper's
PE(pos, 2i) and PE(pos, 2i+1)), Marian's concatenates ``[sin ... | cos ...]`` and cannot be
changed (it is rebuilt, never loaded). The same columns in another order, so the whole model is
re-expressed in Marian's order of the d_model axis: every tensor that reads or writes the
residual stream (embeddings, layer norms, the inputs of Q/K/V and FFN-in, the outputs of the
attention's W^O and FFN-out) is permuted along that axis. Layer norm does not care about the
order of its features and the tied output ``h E^T`` sums over the axis, so the permuted model
computes the same function; only the order of floating-point sums changes.

What Marian cannot express is refused: pre-LN (``model.norm_first``), learned positions,
an odd d_model. Special ids stay attnkit's: PAD 0, UNK 1, decoder start = BOS 2, EOS 3.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from attnkit import registry
from attnkit.checkpoint import load_checkpoint, write_checkpoint
from attnkit.config import ExperimentConfig
from attnkit.errors import AttnkitError
from attnkit.models import BOS, EOS, PAD, UNK, Transformer
from attnkit.models.transformer import TransformerConfig


def _transformers():
    try:
        import transformers
    except ImportError:
        raise AttnkitError("exporting to or importing from Hugging Face needs the transformers package "
                           "(pip install transformers sentencepiece)") from None
    transformers.utils.logging.disable_progress_bar()  # one small model: no progress bars for loading and saving
    return transformers


def marian_order(d_model: int) -> Tensor:
    """[d_model] indices: Marian's feature j is attnkit's feature ``order[j]`` (evens = sines, then odds = cosines)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def check_exportable(cfg: TransformerConfig) -> None:
    """One-line refusal for the settings MarianMTModel has no equivalent of."""
    if "huggingface" not in registry.family(cfg.family).exports:
        raise AttnkitError(f"model.family = {cfg.family!r}: only the Transformer encoder-decoder exports to Marian")
    if cfg.norm_first:
        raise AttnkitError("model.norm_first = true: MarianMTModel is post-LN only (normalize_before is not "
                           "configurable), so a pre-LN model cannot export exactly")
    if cfg.positional != "sinusoidal":
        raise AttnkitError(f"model.positional = {cfg.positional!r}: MarianMTModel rebuilds fixed sinusoids and "
                           "never loads position weights")
    if cfg.d_model % 2:
        raise AttnkitError(f"model.d_model = {cfg.d_model}: odd widths lay out Marian's sinusoids differently")
    if cfg.activation not in ("relu", "gelu"):
        raise AttnkitError(f"model.activation = {cfg.activation!r} has no Marian equivalent")


# --- the weight map


def _tensor_pairs(model: Transformer, hf) -> list[tuple[Tensor, Tensor, bool, bool]]:
    """(attnkit tensor or view, Marian tensor, rows on the residual axis, columns on it) for every weight."""
    m = hf.model
    d = model.cfg.d_model
    pairs = [(model.src_embed.tokens.weight, m.encoder.embed_tokens.weight, False, True),
             (model.tgt_embed.tokens.weight, m.decoder.embed_tokens.weight, False, True),
             (model.output.weight, hf.lm_head.weight, False, True)]

    def attention(ours, theirs):
        for k, name in enumerate(("q_proj", "k_proj", "v_proj")):
            proj = getattr(theirs, name)
            pairs.append((ours.in_proj.weight[k * d:(k + 1) * d], proj.weight, False, True))
            pairs.append((ours.in_proj.bias[k * d:(k + 1) * d], proj.bias, False, False))
        pairs.extend([(ours.out_proj.weight, theirs.out_proj.weight, True, False),
                      (ours.out_proj.bias, theirs.out_proj.bias, True, False)])

    def norm(ours, theirs):
        pairs.extend([(ours.weight, theirs.weight, True, False), (ours.bias, theirs.bias, True, False)])

    def ffn(ours, layer):
        pairs.extend([(ours.linear1.weight, layer.fc1.weight, False, True),
                      (ours.linear1.bias, layer.fc1.bias, False, False),
                      (ours.linear2.weight, layer.fc2.weight, True, False),
                      (ours.linear2.bias, layer.fc2.bias, True, False)])

    for ours, theirs in zip(model.encoder, m.encoder.layers):
        attention(ours.self_attn, theirs.self_attn)
        norm(ours.attn_res.norm, theirs.self_attn_layer_norm)
        ffn(ours.ffn, theirs)
        norm(ours.ffn_res.norm, theirs.final_layer_norm)
    for ours, theirs in zip(model.decoder, m.decoder.layers):
        attention(ours.self_attn, theirs.self_attn)
        norm(ours.self_res.norm, theirs.self_attn_layer_norm)
        attention(ours.cross_attn, theirs.encoder_attn)
        norm(ours.cross_res.norm, theirs.encoder_attn_layer_norm)
        ffn(ours.ffn, theirs)
        norm(ours.ffn_res.norm, theirs.final_layer_norm)
    return pairs


def _reorder(t: Tensor, index: Tensor, rows: bool, cols: bool) -> Tensor:
    if rows:
        t = t.index_select(0, index)
    if cols:
        t = t.index_select(1, index)
    return t


@torch.no_grad()
def copy_to_marian(model: Transformer, hf) -> None:
    """Write attnkit's weights into a MarianMTModel of the matching config (see :func:`marian_config`)."""
    order = marian_order(model.cfg.d_model)
    for ours, theirs, rows, cols in _tensor_pairs(model, hf):
        theirs.copy_(_reorder(ours, order, rows, cols))
    hf.final_logits_bias.zero_()  # attnkit's output projection has no bias


@torch.no_grad()
def copy_from_marian(hf, model: Transformer) -> None:
    """The inverse of :func:`copy_to_marian`."""
    back = torch.argsort(marian_order(model.cfg.d_model))
    for ours, theirs, rows, cols in _tensor_pairs(model, hf):
        ours.copy_(_reorder(theirs, back, rows, cols))


# --- configs


def max_positions(cfg: ExperimentConfig) -> int:
    """attnkit extends its sinusoid table on demand past ``model.max_positions``; Marian's is fixed at its
    size, so give it room for long sentences (the sinusoids are the same at every length)."""
    return max(cfg.model.max_positions, 1024)


def marian_config(cfg: ExperimentConfig, src_vocab: int, tgt_vocab: int):
    m = cfg.model
    check_exportable(m)
    return _transformers().MarianConfig(
        vocab_size=src_vocab, decoder_vocab_size=tgt_vocab, share_encoder_decoder_embeddings=m.share_embeddings,
        tie_word_embeddings=True, d_model=m.d_model, encoder_layers=m.n_encoder_layers,
        decoder_layers=m.n_decoder_layers, encoder_attention_heads=m.n_heads, decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff, activation_function=m.activation,
        max_position_embeddings=max_positions(cfg), scale_embedding=True, dropout=m.dropout,
        attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout,
        # attnkit's ids; decoding starts from BOS (Opus-MT models start from PAD instead)
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS,
        # attnkit ends a hypothesis that reaches its length limit with EOS: so does forced_eos at max_length
        forced_eos_token_id=EOS,
    )


def generation_config(cfg: ExperimentConfig):
    return _transformers().GenerationConfig(
        decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, forced_eos_token_id=EOS,
        num_beams=cfg.decode.beam_size, length_penalty=cfg.decode.len_penalty, max_length=max_positions(cfg))


def attnkit_config(hf_config, name: str, src_lang: str = "en", tgt_lang: str = "de") -> ExperimentConfig:
    """The ExperimentConfig of a MarianMTModel, or a one-line refusal naming what attnkit cannot express."""
    c = hf_config
    checks = [
        (c.encoder_attention_heads == c.decoder_attention_heads, "encoder_attention_heads != decoder_attention_heads"),
        (c.encoder_ffn_dim == c.decoder_ffn_dim, "encoder_ffn_dim != decoder_ffn_dim"),
        (c.scale_embedding, "scale_embedding = false (attnkit scales embeddings by sqrt(d_model))"),
        (c.activation_function in ("relu", "gelu"), f"activation_function = {c.activation_function!r} "
                                                     "(attnkit has relu and gelu)"),
        (c.tie_word_embeddings, "tie_word_embeddings = false (attnkit ties the output to the target embeddings)"),
        ((c.pad_token_id, c.decoder_start_token_id, c.eos_token_id) == (PAD, BOS, EOS),
         f"pad/decoder_start/eos ids {c.pad_token_id}/{c.decoder_start_token_id}/{c.eos_token_id}: "
         f"attnkit's fixed ids are {PAD}/{BOS}/{EOS} (an Opus-MT vocabulary would need reordering)"),
        (c.d_model % 2 == 0, f"d_model = {c.d_model} is odd"),
        (c.encoder_layerdrop == 0 and c.decoder_layerdrop == 0, "layerdrop (attnkit has none)"),
    ]
    for ok, what in checks:
        if not ok:
            raise AttnkitError(f"cannot import this MarianMTModel: {what}")
    cfg = ExperimentConfig(name=name)
    m = cfg.model
    m.d_model, m.n_heads, m.d_ff = c.d_model, c.encoder_attention_heads, c.encoder_ffn_dim
    m.n_encoder_layers, m.n_decoder_layers = c.encoder_layers, c.decoder_layers
    m.dropout, m.attention_dropout, m.activation_dropout = (float(c.dropout), float(c.attention_dropout),
                                                             float(c.activation_dropout))
    m.activation, m.max_positions = c.activation_function, c.max_position_embeddings
    m.share_embeddings = bool(c.share_encoder_decoder_embeddings)
    cfg.data.joint_vocab = m.share_embeddings
    cfg.data.vocab_size = c.vocab_size
    cfg.data.src_lang, cfg.data.tgt_lang = src_lang, tgt_lang
    return cfg


# --- tokenizer files


def _vocab(spm_path: Path) -> dict[str, int]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_path))
    return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


def write_tokenizer(toks, cfg: ExperimentConfig, out: Path) -> None:
    """source.spm, target.spm and vocab.json (target_vocab.json too when the vocabularies differ): the ids of
    vocab.json are SentencePiece's own, so MarianTokenizer and attnkit produce the same ids."""
    shutil.copyfile(toks.src.path, out / "source.spm")
    shutil.copyfile(toks.tgt.path, out / "target.spm")
    (out / "vocab.json").write_text(json.dumps(_vocab(toks.src.path), ensure_ascii=False, indent=0), "utf-8")
    separate = not cfg.model.share_embeddings
    if separate:
        (out / "target_vocab.json").write_text(json.dumps(_vocab(toks.tgt.path), ensure_ascii=False, indent=0),
                                               "utf-8")
    tokenizer_config = {"tokenizer_class": "MarianTokenizer", "source_lang": cfg.data.src_lang,
                        "target_lang": cfg.data.tgt_lang, "separate_vocabs": separate,
                        "model_max_length": max_positions(cfg), "unk_token": "<unk>", "eos_token": "</s>",
                        "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1) + "\n", "utf-8")


def _check_tokenizer(directory: Path, separate: bool) -> None:
    """attnkit's tokenizer is the SentencePiece model itself: its ids must be vocab.json's."""
    import sentencepiece as spm

    sides = [("source.spm", "vocab.json"), ("target.spm", "target_vocab.json" if separate else "vocab.json")]
    for spm_name, vocab_name in sides:
        for name in (spm_name, vocab_name):
            if not (directory / name).exists():
                raise AttnkitError(f"{directory / name}: missing (a MarianTokenizer directory has source.spm, "
                                   "target.spm and vocab.json)")
        vocab = json.loads((directory / vocab_name).read_text(encoding="utf-8"))
        sp = spm.SentencePieceProcessor(model_file=str(directory / spm_name))
        ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
        if ids != (PAD, UNK, BOS, EOS):
            raise AttnkitError(f"{directory / spm_name}: special ids pad/unk/bos/eos are {ids}, attnkit needs "
                               f"{(PAD, UNK, BOS, EOS)}")
        if vocab != {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}:
            raise AttnkitError(f"{directory / vocab_name}: its ids are not {spm_name}'s own (attnkit tokenizes "
                               "with the SentencePiece ids)")
    if not separate and (directory / "source.spm").read_bytes() != (directory / "target.spm").read_bytes():
        raise AttnkitError(f"{directory}: source.spm and target.spm differ but the embeddings are shared "
                           "(attnkit's shared embeddings need one SentencePiece model)")


# --- the two directions


def empty_output(out: str | Path) -> Path:
    """Exports write whole directories (CTranslate2 replaces its): never into one that holds something."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise AttnkitError(f"{out}: exists and is not an empty directory; export into a new one")
    return out



def export_huggingface(checkpoint: str | Path, out: str | Path) -> Path:
    """Write a MarianMTModel directory (config.json, generation_config.json, model.safetensors, tokenizer files)."""
    model, cfg, toks, _ = load_checkpoint(checkpoint)
    f = registry.family(cfg.model.family)
    if not (f.decodes and "huggingface" in f.exports):
        raise AttnkitError(f"{checkpoint}: model.family = {cfg.model.family!r}; only the Transformer exports")
    out = empty_output(out)
    config = marian_config(cfg, toks.src.vocab_size, toks.tgt.vocab_size)
    hf = _transformers().MarianMTModel(config).eval()
    copy_to_marian(model, hf)
    hf.generation_config = generation_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    write_tokenizer(toks, cfg, out)
    return out


def load_marian(directory: str | Path):
    directory = Path(directory)
    if not (directory / "config.json").exists():
        raise AttnkitError(f"{directory}: not a Hugging Face model directory (no config.json)")
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(directory)
    if config.model_type != "marian":
        raise AttnkitError(f"{directory}: model_type = {config.model_type!r}, not marian")
    return transformers.MarianMTModel.from_pretrained(directory).eval()


def import_marian(directory: str | Path, out: str | Path) -> Path:
    """A MarianMTModel directory -> an attnkit checkpoint directory that decodes identically."""
    directory = Path(directory)
    hf = load_marian(directory)
    c = hf.config
    if hf.final_logits_bias.abs().max() > 0:
        raise AttnkitError(f"{directory}: final_logits_bias is not zero (attnkit's output projection has no bias)")
    tok_cfg_file = directory / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_file.read_text(encoding="utf-8")) if tok_cfg_file.exists() else {}
    cfg = attnkit_config(c, Path(out).name, tok_cfg.get("source_lang") or "en", tok_cfg.get("target_lang") or "de")
    _check_tokenizer(directory, not cfg.model.share_embeddings)
    model = Transformer(cfg.model, c.vocab_size, c.decoder_vocab_size).eval()
    copy_from_marian(hf, model)
    with tempfile.TemporaryDirectory() as tmp:
        if cfg.model.share_embeddings:
            files = [Path(tmp) / "spm.model"]
            shutil.copyfile(directory / "source.spm", files[0])
        else:
            files = [Path(tmp) / "spm.src.model", Path(tmp) / "spm.tgt.model"]
            shutil.copyfile(directory / "source.spm", files[0])
            shutil.copyfile(directory / "target.spm", files[1])
        return write_checkpoint(Path(out), model, cfg, files, {"imported_from": str(directory)})


# --- checks


@torch.no_grad()
def hf_greedy(hf, src: Tensor, max_lens: Tensor) -> list[list[int]]:
    """``generate`` greedily with attnkit's limits: at most max_lens[i] tokens counting EOS, which is forced at the
    limit (forced_eos_token_id). src [B, S] -> output ids per row, without BOS and EOS."""
    out = []
    for row, limit in zip(hf.generate(input_ids=src, attention_mask=src.ne(PAD), num_beams=1, do_sample=False,
                                      max_length=int(max_lens.max()) + 1).tolist(), max_lens.tolist()):
        row = row[1:1 + limit]  # drop the decoder start; a longer row of the batch went on past this one's limit
        out.append(row[:row.index(EOS)] if EOS in row else row[:limit - 1])
    return out


@torch.no_grad()
def log_prob_gap(model: Transformer, hf, src: Tensor, tgt_in: Tensor) -> float:
    """max |log p_attnkit - log p_Marian| over the non-pad positions of a teacher-forced batch."""
    ours = model(src, tgt_in).logits.log_softmax(-1)
    theirs = hf(input_ids=src, attention_mask=src.ne(PAD), decoder_input_ids=tgt_in).logits.log_softmax(-1)
    return float((ours - theirs)[tgt_in.ne(PAD)].abs().max())
