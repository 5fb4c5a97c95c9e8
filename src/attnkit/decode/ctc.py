"""Joint CTC/attention decoding (Watanabe et al., "Hybrid CTC/attention architecture for end-to-end speech
recognition", IEEE JSTSP 2017; ESPnet's ``ctc_weight`` at decoding): a search over a speech model trained with joint
CTC scores each extension ``c`` of a hypothesis ``g`` by the attention decoder and by CTC's prefix probability,

    score(g c) = (1 - λ) log p_att(c | g, x) + λ (log ψ(g c) - log ψ(g))

so that a finished hypothesis y scores ``(1 - λ) log p_att(y | x) + λ log p_ctc(y | x)``. ψ(h), the probability
that CTC's labelling of the frames begins with h, keeps the decoder's characters in step with the sound: a
hypothesis that skips or repeats a word, or ends early, loses CTC's probability however fluent the decoder finds it.

CTC's forward variables of a prefix h over the encoder's frames t = 1..T (Graves 2008, as Watanabe et al., Alg. 2):
γ_t^n(h) the probability of h from frames 1..t ending in h's last label, γ_t^b(h) ending in a blank. For h = g c,
with x_t(k) frame t's CTC probability of label k (blank: ∅) and φ_{t}(g, c) = γ_t^b(g) + [last(g) ≠ c] γ_t^n(g),

    γ_t^n(g c) = (γ_{t-1}^n(g c) + φ_{t-1}(g, c)) x_t(c)          γ_t^b(g c) = (γ_{t-1}^b(g c) + γ_{t-1}^n(g c)) x_t(∅)
    ψ(g c) = Σ_t φ_{t-1}(g, c) x_t(c)                            ψ(g EOS) = γ_T^n(g) + γ_T^b(g) = p_ctc(g | x)

with φ_0 = 1 for the empty g (else 0), γ_t^b(∅) = Π_{s≤t} x_s(∅) and γ^n(∅) = 0. Each recursion is linear in its
variable, so it is solved over all frames at once: r_t = a_t (r_{t-1} + b_{t-1}) is
``r_t = A_t Σ_{s≤t} b_{s-1} / A_{s-1}`` with A_t = Π_{u≤t} a_u, in log space a cumulative sum and a cumulative
logsumexp (float64, whose cumulative sums of hundreds of frames' log-probabilities keep their digits).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from attnkit.errors import AttnkitError
from attnkit.models.contract import DecodingState
from attnkit.tokens import BOS, EOS, PAD

BLANK = PAD  # CTC's blank is the padding id, never a target (attnkit.models.speech_transformer)
NEG_INF = float("-inf")


def linear_recursion(log_a: Tensor, log_b: Tensor) -> Tensor:
    """r_t = a_t (r_{t-1} + b_{t-1}) for t = 1..T with r_0 = 0, in log space: log_a [N, T] (log a_1..a_T),
    log_b [N, T] (log b_0..b_{T-1}) -> log r [N, T]. With A_t = Σ_{u≤t} log a_u:
    ``log r_t = A_t + logcumsumexp_{s≤t}(log b_{s-1} - A_{s-1})``."""
    big_a = log_a.cumsum(1)
    before = torch.nn.functional.pad(big_a[:, :-1], (1, 0))  # A_{s-1}: A_0 = 0
    return big_a + torch.logcumsumexp(log_b - before, 1)


def empty_prefix(log_x: Tensor) -> tuple[Tensor, Tensor]:
    """The forward variables of the empty prefix: log_x [N, T, V] (CTC's log-probabilities) ->
    (log γ^n = -inf [N, T], log γ^b_t = Σ_{s≤t} log x_s(∅) [N, T])."""
    blank = log_x[:, :, BLANK]
    return torch.full_like(blank, NEG_INF), blank.cumsum(1)


def phi(gamma_n: Tensor, gamma_b: Tensor, repeats: Tensor) -> Tensor:
    """log φ_t(g, c) = log(γ_t^b(g) + [last(g) ≠ c] γ_t^n(g)): gamma_n, gamma_b [N, T]; repeats [N, ...] True where
    c is g's last label -> [N, T, ...] (a repeated label needs a blank between its two)."""
    extra = repeats.dim() - 1
    n, b = gamma_n.view(*gamma_n.shape, *[1] * extra), gamma_b.view(*gamma_b.shape, *[1] * extra)
    both = torch.logaddexp(n, b)
    return torch.where(repeats[:, None], b.expand_as(both), both)


def shifted(phi_t: Tensor, empty: Tensor) -> Tensor:
    """log φ_{t-1} for t = 1..T from log φ_t [N, T, ...]: φ_0 = 1 for an empty prefix (``empty`` [N]), else 0."""
    first = torch.where(empty, 0.0, NEG_INF).to(phi_t.dtype).view(-1, *[1] * (phi_t.dim() - 1))
    return torch.cat([first.expand(-1, 1, *phi_t.shape[2:]), phi_t[:, :-1]], 1)


def prefix_scores(gamma_n: Tensor, gamma_b: Tensor, last: Tensor, empty: Tensor, log_x: Tensor,
                  frames: Tensor) -> Tensor:
    """log ψ(g c) for every label c: the forward variables of g [N, T], its last label [N] (any, where ``empty``
    [N]), log_x [N, T, V], the frames of each row [N] -> [N, V]; c = EOS: log p_ctc(g | x); blank and BOS: -inf."""
    v, t = log_x.size(2), log_x.size(1)
    labels = torch.arange(v, device=log_x.device)
    repeats = (labels[None] == last[:, None]) & ~empty[:, None]
    terms = shifted(phi(gamma_n, gamma_b, repeats), empty) + log_x  # [N, T, V]
    past = torch.arange(t, device=log_x.device)[None] >= frames[:, None]  # frames after a row's last
    psi = terms.masked_fill(past[:, :, None], NEG_INF).logsumexp(1)
    end = torch.logaddexp(gamma_n, gamma_b).gather(1, (frames - 1)[:, None]).squeeze(1)
    psi[:, EOS] = end
    psi[:, BLANK] = NEG_INF
    psi[:, BOS] = NEG_INF
    return psi


def extend(gamma_n: Tensor, gamma_b: Tensor, last: Tensor, empty: Tensor, log_x: Tensor,
           c: Tensor) -> tuple[Tensor, Tensor]:
    """The forward variables of g c from g's [N, T] (its last label [N], ``empty`` [N]) for one label c [N] each:
    -> (log γ^n(g c), log γ^b(g c)), both [N, T]."""
    phi_c = shifted(phi(gamma_n, gamma_b, (c == last) & ~empty), empty)  # [N, T]
    x_c = log_x.gather(2, c[:, None, None].expand(-1, log_x.size(1), 1)).squeeze(2)
    new_n = linear_recursion(x_c, phi_c)
    # γ_t^b = x_t(∅) (γ_{t-1}^b + γ_{t-1}^n), γ_0^b = 0: b_{t-1} = γ_{t-1}^n, γ_0^n = 0
    new_b = linear_recursion(log_x[:, :, BLANK], torch.nn.functional.pad(new_n[:, :-1], (1, 0), value=NEG_INF))
    return new_n, new_b


@dataclass
class JointState(DecodingState):
    """A joint search's state: the decoder's own (``inner``), CTC's log-probabilities of each row's frames
    ``log_x`` [N, T, V] with their count ``frames`` [N] (the source side), and each hypothesis' CTC prefix: its
    forward variables ``gamma_n``, ``gamma_b`` [N, T], its last label ``last`` [N], ``empty`` [N] (nothing
    spelled yet), log ψ of it ``psi`` [N] and of each of its one-label extensions ``extensions`` [N, V]."""

    inner: DecodingState
    log_x: Tensor
    frames: Tensor
    gamma_n: Tensor
    gamma_b: Tensor
    last: Tensor
    empty: Tensor
    psi: Tensor
    extensions: Tensor

    @property
    def rows(self) -> int:
        return self.gamma_n.size(0)

    @property
    def device(self) -> torch.device:
        return self.gamma_n.device

    def select(self, indices: Tensor, same_source: bool = False) -> JointState:
        source = (self.log_x, self.frames) if same_source else (self.log_x[indices], self.frames[indices])
        return JointState(self.inner.select(indices, same_source), *source, self.gamma_n[indices],
                          self.gamma_b[indices], self.last[indices], self.empty[indices], self.psi[indices],
                          self.extensions[indices])


class JointCTC(nn.Module):
    """A speech model's decoder (the core model or the fast runtime's) whose steps score by the attention decoder
    and CTC together, with weight ``ctc_weight`` λ on CTC; a model of the contract for :mod:`attnkit.decode.search`.
    The model must have been trained with joint CTC (its ``ctc_log_probs``)."""

    def __init__(self, decoder: nn.Module, ctc_weight: float):
        super().__init__()
        self.decoder, self.ctc_weight = decoder, ctc_weight
        self.core = getattr(decoder, "model", decoder)  # the fast runtime's decoder wraps the model

    def encode(self, source, need_weights: bool = False):
        return self.decoder.encode(source, need_weights)

    def memory_lengths(self, lengths: Tensor) -> Tensor:
        return self.core.memory_lengths(lengths)

    def search_steps(self) -> dict:
        return {}  # the plain search steps over :meth:`step`

    def init_state(self, memory) -> JointState:
        log_x = self.core.ctc_log_probs(memory).double()  # [N, T, V]
        frames = memory.padding_mask.logical_not().sum(1)
        gamma_n, gamma_b = empty_prefix(log_x)
        n = log_x.size(0)
        last = torch.full((n,), BLANK, dtype=torch.long, device=log_x.device)
        empty = torch.ones(n, dtype=torch.bool, device=log_x.device)
        return JointState(self.decoder.init_state(memory), log_x, frames, gamma_n, gamma_b, last, empty,
                          log_x.new_zeros(n), prefix_scores(gamma_n, gamma_b, last, empty, log_x, frames))

    def step(self, tokens: Tensor, state: JointState, need_weights: bool = False):
        """tokens [N] (BOS at the first step) -> (joint log-scores [N, V], the new state, the decoder's attention)."""
        log_probs, inner, attn = self.decoder.step(tokens, state.inner, need_weights)
        s, grown = replace(state, inner=inner), tokens != BOS  # the hypotheses grow by the tokens they took
        if bool(grown.any()):  # (none at the first step)
            new_n, new_b = extend(s.gamma_n, s.gamma_b, s.last, s.empty, s.log_x, tokens)
            psi = s.extensions.gather(1, tokens[:, None]).squeeze(1)
            g = grown[:, None]
            gamma_n, gamma_b = torch.where(g, new_n, s.gamma_n), torch.where(g, new_b, s.gamma_b)
            last, empty, psi = torch.where(grown, tokens, s.last), s.empty & ~grown, torch.where(grown, psi, s.psi)
            s = replace(s, gamma_n=gamma_n, gamma_b=gamma_b, last=last, empty=empty, psi=psi,
                        extensions=prefix_scores(gamma_n, gamma_b, last, empty, s.log_x, s.frames))
        ctc = (s.extensions - s.psi[:, None]).nan_to_num(nan=NEG_INF)  # an impossible prefix extends to nothing
        w = self.ctc_weight
        return ((1 - w) * log_probs.double() + w * ctc).to(log_probs.dtype), s, attn


def joint_ctc(decoder: nn.Module, ctc_weight: float, where: str) -> nn.Module:
    """``decoder`` itself for ``ctc_weight`` 0, else its :class:`JointCTC`; one line naming ``where`` (a checkpoint)
    when the model learned no CTC or the weight is outside [0, 1]."""
    if not 0.0 <= ctc_weight <= 1.0:
        raise AttnkitError(f"{where}: decode.ctc_weight must be in [0, 1], not {ctc_weight}")
    if ctc_weight == 0.0:
        return decoder
    core = getattr(decoder, "model", decoder)
    if getattr(core, "ctc_output", None) is None:
        raise AttnkitError(f"{where}: decode.ctc_weight = {ctc_weight} needs a model trained with joint CTC "
                           f"(model.ctc_weight > 0); this {core.family} model has no CTC output")
    return JointCTC(decoder, ctc_weight)
