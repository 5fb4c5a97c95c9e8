"""Joint CTC/attention decoding (attnkit.decode.ctc): CTC's prefix probabilities against a brute-force sum over every
frame labelling, a finished hypothesis' CTC score against torch's ctc_loss, and the joint search's scores against
the two models' own scores of the hypotheses it returns."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

from attnkit.decode.ctc import JointCTC, empty_prefix, extend, joint_ctc, prefix_scores
from attnkit.decode.search import beam_search, greedy
from attnkit.errors import AttnkitError
from attnkit.fast import decoder as fast_decoder
from attnkit.models.speech_transformer import SpeechTransformer, SpeechTransformerConfig
from attnkit.nn.audio import pad_frames
from attnkit.tokens import BOS, EOS, PAD

V = 7  # PAD (CTC's blank), UNK, BOS, EOS and three characters


def collapsed(path: tuple[int, ...]) -> tuple[int, ...]:
    """CTC's many-to-one map (Graves et al. 2006): repeated labels merged, then blanks removed."""
    out, previous = [], None
    for k in path:
        if k != PAD and k != previous:
            out.append(k)
        previous = k
    return tuple(out)


def forward_variables(prefix: tuple[int, ...], log_x: torch.Tensor):
    """The prefix's forward variables, grown one label at a time by :func:`extend`, with its last label and whether
    it is empty: log_x [1, T, V]."""
    gamma_n, gamma_b = empty_prefix(log_x)
    last, empty = torch.tensor([PAD]), torch.tensor([True])
    for c in prefix:
        gamma_n, gamma_b = extend(gamma_n, gamma_b, last, empty, log_x, torch.tensor([c]))
        last, empty = torch.tensor([c]), torch.tensor([False])
    return gamma_n, gamma_b, last, empty


def test_prefix_probabilities_equal_the_sum_over_every_frame_labelling():
    """ψ(g c), the probability that the labelling's collapse begins with g c, and p(g) (ψ(g EOS)), summed by brute
    force over all V^T labellings of T = 5 frames, for prefixes with repeats (which need a blank between them)."""
    torch.manual_seed(0)
    t = 5
    log_x = torch.randn(1, t, V, dtype=torch.float64).log_softmax(-1)
    exact: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(V), repeat=t):
        p = math.exp(sum(float(log_x[0, i, k]) for i, k in enumerate(path)))
        exact[collapsed(path)] = exact.get(collapsed(path), 0.0) + p
    characters = [1, 4, 5, 6]  # UNK is a label as any character is
    for prefix in [(), (4,), (4, 4), (5, 4, 5), (1, 6), (6, 6, 6)]:
        psi = prefix_scores(*forward_variables(prefix, log_x), log_x, torch.tensor([t]))[0].exp()
        for c in characters:
            begins = sum(p for labels, p in exact.items() if labels[: len(prefix) + 1] == (*prefix, c))
            assert float(psi[c]) == pytest.approx(begins, rel=1e-10, abs=1e-300), (prefix, c)
        assert float(psi[EOS]) == pytest.approx(exact.get(prefix, 0.0), rel=1e-10, abs=1e-300), prefix
        assert float(psi[PAD]) == 0.0 and float(psi[BOS]) == 0.0


def test_a_labellings_probability_equals_torchs_ctc_loss_and_padding_changes_nothing():
    """ψ(y EOS) = p_ctc(y | x) = exp(-ctc_loss) over a hundred frames, for utterances padded together in a batch
    (frames past a row's last never count)."""
    torch.manual_seed(1)
    frames = [100, 63, 81]
    labels = [(4, 5, 5, 1, 4, 6), (6, 4), (5, 5, 5, 4)]
    log_x = torch.randn(3, max(frames), V, dtype=torch.float64).log_softmax(-1)
    gamma_n, gamma_b = empty_prefix(log_x)
    last, empty = torch.full((3,), PAD), torch.ones(3, dtype=torch.bool)
    for i in range(max(map(len, labels))):
        c = torch.tensor([y[i] if i < len(y) else PAD for y in labels])
        n, b = extend(gamma_n, gamma_b, last, empty, log_x, c)
        grows = torch.tensor([i < len(y) for y in labels])
        gamma_n, gamma_b = torch.where(grows[:, None], n, gamma_n), torch.where(grows[:, None], b, gamma_b)
        last, empty = torch.where(grows, c, last), empty & ~grows
    ours = prefix_scores(gamma_n, gamma_b, last, empty, log_x, torch.tensor(frames))[:, EOS]
    for i, (n, y) in enumerate(zip(frames, labels)):
        ref = -torch.nn.functional.ctc_loss(log_x[i, :n, None], torch.tensor([y]), torch.tensor([n]),
                                            torch.tensor([len(y)]), blank=PAD, reduction="sum")
        assert float(ours[i]) == pytest.approx(float(ref), rel=1e-10)


def joint_model(seed: int = 0) -> SpeechTransformer:
    torch.manual_seed(seed)
    cfg = SpeechTransformerConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=1,
                                  conv_channels=4, dropout=0.0, ctc_weight=0.3)
    return SpeechTransformer(cfg, 20, V).eval()


def attention_score(model, frames, y: list[int]) -> float:
    """log p_att(y EOS | x) by teacher forcing."""
    logits = model(frames, torch.tensor([[BOS, *y]])).logits.log_softmax(-1)[0]
    return float(sum(logits[i, c] for i, c in enumerate([*y, EOS])))


def ctc_score(model, frames, y: list[int]) -> float:
    """log p_ctc(y | x) by torch's ctc_loss over the model's own CTC layer."""
    log_probs = model.ctc_log_probs(model.encode(frames))[0].double()
    return -float(torch.nn.functional.ctc_loss(log_probs[:, None], torch.tensor([y], dtype=torch.long),
                                               torch.tensor([log_probs.size(0)]), torch.tensor([len(y)]),
                                               blank=PAD, reduction="sum"))


@pytest.mark.parametrize("weight", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("fast", [False, True])
@torch.no_grad()
def test_a_joint_searchs_hypotheses_score_what_both_models_give_them(weight, fast):
    """Beam search (len_penalty 0: raw sums) and greedy decoding over :class:`JointCTC` of weight λ: each returned
    hypothesis' score is (1 - λ) log p_att(y | x) + λ log p_ctc(y | x), each model scoring it alone; so the beams'
    reordering carries each hypothesis' CTC prefix with it. The search runs over the fast runtime's decoder too."""
    model = joint_model()
    utterances = [torch.randn(n, 20, generator=torch.Generator().manual_seed(n)) for n in (96, 57, 120)]
    decoder = JointCTC(fast_decoder(model) if fast else model, weight)
    state = decoder.init_state(decoder.encode(pad_frames(utterances)))
    limits = torch.tensor([8, 8, 8])
    found = beam_search(decoder, state, limits, beam_size=3, len_penalty=0.0, n_best=3)
    found_greedy = greedy(decoder, decoder.init_state(decoder.encode(pad_frames(utterances))), limits)
    for f, hyps, one in zip(utterances, found, found_greedy):
        frames = pad_frames([f])
        for h in [*hyps, one]:  # (one ended by the length limit scores the EOS it was given)
            expected = (1 - weight) * attention_score(model, frames, h.tokens) + \
                weight * ctc_score(model, frames, h.tokens)
            assert h.score == pytest.approx(expected, abs=1e-4), (weight, h.tokens)


def test_joint_decoding_needs_a_model_trained_with_ctc_and_a_weight_in_range():
    plain = SpeechTransformer(dataclasses.replace(joint_model().cfg, ctc_weight=0.0), 20, V)
    with pytest.raises(AttnkitError, match=r"^runs/x: decode.ctc_weight = 0.3 needs a model trained with joint CTC"):
        joint_ctc(plain, 0.3, "runs/x")
    assert joint_ctc(plain, 0.0, "runs/x") is plain
    for bad in (-0.1, 1.5):
        with pytest.raises(AttnkitError, match=r"^runs/x: decode.ctc_weight must be in \[0, 1\]"):
            joint_ctc(joint_model(), bad, "runs/x")
