"""Check a learner's own attention code against attnkit's core, in one sentence.

Each function here takes a function the learner wrote in plain PyTorch, calls it on random inputs and on the edge
cases where attention code usually breaks (a fully masked row, a single key, a batch of one, a long sequence), and
compares what it returns with attnkit's own reference (:mod:`attnkit.nn`, :mod:`attnkit.decode.search`)::

    import attnkit.check
    print(attnkit.check.attention(my_attention))   # my_attention(queries, keys, values, mask=None)
    assert attnkit.check.attention(my_attention)   # a Result is true when the function matches

The answer is a :class:`Result`: ``ok``, and ``message``, one sentence that says the function matches, or what
differs and where (which case, which position, the largest difference). When the learner's outputs equal those of
a known-wrong version of the reference on every case (no 1/sqrt(d) scaling, the softmax over the wrong axis, the
mask applied after the softmax, NaN in fully masked rows, heads split in the wrong order, ...), the sentence names
that mistake: the checks try those versions and say which one the learner wrote.

The functions the learner writes (tensors are float32; masks are boolean and True where attention is *allowed*, as
everywhere in attnkit):

=========================  ============================================================================================
check                      the learner's function
=========================  ============================================================================================
``attention``              ``f(queries [B, T, d_k], keys [B, S, d_k], values [B, S, d_v], mask [B, T, S] or None)``
                           -> output [B, T, d_v], or (output, weights [B, T, S]): scaled dot-product attention
``scores(f, "dot")``       ``f(queries [B, T, d], keys [B, S, d])`` -> scores [B, T, S]; also ``"scaled_dot"``
``scores(f, "general")``   ``f(queries [B, T, d_q], keys [B, S, d_k], W [d_q, d_k])`` -> ``q W k^T`` [B, T, S]
``scores(f, "additive")``  ``f(queries, keys, W_q [h, d_q], W_k [h, d_k], v [h])`` -> ``v^T tanh(W_q q + W_k k)``
``masked_softmax``         ``f(scores [B, T, S], mask [B, T, S])`` -> weights [B, T, S]; a row with nothing allowed
                           gets zero weights
``multi_head``             ``f(queries [B, T, D], keys [B, S, D], values [B, S, D], W_q, W_k, W_v, W_o, n_heads)``
                           -> [B, T, D]; each W is an ``nn.Linear`` weight [D, D] (``Q = queries @ W_q.T``), no biases
``positional_encoding``    ``f(n_positions, d_model)`` -> the sinusoid table [n_positions, d_model]
``causal_mask``            ``f(t)`` -> [t, t] booleans, True where query i may see key j; ``f(t, s)`` when it takes
                           two arguments: [t, s], the t queries being the last t of s positions
``beam_search_step``       ``f(scores [B, K], log_probs [B, K, V], k)`` -> (scores [B, k], beams [B, k],
                           tokens [B, k]): the k best one-token extensions of each sentence's K beams, best first
=========================  ============================================================================================

A check changes nothing outside itself: its random inputs come from a generator of its own (the global random
state is left as it was) and it never sets torch's threads, default dtype or grad mode.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.nn.attention import AdditiveScore, GeneralScore, attend, dot_score, reference_attention, scaled_dot_score
from attnkit.nn.attention import causal_mask as reference_causal_mask
from attnkit.nn.attention import masked_softmax as reference_masked_softmax
from attnkit.nn.positional import sinusoidal_table

ATOL, RTOL = 1e-4, 1e-3  # float32 sums over thousands of keys in another order stay well inside; mistakes do not


@dataclass(frozen=True)
class Result:
    """A check's verdict: ``ok``, the one-sentence ``message`` (also its ``str``), and the names of the mistakes it
    recognised (``mistakes``, empty when it matches or when the difference is none it knows). True when ok."""

    ok: bool
    message: str
    mistakes: tuple[str, ...] = field(default=())

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython shows the sentence, not the dataclass
        printer.text(self.message)


@dataclass
class Case:
    """One call of the learner's function: what it is called on, and how the sentence names it."""

    description: str
    args: tuple
    axes: tuple[str, ...]  # names of the output's leading axes, for positions ("batch", "query")


@dataclass
class Mistake:
    """A typical mistake: its ``key`` (in :attr:`Result.mistakes`) and the words the sentence names it with."""

    key: str
    text: str


@dataclass
class Variant:
    """A version of the reference with ``mistakes`` in it (none: the reference itself)."""

    mistakes: tuple[Mistake, ...]
    fn: Callable


# --- comparing outputs


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else torch.as_tensor(x)


def _outputs(got, names: Sequence[str]) -> list[Tensor]:
    """The learner's return value as a list of tensors: a tuple's items (a lone tensor, or a list of numbers for a
    check of one output: itself)."""
    if isinstance(got, tuple) or (isinstance(got, list) and len(names) > 1):
        return [_as_tensor(g) for g in got]
    return [_as_tensor(got)]


def _where(index: Sequence[int], axes: Sequence[str]) -> str:
    return ", ".join(f"{name} {i}" for name, i in zip(axes, index))


def _difference(got: Tensor, expected: Tensor, axes: Sequence[str], exact: bool = False,
                atol: float = ATOL) -> str | None:
    """None when ``got`` equals ``expected`` (NaN where it has NaN, within tolerance elsewhere); else what differs,
    as words: the shape, the dtype of a mask, the first NaN, or the largest difference and where."""
    if tuple(got.shape) != tuple(expected.shape):
        return f"has shape {list(got.shape)}, expected {list(expected.shape)}"
    if expected.dtype == torch.bool and got.dtype != torch.bool:
        return f"has dtype {got.dtype}, expected torch.bool"
    if got.dtype == torch.bool or expected.dtype == torch.bool or exact:
        same = got.to(expected.dtype) == expected
        if bool(same.all()):
            return None
        index = [int(i) for i in (~same).nonzero()[0]]
        return (f"differs at {_where(index, axes) or 'index ' + str(index)} "
                f"(got {_scalar(got[tuple(index)])}, expected {_scalar(expected[tuple(index)])})")
    got, expected = got.detach().double().cpu(), expected.detach().double().cpu()
    nan_got, nan_expected = got.isnan(), expected.isnan()
    if bool((nan_got & ~nan_expected).any()):
        index = [int(i) for i in (nan_got & ~nan_expected).nonzero()[0]]
        return f"is NaN at {_where(index, axes)} (expected {_scalar(expected[tuple(index)])})"
    if bool((nan_expected & ~nan_got).any()):
        index = [int(i) for i in (nan_expected & ~nan_got).nonzero()[0]]
        return f"is {_scalar(got[tuple(index)])} at {_where(index, axes)}, expected NaN"
    both = ~nan_got
    inf_wrong = (got.isinf() | expected.isinf()) & both & (got != expected)
    if bool(inf_wrong.any()):
        index = [int(i) for i in inf_wrong.nonzero()[0]]
        return f"is {_scalar(got[tuple(index)])} at {_where(index, axes)}, expected {_scalar(expected[tuple(index)])}"
    finite = both & ~got.isinf()
    gap = torch.where(finite, (got - expected).abs(), torch.zeros_like(got))
    allowed = atol + RTOL * expected.abs()
    if bool((gap <= torch.where(finite, allowed, torch.ones_like(got))).all()):
        return None
    index = [int(i) for i in torch.nonzero(gap == gap.max())[0]]
    return (f"differs by up to {gap.max().item():.3g} at {_where(index, axes)} "
            f"(got {_scalar(got[tuple(index)])}, expected {_scalar(expected[tuple(index)])})")


def _scalar(x: Tensor) -> str:
    v = x.item()
    return str(v) if isinstance(v, (bool, int)) else f"{v:.4g}"


def _same(got, expected: list[Tensor], names: Sequence[str], case: Case, exact: Sequence[bool],
          atol: float = ATOL) -> str | None:
    """None when every output the learner returned equals the expected one; else the first difference, in words."""
    try:
        outs = _outputs(got, names)
    except (TypeError, ValueError, RuntimeError) as e:
        return f"returned {type(got).__name__}, which is not {' and '.join(names)} ({e})"
    if len(outs) > len(names):
        return f"returned {len(outs)} values, expected {' and '.join(names)}"
    for i, (out, ref) in enumerate(zip(outs, expected)):
        problem = _difference(out, ref, case.axes, exact[i], atol)
        if problem is not None:
            verb, rest = problem.split(" ", 1)
            if names[i].endswith("s"):  # the weights, the scores, the beams, the tokens
                verb = {"has": "have", "is": "are", "differs": "differ"}.get(verb, verb)
            return f"{names[i]} {verb} {rest}"
    return None


# --- the search for the learner's mistake


def _call(fn: Callable, case: Case):
    """``fn`` on copies of the case's tensors: a function that changes its inputs in place spoils no other call."""
    args = tuple(a.clone() if isinstance(a, Tensor) else a for a in case.args)
    with torch.no_grad():
        return fn(*args)


def _answers(variant: Variant, case: Case) -> bool:
    try:
        _call(variant.fn, case)
    except (RuntimeError, ValueError, IndexError):
        return False
    return True


def _agrees(variant: Variant, case: Case, got, names, exact, atol) -> bool:
    try:
        expected = _outputs(_call(variant.fn, case), names)
    except (RuntimeError, ValueError, IndexError):  # a version that cannot take this case's shapes
        return False
    return _same(got, expected, names, case, exact, atol) is None


def _run(what: str, reference_name: str, learner: Callable, cases: list[Case], variants: list[Variant],
         names: Sequence[str], exact: Sequence[bool] = (False, False, False), special=None,
         atol: float = ATOL) -> Result:
    """Call ``learner`` on every case, compare with the reference (``variants[0]``, without mistakes), and when it
    differs, find the version with the fewest mistakes that returns what the learner's does on every case."""
    learner_name = getattr(learner, "__name__", "your function")
    if learner_name == "<lambda>":
        learner_name = "your function"
    reference = variants[0].fn
    got, raised, differences = [], [], []
    for case in cases:
        try:
            out = _call(learner, case)
        except Exception as e:  # the learner's code: any error is a finding, reported in the sentence
            got.append(None)
            raised.append((case, e))
            differences.append(None)
            continue
        got.append(out)
        differences.append(_same(out, _outputs(_call(reference, case), names), names, case, exact, atol))
    wrong = [(c, d) for c, d in zip(cases, differences) if d is not None]
    if not wrong and not raised:
        listed = "; ".join(c.description for c in cases)
        return Result(True, f"{learner_name} matches {reference_name} on all {len(cases)} cases: {listed}.")
    if special is not None:
        found = special(learner_name, cases, got, raised)
        if found is not None:
            return found
    answered = [(c, g) for c, g in zip(cases, got) if g is not None]
    if wrong:
        for variant in variants[1:]:
            # a version explains the learner's function when it returns the same on every case the function answered
            # and cannot take the cases where the function raised either
            if all(_agrees(variant, c, g, names, exact, atol) for c, g in answered) and \
                    all(not _answers(variant, c) for c, _ in raised):
                case, problem = wrong[0]
                said = "; and ".join(m.text for m in variant.mistakes)
                count = "" if len(variant.mistakes) == 1 else f"{len(variant.mistakes)} mistakes: "
                return Result(False, f"{learner_name} does not match {reference_name}: {count}{said}; "
                                     f"on {case.description}, {problem}.",
                              tuple(m.key for m in variant.mistakes))
    if raised:
        case, e = raised[0]
        first_line = (str(e).strip().splitlines() or [""])[0]
        return Result(False, f"{learner_name} raised {type(e).__name__} on {case.description}"
                             f"{': ' + first_line if first_line else ''}.", ("raised",))
    case, problem = wrong[0]
    return Result(False, f"{learner_name} differs from {reference_name} on {case.description}: {problem}.")


def _variants(build: Callable, options: dict[str, dict[str, Mistake | None]]) -> list[Variant]:
    """Every combination of the options (each option's first choice is the reference's), fewest mistakes first."""
    keys = list(options)
    variants = []
    for choice in itertools.product(*(list(options[k]) for k in keys)):
        mistakes = tuple(options[k][c] for k, c in zip(keys, choice) if options[k][c] is not None)
        fn = build(**dict(zip(keys, choice)))
        if fn is not None:  # None: a combination no learner writes
            variants.append(Variant(mistakes, fn))
    return sorted(variants, key=lambda v: len(v.mistakes))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g) * scale


def _random_mask(g: torch.Generator, b: int, t: int, s: int) -> Tensor:
    """[b, t, s] with at least one allowed key per query."""
    mask = torch.rand(b, t, s, generator=g) < 0.6
    mask[..., 0] |= ~mask.any(-1)
    return mask


# --- softmax and masking, as the reference does them and as learners get them wrong

AXIS = {-1: None, -2: Mistake("wrong_axis", "the softmax runs over the queries (dim -2), not over the keys (dim -1): "
                                            "each query's weights must sum to 1 over the keys")}
MASKING = {
    "before": None,
    "after": Mistake("mask_after_softmax", "the mask is applied after the softmax, so the allowed keys' weights no "
                                           "longer sum to 1 (fill the masked scores with -inf before the softmax)"),
    "finite": Mistake("mask_finite", "a fully masked row gets equal weights on every key, because the masked scores "
                                     "are a large finite number rather than -inf (attnkit gives that row zero weights "
                                     "and a zero output)"),
    "inverted": Mistake("mask_inverted", "the mask is read the wrong way round (attnkit's masks are True where "
                                         "attention is allowed)"),
    "zero": Mistake("mask_zero", "the masked scores are set to 0, and e^0 still gets weight after the softmax "
                                 "(fill them with -inf)"),
    "ignored": Mistake("mask_ignored", "the mask is ignored"),
}
NAN = {True: None, False: Mistake("nan_rows", "a fully masked row gives NaN (the softmax of a row of -inf) where "
                                              "attnkit gives zero weights, e.g. with .nan_to_num(0.0)")}


def _softmax(scores: Tensor, mask: Tensor | None, axis: int, masking: str, zero_nan: bool) -> Tensor:
    if mask is None or masking == "ignored":
        return torch.softmax(scores, dim=axis)
    if masking == "after":
        return torch.softmax(scores, dim=axis) * mask
    if masking == "finite":
        return torch.softmax(scores.masked_fill(~mask, -1e9), dim=axis)
    if masking == "zero":
        return torch.softmax(scores * mask, dim=axis)
    hidden = mask if masking == "inverted" else ~mask
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=axis)
    return weights.nan_to_num(0.0) if zero_nan else weights


# --- attention


def _attention_cases() -> list[Case]:
    g = _generator(0)
    axes = ("batch", "query")
    cases = [Case("random inputs without a mask (2 x 5 queries, 7 keys, d_k 16, d_v 9)",
                  (_randn(g, 2, 5, 16), _randn(g, 2, 7, 16), _randn(g, 2, 7, 9), None), axes)]
    mask = _random_mask(g, 2, 4, 6)
    mask[1, 2] = False
    cases.append(Case("a padding mask with a fully masked row (mask[1, 2] all False)",
                      (_randn(g, 2, 4, 16), _randn(g, 2, 6, 16), _randn(g, 2, 6, 9), mask), axes))
    cases.append(Case("a single key (3 x 4 queries, 1 key)",
                      (_randn(g, 3, 4, 16), _randn(g, 3, 1, 16), _randn(g, 3, 1, 9), torch.ones(3, 4, 1, dtype=bool)),
                      axes))
    cases.append(Case("a batch of one (1 query, 5 keys)",
                      (_randn(g, 1, 1, 16), _randn(g, 1, 5, 16), _randn(g, 1, 5, 9), _random_mask(g, 1, 1, 5)), axes))
    n = 512
    cases.append(Case(f"a long sequence under a causal mask ({n} positions, d_k 64)",
                      (_randn(g, 1, n, 64), _randn(g, 1, n, 64), _randn(g, 1, n, 64),
                       reference_causal_mask(n)[None].clone()), axes))
    return cases


SCALE = {
    "sqrt_dk": None,
    "none": Mistake("no_scaling", "the scores are not divided by sqrt(d_k) (no 1/sqrt(d) scaling)"),
    "sqrt_dv": Mistake("scaled_by_dv", "the scores are divided by sqrt(d_v), the values' size, not sqrt(d_k), "
                                       "the keys' size"),
    "dk": Mistake("scaled_by_d", "the scores are divided by d_k, not by its square root"),
}


def _attention_variant(scale: str, axis: int, masking: str, zero_nan: bool):
    if not zero_nan and masking not in ("before", "inverted"):
        return None  # only a mask of -inf makes NaN

    def fn(q, k, v, mask):
        if (scale, axis, masking, zero_nan) == ("sqrt_dk", -1, "before", True):
            return attend(q, k, v, mask)  # the reference: attnkit's own attend
        divisor = {"sqrt_dk": math.sqrt(k.size(-1)), "none": 1.0, "sqrt_dv": math.sqrt(v.size(-1)),
                   "dk": float(k.size(-1))}[scale]
        weights = _softmax(q @ k.transpose(-1, -2) / divisor, mask, axis, masking, zero_nan)
        return weights @ v, weights
    return fn


def attention(fn: Callable) -> Result:
    """Check ``fn(queries [B, T, d_k], keys [B, S, d_k], values [B, S, d_v], mask [B, T, S] or None)`` against
    :func:`attnkit.nn.attend` (scaled dot-product attention): the output [B, T, d_v], and the weights [B, T, S] too
    when ``fn`` returns (output, weights). ``mask`` is True where a query may see a key; a query with no allowed key
    gets zero weights and a zero output."""
    variants = _variants(_attention_variant, {"scale": SCALE, "axis": AXIS, "masking": MASKING, "zero_nan": NAN})
    return _run("attention", "attnkit.nn.attend", fn, _attention_cases(), variants, ("the output", "the weights"))


# --- scores

SCORE_KINDS = ("dot", "scaled_dot", "general", "additive")
TRANSPOSED = {False: None, True: Mistake("transposed", "the scores come out as [batch, keys, queries]: "
                                                       "transposed, the queries belong on dim 1")}


def _score_cases(kind: str) -> list[Case]:
    g = _generator(1)
    axes = ("batch", "query", "key")

    def params(d_q: int, d_k: int) -> tuple:
        if kind == "general":
            return (_randn(g, d_q, d_k, scale=d_q ** -0.5),)
        if kind == "additive":
            h = 12
            return (_randn(g, h, d_q, scale=d_q ** -0.5), _randn(g, h, d_k, scale=d_k ** -0.5), _randn(g, h))
        return ()

    wide = kind in ("general", "additive")  # these compare queries and keys of different sizes
    d_q, d_k = (6, 10) if wide else (16, 16)
    cases = [Case(f"random inputs (2 x 5 queries of size {d_q}, 7 keys of size {d_k})",
                  (_randn(g, 2, 5, d_q), _randn(g, 2, 7, d_k), *params(d_q, d_k)), axes)]
    if wide:
        cases.append(Case("queries and keys of one size (8)", (_randn(g, 2, 3, 8), _randn(g, 2, 4, 8), *params(8, 8)),
                          axes))
    cases.append(Case("a single key (3 x 4 queries, 1 key)",
                      (_randn(g, 3, 4, d_q), _randn(g, 3, 1, d_k), *params(d_q, d_k)), axes))
    cases.append(Case("a batch of one (1 query, 6 keys)",
                      (_randn(g, 1, 1, d_q), _randn(g, 1, 6, d_k), *params(d_q, d_k)), axes))
    cases.append(Case("a long sequence (1 x 64 queries, 1024 keys)",
                      (_randn(g, 1, 64, d_q), _randn(g, 1, 1024, d_k), *params(d_q, d_k)), axes))
    return cases


def _reference_general(q, k, w):
    with torch.random.fork_rng(devices=[]):  # the module's initialisation must not move the global random state
        score = GeneralScore(q.size(-1), k.size(-1))
    score.weight.weight.copy_(w)
    return score(q, k)


def _reference_additive(q, k, w_q, w_k, v):
    with torch.random.fork_rng(devices=[]):
        score = AdditiveScore(q.size(-1), k.size(-1), w_q.size(0))
    score.query_proj.weight.copy_(w_q)
    score.key_proj.weight.copy_(w_k)
    score.key_proj.bias.zero_()
    score.v.weight.copy_(v[None])
    return score(q, k)


def _dot_variant(scale: str, transposed: bool):
    def fn(q, k):
        if not transposed and scale == "none":
            return dot_score(q, k)
        if not transposed and scale == "sqrt_d":
            return scaled_dot_score(q, k)
        e = (k @ q.transpose(-1, -2)) if transposed else q @ k.transpose(-1, -2)
        return e / {"none": 1.0, "sqrt_d": math.sqrt(k.size(-1)), "d": float(k.size(-1))}[scale]
    return fn


def _general_variant(w_transposed: bool, scaled: bool, transposed: bool):
    def fn(q, k, w):
        if not (w_transposed or scaled or transposed):
            return _reference_general(q, k, w)
        w = w.T if w_transposed else w
        e = (k @ (q @ w).transpose(-1, -2)) if transposed else (q @ w) @ k.transpose(-1, -2)
        return e / math.sqrt(k.size(-1)) if scaled else e
    return fn


def _additive_variant(squash: str, swapped: bool, transposed: bool):
    def fn(q, k, w_q, w_k, v):
        if (squash, swapped, transposed) == ("tanh", False, False):
            return _reference_additive(q, k, w_q, w_k, v)
        a, b = (w_k, w_q) if swapped else (w_q, w_k)
        hidden = (q @ a.T).unsqueeze(2) + (k @ b.T).unsqueeze(1)  # [B, T, S, h]
        if squash == "tanh":
            e = torch.tanh(hidden) @ v
        elif squash == "none":
            e = hidden @ v
        elif squash == "v_first":
            e = torch.tanh(hidden @ v)
        else:  # "sum": v left out
            e = torch.tanh(hidden).sum(-1)
        return e.transpose(-1, -2) if transposed else e
    return fn


def scores(fn: Callable, kind: str = "scaled_dot") -> Result:
    """Check a score function f_att against attnkit's, by ``kind``:

    - ``"dot"``: ``fn(queries [B, T, d], keys [B, S, d])`` -> ``q . k`` [B, T, S] (:func:`attnkit.nn.dot_score`);
    - ``"scaled_dot"``: the same divided by sqrt(d) (:func:`attnkit.nn.scaled_dot_score`);
    - ``"general"``: ``fn(queries [B, T, d_q], keys [B, S, d_k], W [d_q, d_k])`` -> ``q W k^T``
      (:class:`attnkit.nn.GeneralScore`, Luong);
    - ``"additive"``: ``fn(queries, keys, W_q [h, d_q], W_k [h, d_k], v [h])`` -> ``v^T tanh(W_q q + W_k k)``
      (:class:`attnkit.nn.AdditiveScore`, Bahdanau; no bias).
    """
    if kind not in SCORE_KINDS:
        raise ValueError(f"attnkit.check.scores: kind={kind!r}; one of {', '.join(SCORE_KINDS)}")
    no_scale = Mistake("no_scaling", "the scores are not divided by sqrt(d) (no 1/sqrt(d) scaling)")
    if kind == "dot":
        scale = {"none": None, "sqrt_d": Mistake("scaled", "the scores are divided by sqrt(d): that is the scaled "
                                                           "dot product, the plain one is q . k")}
        variants = _variants(_dot_variant, {"scale": scale, "transposed": TRANSPOSED})
        name = "attnkit.nn.dot_score"
    elif kind == "scaled_dot":
        scale = {"sqrt_d": None, "none": no_scale,
                 "d": Mistake("scaled_by_d", "the scores are divided by d, not by its square root")}
        variants = _variants(_dot_variant, {"scale": scale, "transposed": TRANSPOSED})
        name = "attnkit.nn.scaled_dot_score"
    elif kind == "general":
        w_transposed = {False: None, True: Mistake("w_transposed", "W is applied transposed: the score is "
                                                                   "q W k^T with W [d_q, d_k]")}
        scaled = {False: None, True: Mistake("scaled", "the scores are divided by sqrt(d): Luong's general score "
                                                       "is not scaled")}
        variants = _variants(_general_variant, {"w_transposed": w_transposed, "scaled": scaled,
                                                "transposed": TRANSPOSED})
        name = "attnkit.nn.GeneralScore"
    else:
        squash = {"tanh": None,
                  "none": Mistake("no_tanh", "there is no tanh: without it the score is a query part plus a key part, "
                                             "and the softmax over the keys ignores the query"),
                  "v_first": Mistake("tanh_after_v", "the tanh comes after v: the score is v^T tanh(W_q q + W_k k)"),
                  "sum": Mistake("no_v", "v is left out (the hidden units are summed)")}
        swapped = {False: None, True: Mistake("swapped", "W_q and W_k are swapped: W_q projects the queries")}
        variants = _variants(_additive_variant, {"squash": squash, "swapped": swapped, "transposed": TRANSPOSED})
        name = "attnkit.nn.AdditiveScore"
    return _run(f"{kind} score", name, fn, _score_cases(kind), variants, ("the scores",))


# --- masked softmax


def _masked_softmax_cases() -> list[Case]:
    g = _generator(2)
    axes = ("batch", "query", "key")
    cases = [Case("random scores and a padding mask (2 x 5 queries, 7 keys)",
                  (_randn(g, 2, 5, 7, scale=2.0), _random_mask(g, 2, 5, 7)), axes)]
    mask = _random_mask(g, 2, 4, 6)
    mask[0, 3] = False
    cases.append(Case("a fully masked row (mask[0, 3] all False)", (_randn(g, 2, 4, 6, scale=2.0), mask), axes))
    cases.append(Case("a single key (3 x 4 queries, 1 key)",
                      (_randn(g, 3, 4, 1), torch.ones(3, 4, 1, dtype=torch.bool)), axes))
    cases.append(Case("a batch of one (1 query, 5 keys)", (_randn(g, 1, 1, 5), _random_mask(g, 1, 1, 5)), axes))
    cases.append(Case("a long sequence with large scores (4 queries, 2048 keys, scores of size about 100)",
                      (_randn(g, 1, 4, 2048, scale=100.0), _random_mask(g, 1, 4, 2048)), axes))
    return cases


OVERFLOW = Mistake("overflow", "exp() of large scores overflows to inf and the weights to NaN: subtract each row's "
                               "maximum first, or call torch.softmax")


def _masked_softmax_variant(axis: int, masking: str, zero_nan: bool):
    if not zero_nan and masking not in ("before", "inverted"):
        return None

    def fn(scores, mask):
        if (axis, masking, zero_nan) == (-1, "before", True):
            return reference_masked_softmax(scores, mask)
        return _softmax(scores, mask, axis, masking, zero_nan)
    return fn


def _naive_masked_softmax(zero_nan: bool):
    """exp, zero where masked, normalise: overflows for large scores, and 0 / 0 where nothing is allowed."""
    def fn(scores, mask):
        e = scores.exp() * mask
        weights = e / e.sum(dim=-1, keepdim=True)
        return weights.nan_to_num(0.0) if zero_nan else weights
    return fn


def masked_softmax(fn: Callable) -> Result:
    """Check ``fn(scores [B, T, S], mask [B, T, S])`` (True = allowed) against :func:`attnkit.nn.masked_softmax`:
    a softmax over the keys that gives masked keys no weight, and a row with nothing allowed all-zero weights."""
    variants = _variants(_masked_softmax_variant, {"axis": AXIS, "masking": MASKING, "zero_nan": NAN})
    variants += [Variant((OVERFLOW,), _naive_masked_softmax(True)),
                 Variant((OVERFLOW, NAN[False]), _naive_masked_softmax(False))]
    return _run("masked softmax", "attnkit.nn.masked_softmax", fn, _masked_softmax_cases(), variants, ("the weights",))


# --- multi-head attention


def _reference_multi_head(queries, keys, values, w_q, w_k, w_v, w_o, n_heads):
    """attnkit's own pieces: projections, heads split as :class:`attnkit.nn.MultiHeadAttention` splits them,
    :func:`attnkit.nn.reference_attention` in every head, the heads concatenated and projected by W^O."""
    b, t, d = queries.shape

    def split(x: Tensor) -> Tensor:  # MultiHeadAttention.split_heads
        return x.view(x.size(0), x.size(1), n_heads, d // n_heads).transpose(1, 2)

    q, k, v = split(F.linear(queries, w_q)), split(F.linear(keys, w_k)), split(F.linear(values, w_v))
    out, _ = reference_attention(q, k, v)
    return F.linear(out.transpose(1, 2).reshape(b, t, d), w_o)


SPLIT = {
    "heads": None,
    "interleaved": Mistake("heads_split_order", "the heads are split in the wrong order: viewing [B, T, D] as "
                                                "[B, T, d_head, H] gives each head every H-th feature, not a "
                                                "contiguous slice of d_head features ([B, T, H, d_head], then "
                                                "transpose to [B, H, T, d_head])"),
    "no_transpose": Mistake("heads_split_no_transpose", "the heads are split without the transpose: viewing "
                                                        "[B, T, D] straight as [B, H, T, d_head] mixes positions "
                                                        "(view as [B, T, H, d_head], then transpose(1, 2))"),
}
MERGE = {
    "heads": None,
    "interleaved": Mistake("heads_merged_order", "the heads are concatenated in the wrong order (each head's "
                                                 "features belong side by side: transpose to [B, T, H, d_head], "
                                                 "then reshape)"),
    "no_transpose": Mistake("heads_merged_no_transpose", "the heads are concatenated without the transpose back: "
                                                         "[B, H, T, d_head] reshaped straight to [B, T, D] mixes "
                                                         "positions"),
}


def _multi_head_variant(split: str, merge: str, scale: str, layout: bool, out_proj: bool, axis: int):
    def fn(queries, keys, values, w_q, w_k, w_v, w_o, n_heads):
        if (split, merge, scale, layout, out_proj, axis) == ("heads", "heads", "sqrt_dh", True, True, -1):
            return _reference_multi_head(queries, keys, values, w_q, w_k, w_v, w_o, n_heads)
        d = queries.size(-1)
        dh = d // n_heads

        def project(x, w):
            return x @ w.T if layout else x @ w

        def cut(x):
            b, n, _ = x.shape
            if split == "heads":
                return x.view(b, n, n_heads, dh).transpose(1, 2)
            if split == "interleaved":
                return x.view(b, n, dh, n_heads).permute(0, 3, 1, 2)
            return x.reshape(b, n_heads, n, dh)

        q, k, v = cut(project(queries, w_q)), cut(project(keys, w_k)), cut(project(values, w_v))
        divisor = {"sqrt_dh": math.sqrt(dh), "sqrt_d": math.sqrt(d), "none": 1.0}[scale]
        out = torch.softmax(q @ k.transpose(-1, -2) / divisor, dim=axis) @ v  # [B, H, T, dh]
        b, _, t, _ = out.shape
        if merge == "heads":
            out = out.transpose(1, 2).reshape(b, t, d)
        elif merge == "interleaved":
            out = out.permute(0, 2, 3, 1).reshape(b, t, d)
        else:
            out = out.reshape(b, t, d)
        return project(out, w_o) if out_proj else out
    return fn


def _multi_head_cases() -> list[Case]:
    g = _generator(3)
    axes = ("batch", "query")

    def weights(d: int) -> tuple:
        return tuple(_randn(g, d, d, scale=d ** -0.5) for _ in range(4))

    def case(description, b, t, s, d, h):
        x = _randn(g, b, t, d)
        memory = _randn(g, b, s, d)
        return Case(description, (x, memory, _randn(g, b, s, d), *weights(d), h), axes)

    return [case("random inputs (2 x 5 queries, 7 keys and values, d_model 32, 4 heads)", 2, 5, 7, 32, 4),
            case("a single head (2 x 3 queries, 4 keys, d_model 8)", 2, 3, 4, 8, 1),
            case("a single key (2 x 4 queries, 1 key, d_model 24, 3 heads)", 2, 4, 1, 24, 3),
            case("a batch of one (1 query, 6 keys, d_model 16, 2 heads)", 1, 1, 6, 16, 2),
            case("a long sequence (1 x 256 queries and keys, d_model 64, 8 heads)", 1, 256, 256, 64, 8)]


def multi_head(fn: Callable) -> Result:
    """Check ``fn(queries [B, T, D], keys [B, S, D], values [B, S, D], W_q, W_k, W_v, W_o, n_heads)`` -> [B, T, D]
    against attnkit's multi-head attention (:class:`attnkit.nn.MultiHeadAttention` without biases):
    ``Concat(head_1..head_h) W_o^T`` with ``head_i = Attention(Q_i, K_i, V_i)``, ``Q = queries @ W_q.T`` cut into
    n_heads contiguous slices of D / n_heads features, and scaled dot-product attention in each."""
    options = {
        "split": SPLIT, "merge": MERGE,
        "scale": {"sqrt_dh": None,
                  "sqrt_d": Mistake("scaled_by_d_model", "the scores are divided by sqrt(d_model), not "
                                                         "sqrt(d_head), the size of one head's keys"),
                  "none": Mistake("no_scaling", "the scores are not divided by sqrt(d_head) "
                                                "(no 1/sqrt(d) scaling)")},
        "layout": {True: None, False: Mistake("weights_transposed", "the projections compute x @ W, but the weights "
                                                                    "are nn.Linear's [out, in]: x @ W.T")},
        "out_proj": {True: None, False: Mistake("no_output_projection", "the output projection W_o is missing")},
        "axis": AXIS,
    }
    return _run("multi-head attention", "attnkit.nn.MultiHeadAttention", fn, _multi_head_cases(),
                _variants(_multi_head_variant, options), ("the output",))


# --- positional encoding


def _positional_variant(layout: str, swapped: bool, exponent: str, first: int):
    def fn(n, d):
        if (layout, swapped, exponent, first) == ("interleaved", False, "pair", 0):
            return sinusoidal_table(n, d)
        pos = torch.arange(first, first + n, dtype=torch.float64)[:, None]
        two_i = torch.arange(0, d, 2, dtype=torch.float64)
        power = {"pair": two_i, "column": two_i, "double": 2 * two_i}[exponent]
        sines = torch.sin(pos / 10000.0 ** (power / d))
        cos_power = two_i + 1 if exponent == "column" else power
        cosines = torch.cos(pos / 10000.0 ** (cos_power / d))
        if swapped:
            sines, cosines = cosines, sines
        table = torch.zeros(n, d, dtype=torch.float64)
        if layout == "interleaved":
            table[:, 0::2], table[:, 1::2] = sines, cosines[:, : d // 2]
        else:
            table[:, : sines.size(1)], table[:, sines.size(1):] = sines, cosines[:, : d // 2]
        return table.float()
    return fn


def positional_encoding(fn: Callable) -> Result:
    """Check ``fn(n_positions, d_model)`` -> [n_positions, d_model] against :func:`attnkit.nn.sinusoidal_table`:
    ``PE(pos, 2i) = sin(pos / 10000^(2i/d_model))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))``, positions
    from 0."""
    axes = ("position", "column")
    cases = [Case("50 positions, d_model 16", (50, 16), axes), Case("a single position, d_model 4", (1, 4), axes),
             Case("10 positions, d_model 2", (10, 2), axes), Case("a long table (2048 positions, d_model 512)",
                                                                  (2048, 512), axes)]
    options = {
        "layout": {"interleaved": None,
                   "halves": Mistake("halves", "the sines fill the first half of the columns and the cosines the "
                                               "second; the paper interleaves them (sines in even columns, cosines "
                                               "in odd ones)")},
        "swapped": {False: None, True: Mistake("sin_cos_swapped", "sine and cosine are swapped: even columns hold "
                                                                  "sines, odd columns cosines")},
        "exponent": {"pair": None,
                     "column": Mistake("cos_exponent", "the cosine in column 2i+1 uses the exponent (2i+1)/d_model; it "
                                                       "shares its sine's frequency, 10000^(2i/d_model)"),
                     "double": Mistake("exponent_doubled", "the exponent counts the columns twice: column 2i gets "
                                                           "10000^(4i/d_model), not 10000^(2i/d_model) (2i is "
                                                           "already the column)")},
        "first": {0: None, 1: Mistake("positions_from_1", "the positions start at 1; the first position is 0")},
    }

    # float32 sines of angles up to 2047 agree to a few 1e-4, however they are computed
    return _run("positional encoding", "attnkit.nn.sinusoidal_table", fn, cases,
                _variants(_positional_variant, options), ("the table",), atol=2e-3)


# --- causal mask


def _causal_variant(shape: str):
    def fn(t, s=None):
        s = t if s is None else s
        if shape == "tril":
            return reference_causal_mask(t, s)
        ones = torch.ones(t, s, dtype=torch.bool)
        return {"inverted": ones.triu(s - t + 1), "strict": ones.tril(s - t - 1), "upper": ones.triu(s - t),
                "start": ones.tril(0)}[shape]
    return fn


def causal_mask(fn: Callable) -> Result:
    """Check ``fn(t)`` -> [t, t] booleans (True where query i may see key j, j <= i) against
    :func:`attnkit.nn.causal_mask`; when ``fn`` takes a second argument, ``fn(t, s)`` -> [t, s] too, the t queries
    being the last t of the s positions (a decoder with s - t cached positions before them)."""
    axes = ("query", "key")
    try:
        two = len([p for p in inspect.signature(fn).parameters.values()
                   if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]) >= 2
    except (TypeError, ValueError):
        two = False
    cases = [Case(description, (t, t) if two else (t,), axes)
             for description, t in (("5 positions", 5), ("a single position", 1), ("a long sequence (512 positions)",
                                                                                   512))]
    if two:
        cases += [Case("3 queries after 4 cached positions (t 3, s 7)", (3, 7), axes),
                  Case("one query after 5 cached positions (t 1, s 6)", (1, 6), axes)]
    shapes = {"tril": None,
              "inverted": Mistake("mask_inverted", "the mask is True at the future keys, the ones to hide; attnkit's "
                                                   "masks are True where attention is allowed"),
              "strict": Mistake("no_diagonal", "a position may not see itself: the diagonal belongs to the mask "
                                               "(j <= i)"),
              "upper": Mistake("future", "each position sees the future, not the past (upper triangle)"),
              "start": Mistake("aligned_at_start", "with s > t keys the queries are taken as the first t positions; "
                                                   "they are the last t (query i sees keys j <= i + s - t)")}
    variants = [Variant(() if m is None else (m,), _causal_variant(k)) for k, m in shapes.items()]

    def not_boolean(learner_name, cases_, got, raised):
        """A float mask, additive (0 and -inf) or of ones and zeros, that is right but for its dtype."""
        for case, out in zip(cases_, got):
            if out is None:
                continue
            out = _as_tensor(out)
            if out.dtype == torch.bool:
                continue
            ref = reference_causal_mask(*case.args)
            if tuple(out.shape) == tuple(ref.shape) and out.is_floating_point():
                if bool((out == torch.where(ref, 0.0, float("-inf"))).all()):
                    return Result(False, f"{learner_name} returns an additive float mask (0 where allowed, -inf "
                                         f"where hidden); attnkit's masks are booleans, True where attention is "
                                         f"allowed: return the mask before turning it into -inf.", ("additive",))
            if tuple(out.shape) == tuple(ref.shape) and bool((out == ref.to(out.dtype)).all()):
                return Result(False, f"{learner_name} has the right pattern but as {out.dtype} ones and zeros; "
                                     f"attnkit's masks are booleans (~mask and masked_fill need them): add "
                                     f".bool().", ("not_boolean",))
        return None

    return _run("causal mask", "attnkit.nn.causal_mask", fn, cases, variants, ("the mask",), (True,), not_boolean)


# --- a beam search step


def _reference_beam_step(scores, log_probs, k):
    from attnkit.decode.search import top_extensions

    totals, flat = top_extensions(scores, log_probs, k)
    v = log_probs.size(-1)
    return totals, flat // v, flat % v


def _beam_variant(kind: str):
    def fn(scores, log_probs, k):
        if kind == "reference":
            return _reference_beam_step(scores, log_probs, k)
        b, beams, v = log_probs.shape
        if kind == "per_beam":  # each beam's own best token, beams kept in their order
            best, token = log_probs.max(-1)
            return scores + best, torch.arange(beams).expand(b, beams), token
        if kind == "no_score":
            totals, flat = log_probs.reshape(b, -1).topk(k, dim=1)
            return totals, flat // v, flat % v
        if kind == "no_score_added":
            totals, flat = (scores[:, :, None] + log_probs).reshape(b, -1).topk(k, dim=1)
            return log_probs.reshape(b, -1).gather(1, flat), flat // v, flat % v
        if kind == "multiply":
            totals, flat = (scores[:, :, None] * log_probs).reshape(b, -1).topk(k, dim=1)
            return totals, flat // v, flat % v
        totals, flat = (scores[:, :, None] + log_probs).reshape(b, -1).topk(k, dim=1, largest=kind != "smallest")
        if kind == "divisor":
            return totals, flat // beams, flat % beams
        if kind == "swapped":
            return totals, flat % v, flat // v
        return totals, flat // v, flat % v
    return fn


def _beam_cases() -> list[Case]:
    g = _generator(4)
    axes = ("sentence", "rank")

    def case(description, b, beams, v, k, dead=()):
        scores = (-1.0 - _randn(g, b, beams).abs()).sort(dim=1, descending=True).values
        for row, beam in dead:
            scores[row, beam] = float("-inf")
        return Case(description, (scores, torch.log_softmax(_randn(g, b, beams, v, scale=2.0), -1), k), axes)

    return [case("random beams (2 sentences x 3 beams, vocabulary 11, k 3)", 2, 3, 11, 3),
            case("the first step (1 beam per sentence, k 4)", 2, 1, 9, 4),
            case("a batch of one (1 sentence x 2 beams, k 2)", 1, 2, 7, 2),
            case("dead beams (scores of -inf in beams 1 and 2 of sentence 0)", 2, 3, 8, 3, dead=((0, 1), (0, 2))),
            case("k 1 (greedy: 3 sentences x 1 beam)", 3, 1, 10, 1),
            case("a long vocabulary (4 sentences x 5 beams, vocabulary 5000)", 4, 5, 5000, 5)]


def beam_search_step(fn: Callable) -> Result:
    """Check ``fn(scores [B, K], log_probs [B, K, V], k)`` -> (scores [B, k], beams [B, k], tokens [B, k]) against
    attnkit's beam search ranking (:func:`attnkit.decode.search.top_extensions`): of the K x V one-token extensions
    of each sentence's beams, the k with the largest ``score of the beam + log-probability of the token``, best
    first: their new scores, the beam each extends and its token."""
    variants = [Variant((), _beam_variant("reference"))] + [
        Variant((Mistake(kind, text),), _beam_variant(kind)) for kind, text in (
            ("per_beam", "each beam is extended by its own best token (k greedy searches side by side) rather than "
                         "keeping the k best extensions over all beams"),
            ("no_score", "the extensions are ranked by the token's log-probability alone: add the beam's score"),
            ("no_score_added", "the new scores are the tokens' log-probabilities; they are the beam's score plus "
                               "the token's log-probability"),
            ("multiply", "the beam's score and the token's log-probability are multiplied; log-probabilities add"),
            ("smallest", "the k lowest-scoring extensions are kept, not the k highest"),
            ("divisor", "the flat index is split with the number of beams; beam = index // V and token = index % V, "
                        "V the vocabulary size"),
            ("swapped", "beam and token are swapped: beam = index // V, token = index % V"))]

    def unsorted(learner_name, cases, got, raised):
        """The right k extensions in another order."""
        if raised:
            return None
        for case, out in zip(cases, got):
            try:
                s, b, t = (_as_tensor(x) for x in out)
                rs, rb, rt = _reference_beam_step(*case.args)
                if s.shape != rs.shape or b.shape != rb.shape:
                    return None
                mine = [sorted(zip(b[i].tolist(), t[i].tolist())) for i in range(len(b))]
                theirs = [sorted(zip(rb[i].tolist(), rt[i].tolist())) for i in range(len(rb))]
            except (TypeError, ValueError, RuntimeError):
                return None
            if mine != theirs:
                return None
        if all(_same(out, list(_reference_beam_step(*c.args)), ("the scores", "the beams", "the tokens"), c,
                     (False, True, True)) is None for c, out in zip(cases, got)):
            return None
        return Result(False, f"{learner_name} finds the right k extensions but does not return them best first "
                             f"(sort by the new score, descending: topk does).", ("unsorted",))

    return _run("beam search step", "attnkit's beam search ranking (top_extensions)", fn, _beam_cases(), variants,
                ("the scores", "the beams", "the tokens"), (False, True, True), unsorted)


__all__ = ["Result", "attention", "beam_search_step", "causal_mask", "masked_softmax", "multi_head",
           "positional_encoding", "scores"]
