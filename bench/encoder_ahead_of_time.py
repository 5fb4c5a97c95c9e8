"""What compiling the encoder ahead of time is worth: attnkit's default compiled decoding (the search steps and the
encoder and initial state as AOTInductor packages, the weights frozen) against the same decoder with the encoder
and initial state eager, fp32, greedy and beam 5, batches of 1 and 64 sentences of Multi30k test2016, one thread,
taking turns in four rounds (:func:`translate_throughput.run`), with the outputs compared.

    python bench/encoder_ahead_of_time.py --checkpoint runs/multi30k_en_de  # -> bench/results/<the name>.json
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import sys

import torch
from translate_throughput import attnkit_decoder, length_sorted_batches, run, test_set

from attnkit import fast
from attnkit.checkpoint import resolve_checkpoint
from attnkit.evaluate.results import write_results
from attnkit.fast.memory import keep_freed_memory
from attnkit.fast.precision import cpu_flags


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de")
    ap.add_argument("--data-dir")
    ap.add_argument("--batch1-sentences", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/encoder_ahead_of_time.json")
    args = ap.parse_args()
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    (model, cfg, toks, path), refs, ids, order = test_set(resolve_checkpoint(args.checkpoint), args.data_dir)
    options = {"compile": True, "freeze": True, "cache": True}
    packaged = fast.decoder(model, **options)
    eager_encoder = fast.decoder(model, **options)
    eager_encoder._aot_encoder.sealed = True  # the ablation: no encoder package, so encoding runs eagerly
    decoders = {"encoder_ahead_of_time": attnkit_decoder(packaged), "encoder_eager": attnkit_decoder(eager_encoder)}
    cells, ratios = {}, {}
    for beam in (1, 5):
        for size in (1, 64):
            chosen = [i for i in order if i < (args.batch1_sentences if size == 1 else len(refs))]
            batches = length_sorted_batches(ids, chosen, size, cfg.decode)
            out = run(decoders, batches, beam, cfg.decode.len_penalty)
            label = f"{'greedy' if beam == 1 else f'beam{beam}'}/batch{size}"
            cells[label] = {name: {"tokens_per_s": round(sum(len(o) for o in hyps) / seconds, 1),
                                   "seconds": round(seconds, 3)} for name, (hyps, seconds) in out.items()}
            cells[label]["same_outputs"] = out["encoder_ahead_of_time"][0] == out["encoder_eager"][0]
            ratios[label] = round(cells[label]["encoder_ahead_of_time"]["tokens_per_s"]
                                  / cells[label]["encoder_eager"]["tokens_per_s"], 3)
            print(label, cells[label], ratios[label], flush=True)
    write_results(args.out, "encoder_ahead_of_time", command=f"python bench/encoder_ahead_of_time.py --checkpoint "
                  f"{args.checkpoint}", metrics={"cells": cells, "ahead_of_time_over_eager": ratios,
                                                 "cpu_flags": sorted(f for f in cpu_flags()
                                                                     if f.startswith(("avx", "amx")))},
                  checkpoint=str(path), threads=args.threads, batch1_sentences=args.batch1_sentences)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
