"""The model contract (attnkit.models.contract), checked once for every family: stepping equals teacher forcing,
beam search of width 1 equals greedy decoding, a state's select and repeat_beams stay on the state's device,
one typed forward output, and a checkpoint round trip gives the same model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit import registry
from attnkit.checkpoint import load_checkpoint, model_for, write_checkpoint
from attnkit.config import ExperimentConfig
from attnkit.data import CharTokenizer, WordVocab, build_tokenizers
from attnkit.decode import beam_search, greedy
from attnkit.models import DecodingState, GenerativeModel, ModelOutput
from attnkit.models.captioner import ShowAttendTellConfig, TransformerCaptionerConfig
from attnkit.models.conv import ConvTransformerConfig
from attnkit.models.las import LASConfig
from attnkit.models.lm import LMConfig
from attnkit.models.rnn import RNNEncDecConfig, RNNSearchConfig
from attnkit.models.speech_transformer import SpeechTransformerConfig
from attnkit.models.transformer import TransformerConfig
from attnkit.nn.audio import Frames
from attnkit.tokens import BOS, EOS, PAD

SMALL = dict(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_positions=64)
CONFIGS = {
    "transformer": (TransformerConfig(**SMALL), "dates"),
    "conv_transformer": (ConvTransformerConfig(**SMALL, conv_kernel=3), "dates"),
    "rnn_encdec": (RNNEncDecConfig(embedding_size=16, hidden_size=24, n_decoder_layers=2, dropout=0.0), "dates"),
    "rnnsearch": (RNNSearchConfig(embedding_size=16, hidden_size=12, n_decoder_layers=2, dropout=0.0), "dates"),
    "show_attend_tell": (ShowAttendTellConfig(hidden_size=16, attention_size=12, d_feature=8, dropout=0.0,
                                              attention_penalty=0.0), "flickr8k"),
    "transformer_captioner": (TransformerCaptionerConfig(**{k: v for k, v in SMALL.items()}, d_feature=8), "flickr8k"),
    "transformer_lm": (LMConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_positions=64),
                       "tinyshakespeare"),
    "las": (LASConfig(listener_size=8, speller_size=16, embedding_size=8, attention_size=8, dropout=0.0),
            "fsdd_digits"),
    "speech_transformer": (SpeechTransformerConfig(**SMALL, conv_channels=2), "fsdd_digits"),
}


def test_every_family_is_checked():
    assert set(CONFIGS) == {name for name, f in registry.FAMILIES.items() if f.decodes}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, dates_pairs):
    return make_tokenizers(tmp_path_factory.mktemp("contract_tokenizers"), dates_pairs)


def make_tokenizers(folder: Path, dates_pairs) -> dict:
    """Each data format's tokenizer for the families of :data:`CONFIGS`, built small in ``folder``."""
    cfg = ExperimentConfig()
    cfg.data = dataclasses.replace(cfg.data, format="dates", vocab_size=64)
    return {
        "dates": build_tokenizers(cfg.data, dates_pairs, folder),
        "flickr8k": WordVocab.build(["a dog runs on the grass", "two dogs play in the snow", "a man rides a bike"],
                                    folder / "vocab.txt", 1),
        "tinyshakespeare": CharTokenizer.build("First Citizen:\nBefore we proceed any further, hear me speak.\n",
                                               folder / "chars.json"),
        "fsdd_digits": CharTokenizer.build("0 1 2 3 4 5 6 7 8 9", folder / "digits" / "chars.json"),
    }


def experiment(family: str) -> ExperimentConfig:
    model, data_format = CONFIGS[family]
    cfg = ExperimentConfig(name=family)
    cfg.model = model
    cfg.data = dataclasses.replace(cfg.data, format=data_format)
    return cfg


def build(family: str, tokenizers, seed: int = 0) -> tuple[GenerativeModel, ExperimentConfig]:
    cfg = experiment(family)
    torch.manual_seed(seed)
    model = model_for(cfg, tokenizers[cfg.data.format]).eval()
    return model, cfg


def example(model: GenerativeModel, vocab: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """A source batch (token ids with padding in the second row, an image grid, or None for a language model)
    and BOS-started targets [2, 5] without padding."""
    g = torch.Generator().manual_seed(1)
    tgt_in = torch.cat([torch.full((2, 1), BOS), torch.randint(4, vocab, (2, 4), generator=g)], 1)
    if model.family == "transformer_lm":
        return None, tgt_in
    if "caption" in model.capabilities:
        return torch.randn(2, 49, 8, generator=g), tgt_in
    if "transcribe" in model.capabilities:  # 40-band frames, the second row padded
        return Frames(torch.randn(2, 48, 40, generator=g), torch.tensor([48, 29])), tgt_in
    src = torch.randint(4, vocab, (2, 6), generator=g)
    src[:, -1] = EOS
    src[1, 3:] = PAD
    src[1, 2] = EOS
    return src, tgt_in


def vocab_size(model) -> int:
    return model(*example_shape(model)).logits.size(-1)


def example_shape(model):
    tgt = torch.tensor([[BOS]])
    if model.family == "transformer_lm":
        return None, tgt
    if "caption" in model.capabilities:
        return torch.zeros(1, 49, 8), tgt
    if "transcribe" in model.capabilities:
        return Frames(torch.zeros(1, 16, 40), torch.tensor([16])), tgt
    return torch.tensor([[5, EOS]]), tgt


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_forward_returns_one_typed_output(family, tokenizers):
    model, _ = build(family, tokenizers)
    src, tgt_in = example(model, vocab_size(model))
    targets = torch.cat([tgt_in[:, 1:], torch.full((2, 1), EOS)], 1)
    with torch.no_grad():
        plain = model(src, tgt_in)
        trained = model(src, tgt_in, targets=targets)
        shown = model(src, tgt_in, need_weights=True)
    assert isinstance(plain, ModelOutput) and plain.loss is None and plain.logits.shape[:2] == tgt_in.shape
    assert isinstance(trained, ModelOutput) and trained.loss.dim() == 0 and trained.nll.dim() == 0
    # without label smoothing or a penalty the loss is the NLL: -sum log p(target)
    log_probs = plain.logits.float().log_softmax(-1)
    nll = -log_probs.gather(-1, targets[..., None]).sum()
    torch.testing.assert_close(trained.loss, nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(trained.nll, nll, rtol=1e-5, atol=1e-5)
    if "attention" in model.capabilities:
        maps = shown.attention
        assert maps is not None and (maps.encoder or maps.decoder or maps.cross)
        for weights in [*maps.encoder, *maps.decoder, *maps.cross]:
            assert weights.dim() == 4 and weights.size(0) == 2
            torch.testing.assert_close(weights.sum(-1)[0], torch.ones_like(weights.sum(-1)[0]))


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_stepping_equals_teacher_forcing(family, tokenizers):
    model, _ = build(family, tokenizers)
    src, tgt_in = example(model, vocab_size(model))
    with torch.no_grad():
        forced = model(src, tgt_in).logits.float().log_softmax(-1)
        state = model.init_state(model.encode(src if src is not None else tgt_in))
        assert isinstance(state, DecodingState)
        for t in range(tgt_in.size(1)):
            log_probs, state, _ = model.step(tgt_in[:, t], state)
            torch.testing.assert_close(log_probs, forced[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_beam_of_one_equals_greedy(family, tokenizers):
    model, _ = build(family, tokenizers, seed=3)
    src, _ = example(model, vocab_size(model))
    if src is None:
        src = torch.zeros(2, 1, dtype=torch.long)
    lengths = torch.tensor([7, 5])
    with torch.no_grad():
        by_greedy = greedy(model, model.init_state(model.encode(src)), lengths)
        by_beam = beam_search(model, model.init_state(model.encode(src)), lengths, beam_size=1, len_penalty=0.0)
    for g, [b] in zip(by_greedy, by_beam):
        assert g.tokens == b.tokens
        assert g.score == pytest.approx(b.score, abs=1e-4)


class OneDevicePerOp(TorchDispatchMode):
    """Records every op that mixes tensors of two devices (a CPU index for a state kept elsewhere)."""

    def __init__(self):
        super().__init__()
        self.mixed = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        devices = set()

        def visit(x):
            if isinstance(x, torch.Tensor) and x.dim() > 0:
                devices.add(x.device.type)
            elif isinstance(x, (list, tuple)):
                for y in x:
                    visit(y)

        visit(args)
        visit(list((kwargs or {}).values()))
        if len(devices) > 1:
            self.mixed.append((str(func), sorted(devices)))
        return func(*args, **(kwargs or {}))


def to_meta(obj):
    """A copy of a state (dataclasses, lists, tensors) with every tensor on the meta device."""
    if isinstance(obj, torch.Tensor):
        return obj.to("meta")
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **{f.name: to_meta(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
    if isinstance(obj, list):
        return [to_meta(x) for x in obj]
    return obj


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_select_and_repeat_beams_stay_on_the_states_device(family, tokenizers):
    model, _ = build(family, tokenizers)
    src, tgt_in = example(model, vocab_size(model))
    with torch.no_grad():
        state = model.init_state(model.encode(src if src is not None else tgt_in))
        _, state, _ = model.step(tgt_in[:, 0], state)
    state = to_meta(state)
    assert state.device.type == "meta" and state.rows == 2
    with OneDevicePerOp() as mode:
        repeated = state.repeat_beams(3)
        selected = repeated.select(torch.tensor([5, 4, 3, 0], device="meta"))
        same = repeated.select(torch.tensor([2, 1, 0, 3, 4, 5], device="meta"), same_source=True)
    assert mode.mixed == []
    assert repeated.rows == 6 and selected.rows == 4 and same.rows == 6
    for s in (repeated, selected, same):
        assert s.device.type == "meta"


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_checkpoint_round_trip(family, tokenizers, tmp_path):
    model, cfg = build(family, tokenizers, seed=5)
    toks = tokenizers[cfg.data.format]
    files = [toks.src.path] if hasattr(toks, "src") else [toks.path]
    path = write_checkpoint(tmp_path / "step-1", model, cfg, files, {"step": 1})
    loaded, loaded_cfg, _, where = load_checkpoint(tmp_path / "step-1")
    assert where == path and type(loaded) is type(model) and loaded_cfg.model == cfg.model
    src, tgt_in = example(model, vocab_size(model))
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt_in).logits, model(src, tgt_in).logits, rtol=0, atol=0)
    assert Path(where, "model.safetensors").is_file()


def test_bert_encoder_returns_every_layers_attention():
    """BERT encodes but does not generate: its part of the contract is the attention it returns."""
    from attnkit.models import BertEncoder
    from attnkit.models.bert import BertConfig

    torch.manual_seed(0)
    bert = BertEncoder(BertConfig(d_model=16, n_heads=2, d_ff=32, n_layers=2, max_positions=16), 30).eval()
    tokens = torch.tensor([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]])
    with torch.no_grad():
        out = bert(tokens, tokens.eq(0), need_weights=True)
    assert out.states.shape == (2, 5, 16) and len(out.weights) == 2
    assert bert(tokens, tokens.eq(0)).weights == []  # the same type, without the maps
    for w in out.weights:
        assert w.shape == (2, 2, 5, 5)
        assert float(w[1, :, :, 3:].abs().max()) == 0.0  # padding gets no attention
