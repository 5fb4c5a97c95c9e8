"""attnkit's Transformer -> two ONNX graphs: the encoder and one decoder step, the key/value cache explicit.

``encoder.onnx``::

    src [B, S] int64 (PAD-padded, EOS-terminated)
      -> cross_keys, cross_values [L, B, H, S, d_head]   every decoder layer's projection of the memory

``decoder_step.onnx``::

    tokens [B] int64 (the previous outputs; BOS first), src [B, S] int64 (for its padding mask),
    cross_keys, cross_values [L, B, H, S, d_head], past_keys, past_values [L, B, H, T, d_head]
      -> log_probs [B, V], present_keys, present_values [L, B, H, T + 1, d_head]

The step's position is T, the cache's length, so a decoding loop only feeds outputs back in
(start with T = 0: empty caches). The graphs call the model's own ``encode`` and ``step`` — the
same code attnkit decodes with — traced by ``torch.onnx.export``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from attnkit import registry
from attnkit.checkpoint import load_checkpoint
from attnkit.errors import AttnkitError
from attnkit.models import BOS, EOS, PAD, Transformer
from attnkit.models.contract import DecodingState
from attnkit.models.transformer import DecoderState, Memory
from attnkit.nn import KVCache

OPSET = 18


class EncoderGraph(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> cross_keys, cross_values [L, B, H, S, d_head]."""
        kv = self.model.init_state(self.model.encode(src)).memory_kv
        return torch.stack([c.keys for c in kv]), torch.stack([c.values for c in kv])


class DecoderStepGraph(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor, src: Tensor, cross_keys: Tensor, cross_values: Tensor, past_keys: Tensor,
                past_values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """See the module docstring for the shapes."""
        n_layers = cross_keys.size(0)
        # the memory's states are only needed to build cross_keys/values, which come in ready
        state = DecoderState(Memory(cross_keys[0], src.eq(PAD)),
                             [KVCache(cross_keys[i], cross_values[i]) for i in range(n_layers)],
                             [KVCache(past_keys[i], past_values[i]) for i in range(n_layers)],
                             offset=past_keys.size(3))
        log_probs, state, _ = self.model.step(tokens, state)
        return (log_probs, torch.stack([c.keys for c in state.caches]),
                torch.stack([c.values for c in state.caches]))


def example_inputs(model: Transformer, batch: int = 2, src_len: int = 5, past: int = 3) -> dict[str, Tensor]:
    """Inputs of the shapes the graphs take (the source rows padded differently)."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, model.src_embed.tokens.num_embeddings, (batch, src_len), generator=g)
    src[:, -1] = EOS
    src[1:, src_len - 2:] = PAD
    src[1:, src_len - 3] = EOS
    h, dh = cfg.n_heads, cfg.d_model // cfg.n_heads
    past_kv = torch.randn(cfg.n_decoder_layers, batch, h, past, dh, generator=g)
    tokens = torch.randint(4, model.tgt_embed.tokens.num_embeddings, (batch,), generator=g)
    return {"src": src, "tokens": tokens, "past_keys": past_kv,
            "past_values": torch.randn(past_kv.shape, generator=g)}


def export_onnx(checkpoint: str | Path, out: str | Path) -> Path:
    """Write encoder.onnx, decoder_step.onnx (weights inside each), onnx.json describing them, and the tokenizer."""
    from attnkit.export.huggingface import empty_output

    out = empty_output(out)
    model, cfg, toks, _ = load_checkpoint(checkpoint)
    f = registry.family(cfg.model.family)
    if not (f.decodes and "onnx" in f.exports):
        raise AttnkitError(f"{checkpoint}: model.family = {cfg.model.family!r}; only the Transformer exports to ONNX")
    export_graphs(model, out)
    for f in sorted({toks.src.path, toks.tgt.path}):
        shutil.copyfile(f, Path(out) / f.name)
    return Path(out)


def export_graphs(model: Transformer, out: str | Path) -> Path:
    try:
        import onnx  # noqa: F401  (torch.onnx.export writes with it)
    except ImportError:
        raise AttnkitError("exporting to ONNX needs the onnx package (pip install onnx onnxruntime)") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    x = example_inputs(model)
    with torch.no_grad():
        cross_k, cross_v = EncoderGraph(model)(x["src"])
    batch, src_len, past = "batch", "src_len", "past"
    cache = {1: batch, 3: past}
    memory = {1: batch, 3: src_len}
    _export(EncoderGraph(model), (x["src"],), out / "encoder.onnx", ["src"], ["cross_keys", "cross_values"],
            {"src": {0: batch, 1: src_len}})
    _export(DecoderStepGraph(model), (x["tokens"], x["src"], cross_k, cross_v, x["past_keys"], x["past_values"]),
            out / "decoder_step.onnx",
            ["tokens", "src", "cross_keys", "cross_values", "past_keys", "past_values"],
            ["log_probs", "present_keys", "present_values"],
            {"tokens": {0: batch}, "src": {0: batch, 1: src_len}, "cross_keys": memory, "cross_values": memory,
             "past_keys": cache, "past_values": cache})
    cfg = model.cfg
    (out / "onnx.json").write_text(json.dumps({
        "encoder": "encoder.onnx", "decoder_step": "decoder_step.onnx", "opset": OPSET,
        "n_layers": cfg.n_decoder_layers, "n_heads": cfg.n_heads, "d_head": cfg.d_model // cfg.n_heads,
        "pad_id": PAD, "bos_id": BOS, "eos_id": EOS, "max_positions": cfg.max_positions}, indent=1) + "\n", "utf-8")
    return out


def _export(module: nn.Module, args: tuple, path: Path, input_names, output_names, dynamic_axes: dict) -> None:
    """TorchScript tracing (``dynamo=False``): torch.export refuses the model's data-dependent branches (extend
    the position table past max_positions; give an all-padding source zeros), which tracing fixes to the
    common case, so the graphs take positions below max_positions and sources with at least one token."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, args, str(path), input_names=input_names, output_names=output_names,
                          dynamic_axes=dynamic_axes, opset_version=OPSET, dynamo=False)


# --- running the graphs: onnxruntime behind the model contract's decoding methods


@dataclass
class OnnxState(DecodingState):
    """The decoding state of :class:`OnnxTransformer`: the source and the caches, numpy arrays."""

    src: np.ndarray  # [B, S]
    cross_keys: np.ndarray  # [L, B, H, S, d_head]
    cross_values: np.ndarray
    past_keys: np.ndarray  # [L, B, H, T, d_head]
    past_values: np.ndarray

    def select(self, indices: Tensor, same_source: bool = False) -> OnnxState:
        i = indices.numpy()
        if same_source:
            return OnnxState(self.src, self.cross_keys, self.cross_values, self.past_keys[:, i], self.past_values[:, i])
        return OnnxState(self.src[i], self.cross_keys[:, i], self.cross_values[:, i], self.past_keys[:, i],
                         self.past_values[:, i])

    def repeat_beams(self, k: int) -> OnnxState:
        """Every row becomes ``k`` consecutive rows (its beams)."""
        return self.select(torch.arange(self.src.shape[0]).repeat_interleave(k))


def onnx_session(path: Path, threads: int = 1):
    """An onnxruntime session of the graph at ``path`` on the CPU, ``threads`` intra-op threads, one inter-op."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise AttnkitError("running the ONNX export needs the onnxruntime package (pip install onnxruntime)") \
            from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxTransformer:
    """The exported graphs in onnxruntime, offering ``encode``/``init_state``/``step``: attnkit's greedy and beam
    search (``attnkit.decode.generate``) run on it unchanged."""

    def __init__(self, directory: str | Path, threads: int = 1):
        directory = Path(directory)
        self.info = json.loads((directory / "onnx.json").read_text(encoding="utf-8"))
        self.encoder = onnx_session(directory / self.info["encoder"], threads)
        self.decoder = onnx_session(directory / self.info["decoder_step"], threads)

    def encode(self, src: Tensor) -> OnnxState:
        src = src.numpy()
        cross_keys, cross_values = self.encoder.run(None, {"src": src})
        info = self.info
        empty = np.zeros((info["n_layers"], src.shape[0], info["n_heads"], 0, info["d_head"]), np.float32)
        return OnnxState(src, cross_keys, cross_values, empty, empty)

    def init_state(self, memory: OnnxState) -> OnnxState:
        return memory

    def search_steps(self) -> dict:
        """No search steps of its own: greedy and beam search run theirs over :meth:`step`."""
        return {}

    def step(self, tokens: Tensor, state: OnnxState, need_weights: bool = False):
        """tokens [B] -> (log_probs [B, V] as a torch tensor, new state, None: the graphs give no attention)."""
        log_probs, keys, values = self.decoder.run(None, {
            "tokens": tokens.numpy(), "src": state.src, "cross_keys": state.cross_keys,
            "cross_values": state.cross_values, "past_keys": state.past_keys, "past_values": state.past_values})
        return torch.from_numpy(log_probs), OnnxState(state.src, state.cross_keys, state.cross_values, keys,
                                                      values), None


@torch.no_grad()
def step_gap(model: Transformer, onnx_model: OnnxTransformer, src: Tensor, steps: int = 8) -> float:
    """Largest |difference| between PyTorch and onnxruntime over the cross keys/values, then ``steps`` greedy
    steps' log-probabilities and caches (the tokens fed back are PyTorch's)."""
    model.eval()
    state, theirs = model.init_state(model.encode(src)), onnx_model.encode(src)
    gap = max(float(np.abs(theirs.cross_keys[i] - kv.keys.numpy()).max()) for i, kv in enumerate(state.memory_kv))
    tokens = torch.full((src.size(0),), BOS, dtype=torch.long)
    for _ in range(steps):
        ours, state, _ = model.step(tokens, state)
        log_probs, theirs, _ = onnx_model.step(tokens, theirs)
        cache_gap = max(float(np.abs(theirs.past_values[i] - c.values.numpy()).max())
                        for i, c in enumerate(state.caches))
        gap = max(gap, float((ours - log_probs).abs().max()), cache_gap)
        tokens = ours.argmax(-1)
    return gap
