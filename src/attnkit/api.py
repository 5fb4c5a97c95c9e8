"""Trained models from Python in one line: ``attnkit.load(path)``.

    >>> import attnkit
    >>> model = attnkit.load("runs/multi30k_en_de")       # a run directory or a checkpoint directory
    >>> model.translate(["A dog runs in the park."], beam=5)
    >>> att = model.attention("A dog runs.")              # every attention tensor of one example
    >>> att.cross[0].shape                                # [heads, target, source] of the first decoder layer

A fine-tuned BERT classifier (or regressor) classifies sentences and sentence pairs:

    >>> clf = attnkit.load("runs/glue_sst2")
    >>> clf.classify(["a gorgeous film", "a tedious mess"])  # Classification(label, probabilities, score) each

The object :func:`load` returns offers what the checkpoint's family can do (``model.capabilities``): translate,
generate, caption, score, attention, align, classify; asking for anything else is a one-line error. Loading
imports the model families, tokenizers and decoding, never the training stack.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import Tensor

from attnkit import registry
from attnkit.checkpoint import load_checkpoint
from attnkit.errors import AttnkitError
from attnkit.tokens import BOS, EOS, PAD

ATTENTION_KINDS = ("encoder", "decoder", "cross")


@dataclass
class Attention:
    """Every attention of one example, per layer, each [heads, queries, keys] (the batch dimension dropped).

    ``source`` and ``target`` are the tokens on the axes (``target`` starts with BOS: row t is the attention while
    predicting the t-th output token). ``encoder``: source over source; ``decoder``: target over target so far
    (a language model's only attention); ``cross``: target over source (one layer of one head for RNNsearch and
    Show-Attend-Tell).

    ``text`` is the target as text (the given one, or the model's own output) and ``score`` its log-probability
    (summed over its tokens and EOS), both under the interventions :meth:`Model.attention` was asked for.
    """

    source: list[str]
    target: list[str]
    encoder: list[Tensor] = field(default_factory=list)
    decoder: list[Tensor] = field(default_factory=list)
    cross: list[Tensor] = field(default_factory=list)
    text: str | None = None
    score: float | None = None


class Model:
    """A trained model with its tokenizers and decoding settings (from the checkpoint's config).

    ``model.module`` is the ``torch.nn.Module`` (in eval mode), ``model.config`` the experiment config, ``model.path``
    the checkpoint directory. Decoding runs the fast runtime's decoder (same results as the core's, less work);
    :meth:`compile` compiles it. A classifier decodes nothing: its ``decoder`` is None and its ``tokenizers`` is
    one WordPiece tokenizer.
    """

    def __init__(self, module, config, tokenizers, path: Path, precision: str = "fp32", compile: bool | None = None,
                 shortlist: bool | str | Path = False):
        from attnkit import fast
        from attnkit.models.contract import GenerativeModel

        self.module, self.config, self.tokenizers, self.path = module, config, tokenizers, Path(path)
        self.precision = precision
        # the vocabulary map whose shortlists translation scores (None: the whole vocabulary)
        self.vocabulary_map = None if shortlist is False else self._vocabulary_map(shortlist)
        self.generative = isinstance(module, GenerativeModel)
        # the module's own decoder (fp32, eager, over the module itself, which interventions reach) draws the
        # attention; what translates may be a copy, at a lower precision or compiled
        self.own_decoder = fast.decoder(module) if self.generative else None
        self._decoder = self.own_decoder if precision == "fp32" or not self.generative else \
            fast.decoder(module, precision=precision)
        # compiled when first asked to decode (True), never (False), or by default (None) at the first translation
        # job large enough to repay it; never on loading: a model loaded to draw its attention compiles nothing
        self._compile = compile if self.generative else False
        # what classifies: a copy with the fast runtime's attention, at the precision asked for (the module itself,
        # the core's, draws the attention and the explanations)
        self.classifier = None if self.generative else fast.classifier(module, precision)
        self._image_encoder = None  # an image kind's CNN, loaded on first use

    @property
    def family(self) -> str:
        return self.config.model.family

    @property
    def kind(self):
        """What the model reads: its family's input kind (:mod:`attnkit.kinds`), which knows how to read, encode,
        label and limit one input."""
        return registry.kind_of(self.family)

    @property
    def capabilities(self) -> frozenset[str]:
        return self.module.capabilities

    def __repr__(self) -> str:
        return f"<attnkit {self.family} model from {self.path} ({', '.join(sorted(self.capabilities))})>"

    def require(self, capability: str) -> None:
        """A one-line error unless this model's family can ``capability``."""
        if capability not in self.capabilities:
            can = ", ".join(sorted(self.capabilities)) or "nothing"
            raise AttnkitError(f"{self.path}: a {self.family} model cannot {capability} (it can: {can})")

    @property
    def problem(self) -> str | None:
        """A classifier's problem: "classification" (it names a label) or "regression" (it predicts a score); None
        for a model that decodes."""
        return getattr(self.module, "problem", None)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Each text's tokens as ``decode.max_source_tokens`` counts them (a translation model's source subwords, a
        language model's tokens), past which translating, aligning and generating refuse it: a face reading a file
        counts with this to name the file and line of a text too long."""
        tokenizer = getattr(self.tokenizers, "src", self.tokenizers)
        return [len(ids) for ids in tokenizer.encode(list(texts))]

    def compiles_by_default(self, sentences: int | None = None) -> bool:
        """Whether a job of ``sentences`` sentences (None: a server's) repays compiling this model's decoding
        (:func:`attnkit.fast.compiles_by_default`), for a face that starts compiling (:meth:`compile`) itself."""
        from attnkit.fast import compiles_by_default

        return self.compiles and compiles_by_default(self.module, sentences)

    @property
    def takes_pairs(self) -> bool:
        """A classifier's inputs: sentence pairs (it was trained on MRPC, STS-B or a file with a second text
        column) or single sentences."""
        return registry.reads_pairs(self.config)

    @property
    def decoder(self):
        """The decoder that translates, generates and captions (the fast runtime's, see :func:`attnkit.fast.decoder`;
        None for a classifier), compiled on this first use if the model was loaded with ``compile=True``."""
        if self._compile:
            self.compile()
        return self._decoder

    def compile(self, freeze: bool = True, cache: bool = True, beams: tuple[int, ...] = (),
                background: bool = False) -> Model:
        """Compile the decoding steps and the encoder ahead of time (a minute or so the first time, then faster; see
        docs/performance.md): the Transformer families, whose decoding state is a flat list of tensors
        (:attr:`compiles`); with ``cache`` the packages are kept in the user's cache and loaded from there by the
        next process that compiles this model (:func:`~attnkit.fast.compile_step`).

        ``beams``: a translation model's beam sizes whose graphs are built now (:meth:`warm_up`); the decoder is then
        sealed, so that another beam size decodes eagerly rather than wait for a compiler. ``background``: all of
        it in a thread while this model goes on decoding eagerly; the compiled decoder, its steps checked against
        the eager ones on the first real batches, takes over when it is ready (:attr:`compiling` is the thread
        until then; a server answers at once instead of after minutes on a cold cache). Returns self."""
        import threading

        from attnkit import fast

        if not self.compiles:
            raise AttnkitError(f"{self.path}: a {self.family} model has no steps that compile ahead of time (only "
                               "the Transformer families' decoding state is a flat list of tensors); it decodes "
                               "eagerly")
        self._compile = False

        def build() -> None:
            decoder = fast.decoder(self.module, compile=True, precision=self.precision, freeze=freeze, cache=cache)
            if beams:
                self.warm_up(decoder, beams)
            self._decoder = decoder  # one assignment: a batch decodes with the old decoder or the new, whole

        def build_or_stay_eager() -> None:
            try:
                build()
            except Exception as e:  # noqa: BLE001 - whatever the compiler raised, the eager decoder goes on serving
                self.compile_error = e
                logging.getLogger("attnkit").warning("%s: compiling failed, decoding stays eager: %s: %s",
                                                     self.path, type(e).__name__, " ".join(str(e).split())[:300])

        if background:
            self.compiling = threading.Thread(target=build_or_stay_eager, name=f"attnkit-compile-{self.path.name}",
                                              daemon=True)
            self.compiling.start()
        else:
            build()
        return self

    @property
    def compiles(self) -> bool:
        """Whether :meth:`compile` has steps to compile: a generative model on the CPU whose fast decoder's state is a
        flat list of tensors (the Transformer families)."""
        from attnkit.models.contract import device_of

        return self.generative and self.own_decoder.grouped and device_of(self.module).type == "cpu"

    compiling = None  # the thread compiling this model's decoder in the background, while it does
    compile_error = None  # what stopped a background compile (the model then decodes eagerly)

    def warm_up(self, decoder, beams: tuple[int, ...]) -> list[int]:
        """Translate one sentence and two (and, where the decoder has graphs of their own for wide batches, that
        many) with ``decoder`` at each of ``beams``, so that a compiled decoder has its graphs (compiled, or loaded
        from the cache; one sentence and several are graphs apart) before the first real request; then seal it.
        -> the beam sizes warmed (none for a model that does not translate)."""
        from attnkit.decode import translate

        if "translate" not in self.capabilities:
            return []
        d = self.config.decode
        for beam in sorted(set(beams)):
            wide = getattr(decoder, "wide_sentences", None)
            for sentences in (["a a"], ["a", "a a a"]) + (([" ".join(["a"] * (1 + i % 3)) for i in range(wide)],)
                                                         if wide else ()):
                translate(decoder, self.tokenizers, sentences, beam_size=beam, len_penalty=d.len_penalty,
                          max_len_a=d.max_len_a, max_len_b=d.max_len_b, shortlist=self.vocabulary_map)
        if hasattr(decoder, "seal"):
            decoder.seal()
        return sorted(set(beams))

    def _vocabulary_map(self, shortlist: bool | str | Path):
        """The vocabulary map at ``shortlist`` (a path), or with True ``vmap.txt`` beside the checkpoint, else in its
        run directory (where ``attnkit shortlist`` writes it)."""
        from attnkit.data.shortlist import VocabularyMap
        from attnkit.models.transformer import EncoderDecoder

        self.require("translate")
        if not self.kind.source_vocabulary or not isinstance(self.module, EncoderDecoder):
            raise AttnkitError(f"shortlist: a {self.family} model's decoder has no vocabulary shortlist (a Transformer "
                               "translation model's has)")
        if shortlist is True:
            places = [self.path / "vmap.txt", self.path.parent.parent / "vmap.txt"]
            found = next((p for p in places if p.is_file()), None)
            if found is None:
                raise AttnkitError(f"shortlist: no vmap.txt beside {self.path} or in its run directory (make one "
                                   "with attnkit shortlist RUN, or give its path)")
            shortlist = found
        return VocabularyMap.read(shortlist, self.tokenizers.src, self.tokenizers.tgt)

    # --- what a family can do

    def translate(self, sentences: str | list[str], beam: int | None = None, len_penalty: float | None = None,
                  n_best: int = 1, batch_tokens: int = 4000, details: bool = False, on_step=None, **sampling):
        """Translate one sentence (-> a string) or a list (-> a list of strings). ``beam`` 1 is greedy; ``details``
        returns :class:`~attnkit.decode.Translation` objects (n-best hypotheses with scores); ``sampling``:
        ``temperature``, ``top_k``, ``top_p``, ``seed``; ``need_weights``: the hypotheses carry their attention.

        ``on_step(step, batch)`` streams the search: each step of each batch
        (:class:`~attnkit.decode.search.SearchStep`: the partial hypotheses, their scores, the step's attention),
        ``batch`` the indices of its sentences; an exception it raises stops the search."""
        from attnkit.decode import translate
        from attnkit.fast import compiles_by_default

        self.require("translate")
        one = isinstance(sentences, str)
        self.kind.check(self, [sentences] if one else sentences)
        if self._compile is None and compiles_by_default(self.module, 1 if one else len(sentences)):
            self.compile()
        d = self.config.decode
        penalty = d.len_penalty if len_penalty is None else len_penalty
        if self.vocabulary_map is not None and sampling.get("temperature", 0):
            raise AttnkitError("temperature: a model loaded with a shortlist translates by greedy decoding or beam "
                               "search, not by sampling")
        out = translate(self.decoder, self.tokenizers, [sentences] if one else list(sentences),
                        beam_size=beam or d.beam_size, len_penalty=penalty, n_best=n_best, max_len_a=d.max_len_a,
                        max_len_b=d.max_len_b, batch_tokens=batch_tokens, shortlist=self.vocabulary_map,
                        on_step=on_step, **sampling)
        result = out if details else [t.text[0] if n_best == 1 else t.text for t in out]
        return result[0] if one else result

    def generate(self, prompt: str = "", max_new_tokens: int = 200, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, on_text=None, on_step=None, need_weights: bool = False,
                 details: bool = False):
        """Continue ``prompt`` (a language model): the prompt and its continuation as text (``details``: the
        :class:`~attnkit.decode.Completion`, its hypothesis's tokens and log-probabilities). ``on_text`` receives
        the text piece by piece as it is sampled.

        ``on_step(step, attention)`` watches every step (:class:`~attnkit.decode.search.SearchStep`, and with
        ``need_weights`` the step's causal attention over the text so far), where the prompt and the new tokens fit
        the model's positions in one window (:func:`~attnkit.decode.lm.fits_one_window`); past that the text goes
        on in a sliding window and only ``on_text`` streams."""
        from attnkit.decode import complete
        from attnkit.decode.lm import complete_stepwise, fits_one_window

        self.require("generate")
        self.kind.check(self, [prompt])
        prompt_tokens = len(self.tokenizers.encode([prompt])[0])
        if on_step is not None and fits_one_window(self.module, prompt_tokens, max_new_tokens):
            out = complete_stepwise(self.decoder, self.tokenizers, prompt, max_new_tokens, temperature, top_k, top_p,
                                    seed, need_weights=need_weights, on_step=on_step)
        else:
            out = complete(self.decoder, self.tokenizers, prompt, max_new_tokens, temperature, top_k, top_p, seed,
                           on_text=on_text)
        return out if details else out.text

    def caption(self, images, beam: int | None = None, details: bool = False):
        """Caption image files (a path -> a string, a list -> a list of strings); ``details`` returns
        :class:`~attnkit.decode.Caption` objects whose hypotheses carry the attention over the image grid."""
        from attnkit.decode import caption

        self.require("caption")
        one = isinstance(images, (str, Path))
        grids = self.image_grids([images] if one else list(images))
        d = self.config.decode
        out = caption(self.decoder, self.tokenizers, grids, beam_size=beam or d.beam_size, len_penalty=d.len_penalty,
                      max_len=d.max_caption_len, need_weights=details)
        result = out if details else [c.text[0] for c in out]
        return result[0] if one else result

    def transcribe(self, audio, beam: int | None = None, details: bool = False, on_result=None, on_step=None,
                   ctc_weight: float | None = None):
        """Transcribe speech: an audio file's path (WAV, FLAC, OGG) or a (samples, rate) pair -> a string; a list
        of them -> a list of strings, in order. Other rates are resampled to the model's, stereo is down-mixed;
        bad audio is a one-line error naming the file. ``details`` returns
        :class:`~attnkit.decode.transcribe.Transcript` objects whose hypotheses carry each character's attention
        over the encoder's frames; ``on_result(i, transcript)`` receives each as it is done, in order.

        ``on_step(step, batch)`` streams the search as :meth:`translate`'s does: each step of each batch
        (:class:`~attnkit.decode.search.SearchStep`: the partial transcripts, their scores, the step's attention over
        the encoder's frames, padded to the batch's longest: ``kind.length`` of an input is its own), ``batch`` the
        indices of its inputs; an exception it raises stops the search.

        ``ctc_weight`` (default: the config's ``decode.ctc_weight``): for a model trained with joint CTC, CTC's share
        of the search's scores (:mod:`attnkit.decode.ctc`); 0 decodes with the attention decoder alone."""
        from attnkit.decode.ctc import joint_ctc
        from attnkit.decode.transcribe import transcribe

        self.require("transcribe")
        one = isinstance(audio, (str, Path, bytes)) or (isinstance(audio, tuple) and len(audio) == 2
                                                        and isinstance(audio[1], int))
        items = [audio] if one else list(audio)
        if not items:
            return []
        features = [self.kind.features(self, x) for x in items]
        d = self.config.decode
        decoder = joint_ctc(self.decoder, d.ctc_weight if ctc_weight is None else ctc_weight, str(self.path))
        out = transcribe(decoder, self.tokenizers, features, beam_size=beam or d.beam_size,
                         len_penalty=d.len_penalty, max_len=d.max_caption_len, need_weights=details,
                         on_result=on_result, on_step=on_step)
        result = out if details else [t.text[0] for t in out]
        return result[0] if one else result

    def evaluate_transcripts(self, data, beam: int | None = None,
                             ctc_weight: float | None = None) -> tuple[dict[str, float], list[str]]:
        """Score a speech model on utterances with their transcripts (:class:`attnkit.data.speech.Utterances`, e.g.
        a ``path<TAB>transcript`` list): CER, WER (jiwer, percent) and string accuracy -> (the scores, the
        transcripts they score)."""
        from attnkit.evaluate.speech import speech_scores

        hyps = self.transcribe(list(data.audio), beam=beam, ctc_weight=ctc_weight)
        return speech_scores(hyps, list(data.transcripts)), hyps

    def image_grids(self, paths: list) -> Tensor:
        """The CNN feature grids [N, L, D] a captioner reads, of these image files."""
        return self.kind.grids(self, paths)

    @torch.no_grad()
    def score(self, sources, targets=None) -> list[float]:
        """log p(target | source) of each pair, summed over the target's tokens and EOS. A language model scores
        texts: ``score(["To be or not"])``. A captioner's sources are image files."""
        self.require("score")
        if not self.kind.has_source:
            if targets is not None:
                raise AttnkitError("a language model scores texts: score(texts), without targets")
            sources, targets = None, sources
        if isinstance(targets, str):
            raise AttnkitError("score takes lists: score([source, ...], [target, ...])")
        if sources is not None and len(sources) != len(targets):
            raise AttnkitError(f"score: {len(sources)} sources but {len(targets)} targets")
        if sources is not None:
            self.kind.check(self, sources)
        scores = []
        for i, target in enumerate(targets):
            src = None if sources is None else self.kind.encode(self, sources[i])
            ids = self._target_ids(target)
            tgt_in, tgt_out = torch.tensor([[BOS] + ids]), torch.tensor([ids + [EOS]])
            out = self.module(src, tgt_in, targets=tgt_out)
            scores.append(-float(out.nll))
        return scores

    @torch.no_grad()
    def attention(self, source, target: str | None = None, mask_heads=(), mask_source=()) -> Attention:
        """Every attention tensor of one example: for ``target``, or for the model's own output (its translation,
        caption, or for a language model the text ``source`` itself), with its text and score.

        Interventions (see :meth:`intervene`): ``mask_heads`` [(kind, layer, head), ...] silences heads,
        ``mask_source`` [position, ...] hides source tokens (positions in ``Attention.source``); the model's own
        output is then what the intervened model decodes.

        A classifier's attention is its encoder's over ``source`` (and ``target``, the second sentence of a pair):
        ``Attention.source`` its word pieces, ``text`` the predicted label, ``score`` that label's log-probability
        (a regressor's: its score)."""
        self.require("attention")
        if not self.generative:
            return self._classifier_attention(source, target, mask_heads, mask_source)
        kind = self.kind
        length = kind.length(self, source) if mask_source and kind.has_source else None
        with self.intervene(mask_heads, mask_source, source_length=length):
            if not kind.has_source:
                target = source if target is None else target
                ids = self._target_ids(target)
                src, tgt_in = None, torch.tensor([[BOS] + ids])
                source_tokens = []
            else:
                kind.check(self, [source])
                if target is None:
                    target = kind.own_output(self, source)
                ids = self._target_ids(target)
                src, tgt_in = kind.encode(self, source), torch.tensor([[BOS] + ids])
                source_tokens = kind.positions(self, source)
            out = self.module(src, tgt_in, targets=torch.tensor([ids + [EOS]]), need_weights=True)
        maps = out.attention
        return Attention(source_tokens, ["<s>"] + self._pieces(ids), [w[0] for w in maps.encoder if w is not None],
                         [w[0] for w in maps.decoder if w is not None], [w[0] for w in maps.cross if w is not None],
                         target, -float(out.nll))

    def _classifier_attention(self, text: str, pair: str | None, mask_heads, mask_source) -> Attention:
        from attnkit.data.wordpiece import collate_sentences

        if mask_heads or mask_source:
            raise AttnkitError(f"mask_heads, mask_source: a {self.family} model's attention takes no interventions")
        self._check_pairs(pair is not None)
        ids, types = self.tokenizers.example(text, pair)
        b = collate_sentences([(ids, types)], self.tokenizers.pad_id)
        out = self.module(b.tokens, b.padding_mask, b.token_types, need_weights=True)
        logits = out.logits[0].float()
        if self.module.problem == "regression":
            label, score = self.module.labels[0], float(logits[0])
        else:
            k = int(logits.argmax())
            label, score = self.module.labels[k], float(logits.log_softmax(-1)[k])
        return Attention(self.tokenizers.id_to_piece(ids), [], [w[0] for w in out.attention.self_attention],
                         text=label, score=score)

    def attention_modules(self) -> dict[str, list]:
        """The multi-head attention modules of each kind ("encoder", "decoder", "cross"), one per layer, as
        :meth:`attention` lists their weights (empty where the family has none: RNNs, convolutions)."""
        from attnkit.nn.attention import MultiHeadAttention

        def of(layers, name):
            found = [getattr(layer, name, None) for layer in (layers or [])]
            return found if found and all(isinstance(m, MultiHeadAttention) for m in found) else []

        m = self.module
        if not self.kind.has_source:
            return {"encoder": [], "decoder": of(m.layers, "self_attn"), "cross": []}
        decoder = getattr(m, "decoder", None)
        decoder = decoder if isinstance(decoder, torch.nn.ModuleList) else None
        return {"encoder": of(getattr(m, "encoder", None) if isinstance(getattr(m, "encoder", None),
                                                                        torch.nn.ModuleList) else None, "self_attn"),
                "decoder": of(decoder, "self_attn"), "cross": of(decoder, "cross_attn")}

    @contextmanager
    def intervene(self, mask_heads=(), mask_source=(), source_length: int | None = None):
        """Within this block the model computes with heads silenced and source tokens hidden, in every pass
        (decoding, teacher forcing, scoring). Not thread-safe: it changes the module while the block runs.

        ``mask_heads``: [(kind, layer, head), ...], kind "encoder", "decoder" or "cross", layer and head from 0; a
        head is silenced by zeroing its slice of the attention's output projection input (a forward pre-hook on
        ``out_proj``), so the layer goes on with the other heads. ``mask_source``: positions of the source (as
        :meth:`attention` lists it, EOS included; a captioner's grid cells) made padding: no attention reaches
        them (a Transformer's encoder included). ``source_length`` checks the positions. A wrong kind, layer,
        head or position is a one-line error naming ``mask_heads`` or ``mask_source``."""
        heads = self._heads_to_mask(mask_heads)
        try:
            positions = sorted({int(p) for p in mask_source})
        except (TypeError, ValueError):
            raise AttnkitError(f"mask_source: expected a list of source positions, got {mask_source!r}") from None
        if positions:
            self._check_source_mask(positions, source_length)
        handles = []
        try:
            for attn, silenced in heads.items():
                keep = torch.ones(attn.d_model)
                for h in silenced:
                    keep[h * attn.d_head:(h + 1) * attn.d_head] = 0.0
                handles.append(attn.out_proj.register_forward_pre_hook(
                    lambda _module, args, keep=keep: (args[0] * keep.to(args[0]),) + tuple(args[1:])))
            if positions:
                self.module.encode = self._masked_encode(self.module.encode, positions)
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self.module.__dict__.pop("encode", None)

    def _heads_to_mask(self, mask_heads) -> dict:
        modules = self.attention_modules() if mask_heads else {}
        heads: dict = {}
        for i, entry in enumerate(mask_heads):
            where = f"mask_heads[{i}]"
            try:
                kind, layer, head = entry
                layer, head = int(layer), int(head)
            except (TypeError, ValueError):
                raise AttnkitError(f"{where}: expected [kind, layer, head], got {entry!r}") from None
            if kind not in ATTENTION_KINDS:
                raise AttnkitError(f"{where}: kind {kind!r} is not one of {', '.join(ATTENTION_KINDS)}")
            layers = modules[kind]
            if not layers:
                raise AttnkitError(f"{where}: a {self.family} model has no multi-head {kind} attention")
            if not 0 <= layer < len(layers):
                raise AttnkitError(f"{where}: layer {layer} out of range ({kind} attention has {len(layers)} "
                                   "layers, from 0)")
            if not 0 <= head < layers[layer].n_heads:
                raise AttnkitError(f"{where}: head {head} out of range ({layers[layer].n_heads} heads, from 0)")
            heads.setdefault(layers[layer], set()).add(head)
        return heads

    @property
    def can_mask_source(self) -> bool:
        """Whether ``mask_source`` can hide source tokens: a language model has no source, Show-Attend-Tell and the
        RNN encoder-decoder without attention no source padding to hide them with (:mod:`attnkit.registry`)."""
        return bool(registry.family(self.family).masks_source)

    def _check_source_mask(self, positions: list[int], source_length: int | None) -> None:
        if not self.can_mask_source:
            what = "no source padding to hide tokens with" if self.kind.has_source else "no source"
            raise AttnkitError(f"mask_source: a {self.family} model has {what}")
        if source_length is not None and not all(0 <= p < source_length for p in positions):
            raise AttnkitError(f"mask_source: positions must be in 0..{source_length - 1} (the source's tokens), "
                               f"got {positions}")

    def _masked_encode(self, encode, positions: list[int]):
        """``encode`` with ``positions`` of the source made padding: a token source's ids become PAD (a Transformer
        then hides them from its encoder too); otherwise the memory's padding mask hides them from the decoder."""
        index = torch.tensor(positions)
        if registry.family(self.family).masks_source == "tokens":
            def masked(src, *args, **kwargs):
                return encode(src.index_fill(1, index.to(src.device), PAD), *args, **kwargs)
            return masked

        def masked_memory(source, *args, **kwargs):
            out = encode(source, *args, **kwargs)
            memory, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
            mask = memory.padding_mask.index_fill(1, index.to(memory.padding_mask.device), True)
            memory = replace(memory, padding_mask=mask)
            return memory if rest is None else (memory, *rest)
        return masked_memory

    def align(self, sentence: str, beam: int | None = None, layer: int | None = None, head: int | None = None):
        """Translate ``sentence`` and return its :class:`~attnkit.decode.Alignment` (words on both axes), ready for
        :func:`attnkit.viz.plot_attention`."""
        from attnkit.decode import align

        self.require("align")
        self.kind.check(self, [sentence])
        d = self.config.decode
        return align(self.module, self.tokenizers, sentence, beam_size=beam or d.beam_size, len_penalty=d.len_penalty,
                     max_len_a=d.max_len_a, max_len_b=d.max_len_b, layer=layer, head=head)

    def classify(self, texts: str | list[str], pairs: str | list[str] | None = None, batch_tokens: int = 4096):
        """Classify sentences, or sentence pairs (``texts[i]``, ``pairs[i]``) for a model trained on pairs: one
        text -> a :class:`~attnkit.decode.Classification`, a list -> a list of them, in input order. A regressor's
        Classification carries its ``score``; a classifier's the most probable ``label`` and every label's
        ``probabilities``. Inputs longer than the model's ``data.truncate`` word pieces are cut."""
        from attnkit.decode import classify

        self.require("classify")
        one = isinstance(texts, str)
        if pairs is not None and isinstance(pairs, str) != one:
            raise AttnkitError("classify: give texts and pairs alike, both strings or both lists")
        texts = [texts] if one else list(texts)
        pairs = None if pairs is None else [pairs] if isinstance(pairs, str) else list(pairs)
        self._check_pairs(pairs is not None)
        for i, text in enumerate(texts + (pairs or [])):
            if not isinstance(text, str) or not text.strip():
                which = f"pairs[{i - len(texts)}]" if i >= len(texts) else f"texts[{i}]"
                raise AttnkitError(f"classify: {which} is {'empty' if isinstance(text, str) else repr(text)}, "
                                   "not a sentence")
        out = classify(self.classifier, self.tokenizers, texts, pairs, batch_tokens)
        return out[0] if one else out

    def evaluate(self, data, batch_tokens: int = 4096) -> tuple[dict[str, float], list]:
        """Score a classifier on a labelled file (:class:`attnkit.data.Labelled`: a GLUE dev file, your own CSV, TSV
        or JSONL) with its task's validation metrics, so that the figures are those its training recorded
        (accuracy, F1, Matthews' correlation; a regressor's Pearson and Spearman correlations; in percent) -> (the
        scores, the classifications they score). A label this model does not know is an error naming its line."""
        from attnkit.data import check_labels
        from attnkit.train.tasks import ClassificationTask

        self.require("classify")
        labels = self.module.labels
        if self.problem == "classification":
            check_labels(data, labels, f"the checkpoint {self.path}")
        results = self.classify(data.texts, data.pairs, batch_tokens)
        if self.problem == "regression":
            predictions, golds = [c.score for c in results], data.labels
        else:
            index = {name: i for i, name in enumerate(labels)}
            predictions, golds = [index[c.label] for c in results], [index[g] for g in data.labels]
        return ClassificationTask.score(self.problem, predictions, golds, len(labels)), results

    def answer(self, images, questions, batch_size: int = 64):
        """Answer questions about images (a visual question answering model): one image file and one question -> an
        :class:`~attnkit.decode.answer.Answer` (the answer, its probability, every answer's probability, each
        glimpse's attention over the image grid, the question's words the model never saw); lists of both -> a
        list of answers, in input order. An empty question, or an image that is not one, is a one-line error."""
        from attnkit.decode.answer import answer

        self.require("answer")
        one = isinstance(questions, str)
        if one != isinstance(images, (str, Path)):
            raise AttnkitError("answer: give one image and one question, or a list of each")
        images, questions = ([images], [questions]) if one else (list(images), list(questions))
        if len(images) != len(questions):
            raise AttnkitError(f"answer: {len(images)} images but {len(questions)} questions")
        self.kind.check(self, list(zip(images, questions)))
        out = answer(self.module, self.tokenizers, images, [q.strip() for q in questions],
                     self.config.data.image_size, self.kind.grid(self), batch_size)
        return out[0] if one else out

    def evaluate_answers(self, data, batch_size: int = 64) -> tuple[dict[str, float], list]:
        """Score a visual question answering model on questions with their answers (:class:`attnkit.data.vqa.
        VQAExamples`: easy-VQA's test split, or your own JSONL or TSV): accuracy overall and per question type, in
        percent, as its training's validation reports them -> (the scores, the answers they score)."""
        from attnkit.evaluate.metrics import answer_scores

        self.require("answer")
        results = self.answer(data.images, data.questions, batch_size)
        return answer_scores([r.answer for r in results], data.answers, data.types), results

    def _check_pairs(self, given: bool) -> None:
        """A sentence pair for a model of single sentences, or one sentence for a model of pairs, is refused: the
        model would answer, but about an input it was never trained to read."""
        if given and not self.takes_pairs:
            raise AttnkitError(f"a sentence pair given to a model of single sentences ({self.path}); give one "
                               "sentence per input")
        if not given and self.takes_pairs:
            raise AttnkitError(f"a single sentence given to a model of sentence pairs ({self.path}); give the "
                               "second sentences too (pairs)")

    # --- tokens

    @property
    def target_tokenizer(self):
        """The tokenizer of what the model writes (a translation model's target side; else its one tokenizer): the
        pieces and text of a decoding step's tokens."""
        return getattr(self.tokenizers, "tgt", self.tokenizers)

    def _target_ids(self, text: str) -> list[int]:
        return self.target_tokenizer.encode([text])[0]

    def _pieces(self, ids: list[int]) -> list[str]:
        return list(self.target_tokenizer.id_to_piece(ids))


def load(path: str | Path, precision: str = "fp32", compile: bool | None = None,
         shortlist: bool | str | Path = False) -> Model:
    """The model of a run directory (its best checkpoint, else averaged, else last) or of a checkpoint directory,
    verified and in eval mode. ``precision`` ("fp32", "bf16", "int8") is what decoding (translate, generate,
    caption) computes in, where this machine has the instructions for it (else a one-line error); scores and
    attention maps are computed in fp32. ``compile``: whether decoding is compiled (:meth:`Model.compile`), when the
    model first decodes; by default (None) a translation model whose steps compile ahead of time is compiled at its
    first ``translate`` of enough sentences to repay it (:func:`attnkit.fast.compiles_by_default`). ``shortlist``: a
    translation model scores only each batch's candidate target tokens (:mod:`attnkit.data.shortlist`), from the
    vocabulary map at that path, or with True the one ``attnkit shortlist`` wrote for its run."""
    module, config, tokenizers, directory = load_checkpoint(path)
    return Model(module, config, tokenizers, directory, precision, compile, shortlist)


__all__ = ["Attention", "Model", "load"]
