"""Translation throughput side by side on the same weights: attnkit, Hugging Face ``generate`` (the
MarianMTModel export) and CTranslate2 (fp32, and int8 as a reference), greedy and beam 5, batches of 1
and 64 sentences of the test_2016_flickr source; attnkit eager (``--no-compile``) and compiled, as ``attnkit
translate`` decodes a Transformer by default (the search steps ahead of time by AOTInductor, the encoder by
torch.compile; the first batch of each run, untimed, pays the compilation).

Every system decodes the same sentences, sorted by length and cut into the same batches, within
attnkit's length limit (``max_len_a * source + max_len_b``; per sentence for attnkit, the batch's
longest for the others). The systems take turns in four rounds, so drift in the machine's speed falls on all
of them. Throughput is output tokens (subwords, EOS excluded) per second. Checked on
the way: attnkit's batched greedy output equals its unbatched one, and the Hugging Face and
CTranslate2 fp32 greedy outputs equal attnkit's; BLEU of every run shows what int8 costs.

    python bench/translate_throughput.py            # all 1000 sentences -> bench/results/translate_throughput.json
    python bench/translate_throughput.py --quick    # 16 sentences -> translate_throughput_quick.json

Targets: at batch 64 at least as fast as CTranslate2 fp32; at batch 1 >= 3x Hugging Face.
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
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch

from attnkit import fast
from attnkit.checkpoint import load_checkpoint
from attnkit.data import load_split, pad
from attnkit.decode import generate, max_lengths
from attnkit.evaluate import bleu
from attnkit.evaluate.results import write_results
from attnkit.fast import compile_step
from attnkit.fast.memory import keep_freed_memory
from attnkit.models import EOS, PAD


def attnkit_decoder(model, shortlist=None):
    """``shortlist``: a vocabulary map, whose candidates for each batch's sources are the only tokens scored."""
    def decode(src, lens, beam, len_penalty):
        vocabulary = None if shortlist is None else shortlist.candidates([row[row != PAD].tolist() for row in src])
        return [h[0].tokens for h in generate(model, src, lens, beam_size=beam, len_penalty=len_penalty,
                                              vocabulary=vocabulary)]
    return decode


def hf_decoder(hf):
    def decode(src, lens, beam, len_penalty):
        # num_beams always: the export's generation_config defaults to the checkpoint's beam size;
        # early_stopping: stop at beam-many finished hypotheses, as attnkit's beam search does (beam only)
        search = {"length_penalty": len_penalty, "early_stopping": True} if beam > 1 else {}
        out = hf.generate(input_ids=src, attention_mask=src.ne(PAD), num_beams=beam, do_sample=False,
                          max_length=int(lens.max()) + 1, **search)
        rows = []
        for row, limit in zip(out.tolist(), lens.tolist()):
            row = row[1:1 + limit]
            rows.append(row[:row.index(EOS)] if EOS in row else row[:limit - 1])
        return rows
    return decode


def ct2_decoder(translator, toks, use_vmap: bool = False):
    from attnkit.export.ct2 import ct2_generate

    def decode(src, lens, beam, len_penalty):
        ids = [[i for i in row if i != PAD] for row in src.tolist()]  # one conversion, not a tensor per element
        return ct2_generate(translator, toks, ids, lens.tolist(), beam_size=beam, len_penalty=len_penalty,
                            batch_size=len(ids), use_vmap=use_vmap)
    return decode


def test_set(checkpoint, data_dir, sentences: int = 0):
    """The checkpoint ((model, config, tokenizers, path)) and the first ``sentences`` (0: all) of its test split:
    (checkpoint, references, source ids with EOS, their order by length, the same batches for every system)."""
    model, cfg, toks, path = load_checkpoint(checkpoint)
    test = load_split(cfg.data, "test", data_dir)
    n = sentences or len(test.src)
    ids = [s + [EOS] for s in toks.src.encode(test.src[:n])]
    return (model, cfg, toks, path), test.tgt[:n], ids, sorted(range(n), key=lambda i: (len(ids[i]), i))


def length_sorted_batches(ids: list[list[int]], order: list[int], size: int, decode) -> list:
    """The sentences ``ids`` (EOS ended) in ``order`` cut into batches of ``size``: [(source [B, S], length limits
    [B])], the limits ``decode.max_len_a * length + decode.max_len_b``."""
    out = []
    for k in range(0, len(order), size):
        chunk = [ids[i] for i in order[k:k + size]]
        out.append((pad(chunk), max_lengths(torch.tensor([len(s) - 1 for s in chunk]), decode.max_len_a,
                                            decode.max_len_b)))
    return out


@torch.no_grad()
def run(decoders: dict, batches, beam: int, len_penalty: float, rounds: int = 4,
        first_pass: dict | None = None, repeats: int = 1) -> dict[str, tuple[list, float]]:
    """-> {system: (outputs in batch order, seconds)}. The batches are cut into ``rounds`` runs of consecutive
    batches, and the systems take turns run by run, so a change in the machine's speed falls on all of them
    (one system's throughput moved by up to a third between two runs of this bench), while each system still
    decodes many batches in a row, with its weights in cache, as a user translating a file would (turns at
    every batch made every system slower at batch 1). The first batch is decoded once untimed: one-time costs
    (compilation, allocator growth, kernel selection, lazy initialisation) are not throughput.

    With ``first_pass`` (a dict), each system first decodes every batch once, one system after another, and the
    seconds each took go into ``first_pass``: what a process that translates these sentences once waits, one-time
    costs included (kernels made for each new shape of a oneDNN product, the compiled steps' checks against the
    eager ones), apart from the throughput the turns then measure.

    ``repeats``: the rounds are run that many times over (the outputs kept from the first), so that a cell's timing
    spans more than the second or so that one pass of its sentences takes, in which a pause of the machine weighs."""
    for name, decode in decoders.items():
        decode(*batches[0], beam, len_penalty)
        if first_pass is not None:
            start = time.perf_counter()
            for src, lens in batches:
                decode(src, lens, beam, len_penalty)
            first_pass[name] = time.perf_counter() - start
    outputs = {name: [] for name in decoders}
    seconds = dict.fromkeys(decoders, 0.0)
    cuts = [len(batches) * r // rounds for r in range(rounds + 1)]
    for repeat in range(repeats):
        for part in (batches[a:b] for a, b in zip(cuts, cuts[1:])):
            for name, decode in decoders.items():
                start = time.perf_counter()
                for src, lens in part:
                    out = decode(src, lens, beam, len_penalty)
                    if repeat == 0:
                        outputs[name] += out
                seconds[name] += time.perf_counter() - start
    return {name: (outputs[name], seconds[name] / repeats) for name in decoders}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de/checkpoints/averaged")
    ap.add_argument("--data-dir")
    ap.add_argument("--sentences", type=int, default=0, help="the first N test sentences (0: all)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="16 sentences")
    ap.add_argument("--out", help="default bench/results/translate_throughput.json (..._quick.json with --quick)")
    args = ap.parse_args()
    keep_freed_memory()  # as the attnkit command line does
    if args.quick:
        args.sentences = 16
    torch.set_num_threads(args.threads)

    from attnkit.export import ct2
    from attnkit.export.huggingface import export_huggingface, load_marian

    (model, cfg, toks, path), refs, ids, order = test_set(args.checkpoint, args.data_dir, args.sentences)
    n, d = len(refs), cfg.decode

    def batches(size):
        return length_sorted_batches(ids, order, size, d)

    with tempfile.TemporaryDirectory() as tmp:
        hf = load_marian(export_huggingface(path, Path(tmp) / "marian"))
        ct2_dir = ct2.export_ctranslate2(path, Path(tmp) / "ct2")
        # attnkit compiled, on copies of the model, as ``attnkit translate`` does by default: the search steps ahead
        # of time (AOTInductor), the encoder by torch.compile, frozen unless one sentence is decoded greedily
        one_row = attnkit_decoder(compile_step(model))
        frozen = attnkit_decoder(compile_step(model, freeze=True))

        def compiled(src, lens, beam, len_penalty):
            return (one_row if beam == 1 and src.size(0) == 1 else frozen)(src, lens, beam, len_penalty)

        decoders = {"attnkit": attnkit_decoder(fast.decoder(copy.deepcopy(model))),  # `attnkit translate --no-compile`
                    "attnkit_compiled": compiled,
                    "huggingface": hf_decoder(hf),
                    "ctranslate2_fp32": ct2_decoder(ct2.translator(ct2_dir, "float32", args.threads), toks),
                    "ctranslate2_int8": ct2_decoder(ct2.translator(ct2_dir, "int8", args.threads), toks)}
        systems: dict[str, dict] = {name: {} for name in decoders}
        outputs = {}
        for beam in (1, 5):
            for size in (1, 64):
                for name, (out, seconds) in run(decoders, batches(size), beam, d.len_penalty).items():
                    tokens = sum(len(o) for o in out)
                    in_order = [None] * n
                    for i, o in zip(order, out):
                        in_order[i] = o
                    outputs[name, beam, size] = in_order
                    score = bleu([toks.tgt.decode(o) for o in in_order], refs).score
                    label = f"{'greedy' if beam == 1 else f'beam{beam}'}/batch{size}"
                    systems[name][label] = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3),
                                            "tokens": tokens, "bleu": round(score, 2)}
                    print(f"{name:>17} {label:<14} {tokens / seconds:8.0f} tokens/s  BLEU {score:5.2f}", flush=True)

    greedy = outputs["attnkit", 1, 64]
    checks = {"attnkit_batched_greedy_equals_unbatched": sum(a == b for a, b in zip(greedy, outputs["attnkit", 1, 1])),
              "huggingface_greedy_equals_attnkit": sum(a == b for a, b in zip(greedy, outputs["huggingface", 1, 64])),
              "ctranslate2_fp32_greedy_equals_attnkit": sum(a == b for a, b in
                                                            zip(greedy, outputs["ctranslate2_fp32", 1, 64])),
              "attnkit_compiled_greedy_equals_attnkit": sum(a == b for a, b in
                                                            zip(greedy, outputs["attnkit_compiled", 1, 64])),
              "sentences": n}
    print("identical outputs (of", n, "):", {k: v for k, v in checks.items() if k != "sentences"})

    def speed(name, label):
        return systems[name][label]["tokens_per_s"]

    ratios = {f"{ours}_over_{other}/{label}": round(speed(ours, label) / speed(other, label), 3)
              for ours in ("attnkit", "attnkit_compiled") for other in ("huggingface", "ctranslate2_fp32",
                                                                        "ctranslate2_int8")
              for label in systems["attnkit"]}
    metrics = {"checks": checks,
               "attnkit_over_ctranslate2_fp32_batch64": {m: ratios[f"attnkit_over_ctranslate2_fp32/{m}/batch64"]
                                                         for m in ("greedy", "beam5")},
               "attnkit_over_huggingface_batch1": {m: ratios[f"attnkit_over_huggingface/{m}/batch1"]
                                                   for m in ("greedy", "beam5")},
               "attnkit_compiled_over_ctranslate2_fp32_batch64": {
                   m: ratios[f"attnkit_compiled_over_ctranslate2_fp32/{m}/batch64"] for m in ("greedy", "beam5")},
               "attnkit_compiled_over_huggingface_batch1": {
                   m: ratios[f"attnkit_compiled_over_huggingface/{m}/batch1"] for m in ("greedy", "beam5")},
               "targets": {"attnkit_over_ctranslate2_fp32_batch64": 1.0, "attnkit_over_huggingface_batch1": 3.0}}
    print("attnkit / CTranslate2 fp32 at batch 64:", metrics["attnkit_over_ctranslate2_fp32_batch64"],
          "| attnkit / Hugging Face at batch 1:", metrics["attnkit_over_huggingface_batch1"])
    out = args.out or f"bench/results/translate_throughput{'_quick' if args.quick else ''}.json"
    write_results(out, "translate_throughput", " ".join(["python", *sys.argv]), metrics, systems=systems,
                  ratios=ratios, quick=args.quick, checkpoint=str(path), sentences=n, threads=args.threads)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
