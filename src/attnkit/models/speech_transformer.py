"""The Speech Transformer (Dong et al., ICASSP 2018): two strided 2-D convolutions subsample the log-mel frames 4x
in time (and in frequency), then attnkit's Transformer encoder-decoder spells characters.

    z = ReLU(Conv2d_s2(ReLU(Conv2d_s2(x))))        x [B, 1, T, F] -> z [B, C, T/4, F/4]
    e = sqrt(d_model) W vec(z) + PE                 [B, T/4, d_model], sinusoidal positions
    memory = Encoder(e);  the decoder as :class:`~attnkit.models.transformer.EncoderDecoder`'s

With ``ctc_weight`` above zero the encoder also learns CTC (Kim, Hori and Watanabe, ICASSP 2017, as ESPnet trains
its Speech Transformers): a linear layer reads the characters off each encoder frame, and the training loss is
``(1 - w) * attention loss + w * CTC's -log p(y | x)``, which pushes the encoder to hold the characters in order
before the decoder has learned to find them; a search may then score by both (``decode.ctc_weight``,
:mod:`attnkit.decode.ctc`). ``ctc_weight = 0`` is Dong et al.'s model.

The projected frames are scaled by sqrt(d_model) as the Transformer scales its token embeddings (and ESPnet its
subsampled frames): unscaled, they start some eight times smaller than the positions they are added to, so that
the encoder would at first see mostly where a frame is, not what it holds.

Each convolution's output past a row's length is zeroed, so a padded batch sees exactly what the row alone sees
(zeros where the convolution pads it), and the encoder masks the padded frames it is left with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from torch import Tensor, nn

from attnkit.models.contract import ModelOutput
from attnkit.models.transformer import EncoderDecoder, EncoderDecoderSizes, Memory, encoder_layers
from attnkit.nn import make_positional
from attnkit.nn.audio import Frames, conv_lengths, frame_padding_mask
from attnkit.nn.loss import ctc_nll
from attnkit.tokens import EOS, PAD


@dataclass
class SpeechTransformerConfig(EncoderDecoderSizes):
    """The Speech Transformer: ``conv_channels`` channels in each of the two 3x3 stride-2 convolutions, then the
    Transformer's sizes; ``ctc_weight``: the share of the joint CTC loss in training (0: none, the paper's)."""

    family: str = "speech_transformer"
    d_model: int = 144
    n_heads: int = 4
    d_ff: int = 576
    n_encoder_layers: int = 4
    n_decoder_layers: int = 2
    conv_channels: int = 32
    ctc_weight: float = 0.0


class ConvSubsampling(nn.Module):
    """Two 3x3 convolutions of stride 2 over (time, frequency), each followed by ReLU: time and frequency / 4."""

    def __init__(self, n_mels: int, channels: int, d_model: int):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(1, channels, 3, 2, 1), nn.Conv2d(channels, channels, 3, 2, 1)])
        f = n_mels
        for _ in self.convs:
            f = (f - 1) // 2 + 1
        self.proj = nn.Linear(channels * f, d_model)

    def forward(self, frames: Frames) -> tuple[Tensor, Tensor]:
        """frames [B, T, F] -> [B, T', d_model] and the lengths [B] it keeps."""
        x, lengths = frames.features[:, None], frames.lengths
        x = x.masked_fill(frame_padding_mask(lengths, x.size(2))[:, None, :, None], 0.0)
        for conv in self.convs:
            x, lengths = conv(x).relu(), conv_lengths(lengths)
            x = x.masked_fill(frame_padding_mask(lengths, x.size(2))[:, None, :, None], 0.0)
        b, c, t, f = x.shape
        return self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f)), lengths


class SpeechTransformer(EncoderDecoder):
    """The convolutional front end, sinusoidal (or learned) positions, the Transformer encoder, then the decoder."""

    capabilities = frozenset({"transcribe", "score", "attention"})

    def __init__(self, cfg: SpeechTransformerConfig, n_mels: int, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.subsample = ConvSubsampling(n_mels, cfg.conv_channels, d)
        self.scale = math.sqrt(d)
        self.src_positions = make_positional(cfg.positional, d, cfg.max_positions)
        self.src_dropout = nn.Dropout(cfg.dropout)
        self.encoder = encoder_layers(cfg)
        self.encoder_norm = nn.LayerNorm(d) if cfg.norm_first else nn.Identity()
        self.build_decoder(cfg, vocab_size)
        # the characters read off each encoder frame, PAD (never a target) as CTC's blank
        self.ctc_output = nn.Linear(d, vocab_size) if cfg.ctc_weight > 0 else None

    time_reduction = 4  # feature frames per encoder frame

    def memory_lengths(self, lengths: Tensor) -> Tensor:
        """Feature frames [B] -> the encoder's frames [B] the decoder attends over."""
        return conv_lengths(conv_lengths(lengths))

    def encode(self, source: Frames, need_weights: bool = False) -> Memory:
        """Frames [B, T, F] -> Memory over the T/4 subsampled frames; with ``need_weights`` it carries each encoder
        layer's self-attention [B, H, T/4, T/4]."""
        x, lengths = self.subsample(source)
        padding_mask = frame_padding_mask(lengths, x.size(1))
        x = self.src_dropout(x * self.scale + self.src_positions(x.size(1)))
        weights = []
        for layer in self.encoder:
            out = layer(x, padding_mask, need_weights)
            x = out.x
            weights.append(out.self_weights)
        memory = Memory(self.encoder_norm(x), padding_mask)
        return replace(memory, weights=weights) if need_weights else memory

    def forward(self, source: Frames, tgt_in: Tensor, targets: Tensor | None = None, label_smoothing: float = 0.0,
                need_weights: bool = False) -> ModelOutput:
        """Teacher forcing as :class:`EncoderDecoder`'s; with targets [B, T] (characters, then EOS) and
        ``ctc_weight`` w > 0 the loss is ``(1 - w) * attention loss + w * CTC's -log p(y | x)`` summed over the
        batch."""
        memory = self.encode(source, need_weights)
        out = self.decoder_forward(memory, tgt_in, targets, label_smoothing, need_weights)
        if targets is None or self.ctc_output is None:
            return out
        w = self.cfg.ctc_weight
        characters = targets.ne(PAD) & targets.ne(EOS)
        frames = memory.padding_mask.logical_not().sum(1)
        ctc = ctc_nll(self.ctc_log_probs(memory), frames, targets, characters.sum(1), blank=PAD)
        return replace(out, loss=(1 - w) * out.loss + w * ctc)

    def ctc_log_probs(self, memory: Memory) -> Tensor:
        """CTC's log-probabilities of each encoder frame's label (blank: PAD): memory [B, T, d] -> [B, T, V]."""
        return self.ctc_output(memory.states).log_softmax(-1)


def build_speech_transformer(cfg: SpeechTransformerConfig, n_mels: int, vocab_size: int) -> SpeechTransformer:
    """A Speech Transformer over ``n_mels``-band frames, spelling ``vocab_size`` characters."""
    return SpeechTransformer(cfg, n_mels, vocab_size)
