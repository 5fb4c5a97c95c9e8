"""Decoding at each precision, side by side on the same weights: attnkit fp32, bf16 and int8 (the precisions this
CPU has the instructions for; ``attnkit translate --precision``), each compiled as the command line compiles
by default for a server or a large file (the search steps ahead of time, the weights frozen) and attnkit fp32
eager (``--no-compile``), against CTranslate2 ``float32`` and ``int8`` on the same exported checkpoint, greedy and
beam 5, batches of 1 and 64 sentences of the test_2016_flickr source, one thread each, taking turns in four rounds
run ``--repeats`` times over (:func:`translate_throughput.run`), after a first pass of each system over the cell's
batches (its rate kept as ``first_pass_tokens_per_s``: one-time costs included, which compiles, checks the compiled
steps and makes oneDNN's kernels for each new shape). BLEU of every run, cased sacreBLEU and the papers' BLEU
(lowercased, Moses-tokenised).

    python bench/decode_precision.py --checkpoint runs/multi30k_en_de   # -> bench/results/decode_precision.json
    python bench/decode_precision.py --no-compile                       # attnkit eager at every precision
    python bench/decode_precision.py --shortlist runs/multi30k_en_de/vmap.txt   # and with a vocabulary shortlist

With ``--shortlist VMAP`` (a vocabulary map: ``attnkit shortlist``) attnkit fp32 and int8 also decode scoring only
each batch's candidates (``attnkit translate --shortlist``), against CTranslate2 ``float32`` and ``int8`` with the
same map (exported with it, ``use_vmap=True``).

Targets: each attnkit precision's BLEU within 0.3 of fp32's; attnkit fp32 >= CTranslate2 float32 and attnkit
int8 >= CTranslate2 int8 in every cell, with and without the shortlist.
"""

from __future__ import annotations

import os

# One thread each means one busy thread each. An OpenMP runtime keeps its threads spinning for a while after each
# parallel call (Intel's, which CTranslate2 loads: 200 ms), and between turns that spin took from the system that
# ran next: attnkit's greedy decoding of batches of 64 ran at 0.82-0.84x CTranslate2 float32 right after its turns,
# 0.97-0.99x with passive waits, which CTranslate2 ran no slower under (AMD EPYC Zen 5, a throwaway timing). Set
# before an OpenMP runtime loads.
os.environ.setdefault("KMP_BLOCKTIME", "0")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# the allocator the attnkit command line runs on (jemalloc where the system has it: attnkit.allocator), chosen as the
# process starts, before torch is imported
if __name__ == "__main__":
    from attnkit.allocator import relaunch_under_jemalloc
    from attnkit.mkl import use_feature_kernels

    relaunch_under_jemalloc()
    use_feature_kernels()  # MKL's kernels by the CPU's instructions, before torch loads (attnkit.mkl)

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from translate_throughput import attnkit_decoder, ct2_decoder, length_sorted_batches, run, test_set

from attnkit import fast
from attnkit.checkpoint import resolve_checkpoint
from attnkit.data.shortlist import VocabularyMap
from attnkit.evaluate import bleu
from attnkit.evaluate.results import write_results
from attnkit.fast.memory import keep_freed_memory
from attnkit.fast.precision import NEEDS, PRECISIONS, cpu_flags


def paper_bleu_or_none(hypotheses: list[str], references: list[str], lang: str):
    try:
        from attnkit.evaluate.metrics import paper_bleu
    except ImportError:
        return None
    return paper_bleu(hypotheses, references, lang)


def steps_kept(decoder) -> dict[str, str]:
    """A compiled decoder's checked steps after decoding (the search steps, the encoder's package for one sentence
    and for a batch): "compiled" where the check kept the compiled step, else why it runs the eager one (its
    lowering failed, or it was slower or gave other outputs)."""
    out = {}
    unlowered = decoder.unlowered()
    for name, step in decoder.checks().items():
        if name in unlowered:
            out[name] = "eager: could not be compiled ahead of time"
        elif step.reason:
            out[name] = f"eager: the compiled step {step.reason}"
        else:
            out[name] = "compiled" if step.chosen is step.compiled else "not decided (too few calls)"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--data-dir")
    ap.add_argument("--sentences", type=int, default=0, help="the first N test sentences (0: all 1000)")
    ap.add_argument("--batch1-sentences", type=int, default=200, help="of those, how many the batch-1 cells decode")
    ap.add_argument("--threads", type=int, default=1)
    # one pass of a cell's sentences takes a second or less a system: timed once, a pause of the machine moved a
    # cell's ratio by several percent between two runs of this bench
    ap.add_argument("--repeats", type=int, default=5, help="how many times each cell's turns are run and timed")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="attnkit decodes eagerly at every precision (default: compiled, as --compile)")
    ap.add_argument("--shortlist", metavar="VMAP", help="a vocabulary map: fp32 and int8 with it, both systems")
    ap.add_argument("--out", default="bench/results/decode_precision.json")
    args = ap.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    from attnkit.export import ct2

    (model, cfg, toks, path), refs, ids, order = test_set(resolve_checkpoint(args.checkpoint), args.data_dir,
                                                          args.sentences)
    n, d = len(refs), cfg.decode
    flags = cpu_flags()
    precisions = [p for p in PRECISIONS if p == "fp32" or any(f in flags for f in NEEDS[p])]

    def batches(size, count):
        chosen = [i for i in order if i < count]
        return length_sorted_batches(ids, chosen, size, d), chosen

    systems: dict[str, dict] = {}
    vmap = None if args.shortlist is None else VocabularyMap.read(args.shortlist, toks.src, toks.tgt)
    with tempfile.TemporaryDirectory() as tmp:
        ct2_dir = ct2.export_ctranslate2(path, Path(tmp) / "ct2", vmap=args.shortlist)
        # compiled as the command line and attnkit.load(...).translate compile (Model.compile): the search steps and
        # the encoder ahead of time, kept in the user's cache (a second run of this bench loads them)
        options = {"compile": True, "freeze": True, "cache": True} \
            if args.compile else {}
        ours = {f"attnkit_{p}": fast.decoder(model, precision=p, **options) for p in precisions}
        decoders = {name: attnkit_decoder(d) for name, d in ours.items()}
        if args.compile:
            decoders["attnkit_fp32_eager"] = attnkit_decoder(fast.decoder(model))
        ct2_translators = {t: ct2.translator(ct2_dir, t, args.threads) for t in ("float32", "int8")}
        decoders |= {f"ctranslate2_{t}": ct2_decoder(translator, toks) for t, translator in ct2_translators.items()}
        if vmap is not None:  # the same decoders, scoring each batch's shortlist
            shortlisted = [p for p in ("fp32", "int8") if p in precisions]
            decoders |= {f"attnkit_{p}_shortlist": attnkit_decoder(ours[f"attnkit_{p}"], vmap) for p in shortlisted}
            decoders |= {f"ctranslate2_{t}_vmap": ct2_decoder(ct2_translators[t], toks, use_vmap=True)
                         for t in ("float32", "int8") if ("fp32" if t == "float32" else t) in shortlisted}
        systems = {name: {} for name in decoders}
        for beam in (1, 5):
            for size in (1, 64):
                cells, chosen = batches(size, min(n, args.batch1_sentences) if size == 1 else n)
                first_pass: dict[str, float] = {}
                for name, (out, seconds) in run(decoders, cells, beam, d.len_penalty, first_pass=first_pass,
                                                     repeats=args.repeats).items():
                    tokens = sum(len(o) for o in out)
                    hyps = {i: toks.tgt.decode(o) for i, o in zip(chosen, out)}
                    kept = sorted(hyps)
                    label = f"{'greedy' if beam == 1 else f'beam{beam}'}/batch{size}"
                    cell = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3),
                            "tokens": tokens, "sentences": len(kept),
                            "first_pass_tokens_per_s": round(tokens / first_pass[name], 1)}
                    if size == 64:  # the whole test set: its BLEU
                        hyp_text, ref_text = [hyps[i] for i in kept], [refs[i] for i in kept]
                        cell["bleu"] = round(bleu(hyp_text, ref_text).score, 2)
                        paper = paper_bleu_or_none(hyp_text, ref_text, cfg.data.tgt_lang)
                        if paper is not None:
                            cell["paper_bleu"] = round(paper.score, 2)
                    systems[name][label] = cell
                    print(f"{name:>20} {label:<14} {tokens / seconds:8.0f} tokens/s (first pass "
                          f"{cell['first_pass_tokens_per_s']:8.0f})  {cell.get('bleu', '')}",
                          flush=True)

    def speed(name, label):
        return systems[name][label]["tokens_per_s"]

    labels = list(systems["attnkit_fp32"])
    ratios = {}
    for label in labels:
        ratios[f"attnkit_fp32_over_ctranslate2_float32/{label}"] = round(
            speed("attnkit_fp32", label) / speed("ctranslate2_float32", label), 3)
        if "attnkit_int8" in systems:
            ratios[f"attnkit_int8_over_ctranslate2_int8/{label}"] = round(
                speed("attnkit_int8", label) / speed("ctranslate2_int8", label), 3)
        for p in precisions[1:]:
            ratios[f"attnkit_{p}_over_attnkit_fp32/{label}"] = round(
                speed(f"attnkit_{p}", label) / speed("attnkit_fp32", label), 3)
        for p, t in (("fp32", "float32"), ("int8", "int8")):
            if f"attnkit_{p}_shortlist" in systems:
                ratios[f"attnkit_{p}_shortlist_over_ctranslate2_{t}_vmap/{label}"] = round(
                    speed(f"attnkit_{p}_shortlist", label) / speed(f"ctranslate2_{t}_vmap", label), 3)
                ratios[f"attnkit_{p}_shortlist_over_attnkit_{p}/{label}"] = round(
                    speed(f"attnkit_{p}_shortlist", label) / speed(f"attnkit_{p}", label), 3)
    shortlisted = [name[len("attnkit_"):-len("_shortlist")] for name in systems if name.endswith("_shortlist")]
    metrics = {"precisions": precisions,
               "bleu_minus_fp32": {f"{p}/{label}": round(systems[f"attnkit_{p}"][label]["bleu"]
                                                         - systems["attnkit_fp32"][label]["bleu"], 2)
                                   for p in precisions[1:] for label in labels if "batch64" in label},
               # BLEU with the shortlist minus BLEU without it, at the same precision
               "bleu_shortlist_effect": {f"{p}/{label}": round(systems[f"attnkit_{p}_shortlist"][label]["bleu"]
                                                               - systems[f"attnkit_{p}"][label]["bleu"], 2)
                                         for p in shortlisted for label in labels if "batch64" in label},
               "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "f16c"))),
               "attnkit": "compiled (--compile, the default for a server or a large file)" if args.compile
               else "eager (--no-compile)",
               "targets": {"bleu_within": 0.3, "over_ctranslate2": 1.0}}
    print("ratios:", ratios)
    print("BLEU - fp32 BLEU:", metrics["bleu_minus_fp32"])
    if shortlisted:
        print("BLEU with the shortlist - without:", metrics["bleu_shortlist_effect"])
    if args.compile:  # what each compiled search step became: kept, or dropped for the eager step, and why
        metrics["compiled_steps"] = {name: steps_kept(d) for name, d in ours.items()}
        print("compiled steps:", metrics["compiled_steps"])
        # where searches of this many sentences or more run packed products (attnkit.fast.aot.WIDE_GRAPH); None: none
        metrics["wide_sentences"] = {name: getattr(d, "wide_sentences", None) for name, d in ours.items()}
        print("wide searches from:", metrics["wide_sentences"])
    write_results(args.out, "decode_precision", " ".join(["python", *sys.argv]), metrics, systems=systems,
                  ratios=ratios, checkpoint=str(path), sentences=n, batch1_sentences=min(n, args.batch1_sentences),
                  threads=args.threads, repeats=args.repeats, shortlist=args.shortlist)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
