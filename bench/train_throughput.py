"""Training throughput side by side: attnkit's Transformer against the same architecture as a Hugging Face
``MarianMTModel``, both trained by the same plain loop on the same real Multi30k batches.

Both start from the same weights (attnkit's initialisation, copied into Marian by the exporter's map) and
take the same batches, loss (label-smoothed cross entropy summed over target tokens), backward, clipping
and fused Adam step, in training mode with the config's dropout. Each computes the loss its own way:
attnkit as ``attnkit train`` does (``model(src, tgt_in, targets=...)``: logits made only at non-pad targets,
the output projection fused with the loss, which also yields the NLL it logs), Hugging Face with what a
plain PyTorch loop writes, ``F.cross_entropy(label_smoothing=...)``. Both run in this one
process with freed memory kept for reuse (``attnkit.fast.memory``), as ``attnkit train`` runs.
Throughput counts non-pad target tokens per second of training steps. The machine's fp32 matmul peak
is measured here with large square matmuls; each system's fraction of it is its model FLOPs per second
(three times the forward FLOPs, counted by ``torch.utils.flop_counter`` on attnkit's model: the same
architecture needs the same FLOPs, however an implementation spends them) over that peak.

Where the CPU has AVX512_BF16 or AMX-BF16, attnkit also trains in bf16 mixed precision (``train.precision =
"bf16"``: autocast, fp32 master weights), from the same weights on the same batches; after the timed steps each
attnkit model's loss on the first validation batches, in fp32, says whether bf16 trains as well per step.

    python bench/train_throughput.py            # 60 timed steps each -> bench/results/train_throughput.json
    python bench/train_throughput.py --quick    # 4 steps on 2000 pairs -> train_throughput_quick.json

Targets: >= 1.2x Hugging Face's tokens/s, and >= 60% of the matmul peak. ``metrics.recipe_precision`` is what the
config trains at on this machine (its ``train.precision``, "auto" resolved: bf16 where the CPU has its
instructions and bf16 trained faster here), and ``metrics.recipe_fraction_of_matmul_peak`` that system's fraction of
the fp32 peak.
"""

from __future__ import annotations

# the allocator the attnkit command line trains on (jemalloc where the system has it: attnkit.allocator), chosen as
# the process starts, before torch is imported
if __name__ == "__main__":
    import os
    import sys

    if "--avx2-kernels" in sys.argv:
        # every library's AVX2 code on a CPU that has more, set before any of them loads: PyTorch's own kernels,
        # oneDNN's, and MKL's: capped at AVX2 (which an Intel CPU needs), and on an AMD CPU left to MKL's own
        # choice, as attnkit leaves it on an AMD CPU without AVX-512
        os.environ.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                          ATTNKIT_MKL="vendor")
    from attnkit.allocator import relaunch_under_jemalloc
    from attnkit.mkl import use_feature_kernels

    relaunch_under_jemalloc()
    use_feature_kernels()  # MKL's kernels by the CPU's instructions, before torch loads (attnkit.mkl)

import argparse
import copy
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit import fast
from attnkit.config import load_config
from attnkit.data import build_tokenizers, collate, encode_pairs, load_split, token_batches
from attnkit.evaluate.results import matmul_peak, write_results
from attnkit.export.huggingface import copy_to_marian, marian_config
from attnkit.fast.memory import bound_kernel_caches, keep_freed_memory
from attnkit.fast.precision import cpu_flags
from attnkit.models import PAD, build_model
from attnkit.train.trainer import training_precision


def forward_flops(model, batches) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    model.eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        for b in batches:
            model(b.src, b.tgt_in)
    return counter.get_total_flops()


class Trainee:
    """One system's model, loss and fused Adam, stepped on batches as a plain loop would; ``autocast``: a dtype
    the forward pass and loss run in mixed precision at (the Trainer's ``train.precision``)."""

    def __init__(self, model, loss_sum, cfg, autocast: torch.dtype | None = None):
        self.model, self.loss_sum, self.clip, self.autocast = model, loss_sum, cfg.train.clip_norm, autocast
        self.params = list(model.parameters())
        t = cfg.train
        self.opt = torch.optim.Adam(self.params, lr=t.lr, betas=t.betas, eps=t.eps, fused=True)
        self.seconds, self.tokens = 0.0, 0

    def run(self, batches, timed: bool = True) -> None:
        self.model.train()
        for b in batches:
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=self.autocast, enabled=self.autocast is not None):
                loss = self.loss_sum(b)
            n = int(b.tgt_out.ne(PAD).sum())
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if timed:
                self.seconds += time.perf_counter() - start
                self.tokens += n


@torch.no_grad()
def valid_loss(model, batches) -> float:
    """Mean NLL per target token over ``batches``, in fp32, in eval mode (no smoothing)."""
    model.eval()
    nll = sum(float(model(b.src, b.tgt_in, targets=b.tgt_out).nll) for b in batches)
    return nll / sum(int(b.tgt_out.ne(PAD).sum()) for b in batches)


def model_matmuls(model, batch) -> list[tuple[int, int, int, int]]:
    """The (batch, M, K, N) of every matrix product in one forward of ``model`` on ``batch``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten, shapes = torch.ops.aten, []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (aten.mm.default, aten.addmm.default):
                a, b = args[-2], args[-1]
                shapes.append((1, a.shape[0], a.shape[1], b.shape[1]))
            elif func in (aten.bmm.default, aten.baddbmm.default):
                a, b = args[-2], args[-1]
                shapes.append((a.shape[0], a.shape[1], a.shape[2], b.shape[2]))
            return func(*args, **(kwargs or {}))

    model.eval()
    with torch.no_grad(), Log():
        model(batch.src, batch.tgt_in)
    return shapes


def matmul_ceiling(shapes, repeats: int = 5) -> float:
    """GFLOP/s of the model's own matrix products alone (forward, and the two products of each one's backward):
    what this machine's libraries give at these sizes, each product by the faster of PyTorch's (MKL) and oneDNN's
    (what ``train.fast``'s ``onednn_linear`` runs where it pays), before anything else a training step does."""
    from attnkit.fast.linear import onednn_product

    work = []
    for b, m, k, n in shapes:  # forward [m, k] @ [k, n]; backward [m, n] @ [n, k] and [k, m] @ [m, n]
        for p, q, r in ((m, k, n), (m, n, k), (k, m, n)):
            work.append((torch.randn(b, p, q).squeeze(0), torch.randn(b, q, r).squeeze(0)))
    flops = sum(2 * a.numel() * y.shape[-1] for a, y in work)

    def best(product, a, y) -> float:
        times = []
        for _ in range(repeats + 1):  # the first pass is a warm-up
            t = time.perf_counter()
            product(a, y)
            times.append(time.perf_counter() - t)
        return min(times[1:])

    seconds = 0.0
    for a, y in work:
        plain = best(torch.matmul, a, y)
        seconds += plain if a.dim() == 3 else min(plain, best(lambda a, y: onednn_product(a, y.t()), a, y))
    return flops / seconds / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/multi30k_en_de.toml")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per system")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4, help="the timed steps are split into rounds the systems alternate")
    ap.add_argument("--spm", default="runs/multi30k_en_de/spm.model",
                    help="the run's SentencePiece model, if there (else one is trained on the training data)")
    ap.add_argument("--data-dir")
    ap.add_argument("--quick", action="store_true", help="4 timed steps on 2000 pairs, a small matmul")
    ap.add_argument("--avx2-kernels", action="store_true",
                    help="run PyTorch's, oneDNN's and MKL's AVX2 kernels only, as on a CPU without AVX-512 (the "
                         "settings are written into the JSON's command); bf16, which such a CPU lacks, is not trained")
    ap.add_argument("--out", help="default bench/results/train_throughput.json (..._quick.json with --quick)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup = 4, 1
    keep_freed_memory()
    bound_kernel_caches()  # as the Trainer does

    cfg = load_config(args.config)
    if args.quick:
        cfg.data.max_train_pairs = 2000
    torch.set_num_threads(args.threads)
    pairs = load_split(cfg.data, "train", args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        if Path(args.spm).exists() and cfg.data.joint_vocab:
            shutil.copyfile(args.spm, Path(tmp) / "spm.model")
        toks = build_tokenizers(cfg.data, pairs, Path(tmp))
        data = encode_pairs(toks, pairs, cfg.data.max_len)
    order = token_batches([len(s) for s in data.src], [len(t) for t in data.tgt], cfg.train.max_tokens,
                          seed=cfg.train.seed)[: args.warmup + args.steps]
    batches = [collate([data.src[i] for i in idx], [data.tgt[i] for i in idx], idx) for idx in order]

    peak = matmul_peak(args.threads, 1024 if args.quick else 2048)
    torch.manual_seed(cfg.train.seed)
    ours = fast.use(build_model(cfg.model, toks.src.vocab_size, toks.tgt.vocab_size), *fast.TRAINING)
    model_flops = 3 * forward_flops(ours, batches[args.warmup:])  # forward + backward (twice the forward)
    from transformers import MarianMTModel

    hf = MarianMTModel(marian_config(cfg, toks.src.vocab_size, toks.tgt.vocab_size))
    copy_to_marian(ours, hf)  # the same initial weights

    eps = cfg.train.label_smoothing

    def attnkit_loss(b):
        return ours(b.src, b.tgt_in, targets=b.tgt_out, label_smoothing=eps).loss  # as the Trainer computes it

    def huggingface_loss(b):
        logits = hf(input_ids=b.src, attention_mask=b.src.ne(PAD), decoder_input_ids=b.tgt_in).logits
        return F.cross_entropy(logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=PAD, label_smoothing=eps,
                               reduction="sum")

    trainees = {"attnkit": Trainee(ours, attnkit_loss, cfg), "huggingface_marian": Trainee(hf, huggingface_loss, cfg)}
    if {"avx512_bf16", "amx_bf16"} & cpu_flags() and not args.avx2_kernels:
        ours_bf16 = copy.deepcopy(ours)  # the same initial weights

        def attnkit_bf16_loss(b):
            return ours_bf16(b.src, b.tgt_in, targets=b.tgt_out, label_smoothing=eps).loss

        trainees["attnkit_bf16"] = Trainee(ours_bf16, attnkit_bf16_loss, cfg, autocast=torch.bfloat16)
    for trainee in trainees.values():
        trainee.run(batches[: args.warmup], timed=False)
    # the timed batches in rounds, the systems taking turns (and swapping who goes first), so that drift in the
    # machine's speed falls on both alike
    timed = batches[args.warmup:]
    per_round = -(-len(timed) // args.rounds)
    for r in range(args.rounds):
        names = list(trainees) if r % 2 == 0 else list(reversed(trainees))
        for name in names:
            trainees[name].run(timed[r * per_round: (r + 1) * per_round])
    # the peak again after the timed steps, the best of both: a peak measured in a slow moment of this machine
    # once gave 79 GFLOP/s, under what the model's own matmul shapes then reached
    peak = max(peak, matmul_peak(args.threads, 1024 if args.quick else 2048))
    systems = {}
    for name, trainee in trainees.items():
        seconds, tokens = trainee.seconds, trainee.tokens
        achieved = model_flops / seconds / 1e9
        systems[name] = {"tokens_per_s": round(tokens / seconds, 1), "seconds": round(seconds, 3),
                         "target_tokens": tokens, "model_gflop_per_s": round(achieved, 2),
                         "fraction_of_matmul_peak": round(achieved / peak, 4)}
        print(f"{name:>18}: {tokens / seconds:8.0f} target tokens/s, {achieved:6.1f} GFLOP/s "
              f"({100 * achieved / peak:.1f}% of the {peak:.0f} GFLOP/s matmul peak)", flush=True)

    valid = load_split(cfg.data, "valid", args.data_dir)
    valid_data = encode_pairs(toks, valid, cfg.data.max_len)
    valid_batches = [collate([valid_data.src[i] for i in idx], [valid_data.tgt[i] for i in idx], idx) for idx in
                     token_batches([len(x) for x in valid_data.src], [len(t) for t in valid_data.tgt],
                                   cfg.train.max_tokens)]
    for name, trainee in trainees.items():
        if name.startswith("attnkit"):
            systems[name]["valid_loss_after_steps"] = round(valid_loss(trainee.model, valid_batches), 4)

    # what limits the fraction of peak: the model's matrices are small (d_model 128), and BLAS alone reaches
    # only part of the square-matmul peak at these shapes
    ceiling = matmul_ceiling(model_matmuls(ours, batches[args.warmup]))
    print(f"the model's own matmul shapes alone: {ceiling:.1f} GFLOP/s ({100 * ceiling / peak:.1f}% of peak)")
    speedup = systems["attnkit"]["tokens_per_s"] / systems["huggingface_marian"]["tokens_per_s"]
    print(f"attnkit / Hugging Face: {speedup:.2f}x")
    if "attnkit_bf16" in systems:
        bf16 = systems["attnkit_bf16"]["tokens_per_s"] / systems["attnkit"]["tokens_per_s"]
        print(f"attnkit bf16 / fp32: {bf16:.2f}x; validation loss after the same steps: "
              f"{systems['attnkit_bf16']['valid_loss_after_steps']} (bf16) against "
              f"{systems['attnkit']['valid_loss_after_steps']} (fp32)")
    metrics = {"tokens_per_s": systems["attnkit"]["tokens_per_s"], "speedup_vs_huggingface": round(speedup, 3),
               "fraction_of_matmul_peak": systems["attnkit"]["fraction_of_matmul_peak"],
               "matmul_peak_gflop_per_s": round(peak, 1),
               "model_shape_matmul_gflop_per_s": round(ceiling, 1),
               "model_shape_matmul_fraction_of_peak": round(ceiling / peak, 4),
               "targets": {"speedup_vs_huggingface": 1.2, "fraction_of_matmul_peak": 0.6}}
    if "attnkit_bf16" in systems:
        metrics["bf16_speedup_vs_fp32"] = round(systems["attnkit_bf16"]["tokens_per_s"]
                                                / systems["attnkit"]["tokens_per_s"], 3)
    # what `attnkit train` on this config trains at here (train.precision, "auto" resolved as the Trainer resolves it:
    # bf16 where the CPU has its instructions and it trains faster, here measured over the timed steps), and its
    # fraction of the peak
    recipe = training_precision(cfg.train.precision, torch.device("cpu"))
    if cfg.train.precision == "auto" and recipe == "bf16" and metrics.get("bf16_speedup_vs_fp32", 0.0) <= 1.0:
        recipe = "fp32"
    metrics["recipe_precision"], metrics["recipe_precision_setting"] = recipe, cfg.train.precision
    metrics["recipe_fraction_of_matmul_peak"] = systems["attnkit_bf16" if recipe == "bf16" else "attnkit"][
        "fraction_of_matmul_peak"]
    print(f"{args.config} trains at {recipe} here: {100 * metrics['recipe_fraction_of_matmul_peak']:.1f}% of the "
          f"fp32 matmul peak")
    out = args.out or f"bench/results/train_throughput{'_quick' if args.quick else ''}.json"
    command = " ".join(["python", *sys.argv])
    write_results(out, "train_throughput", command, metrics, systems=systems,
                  ratios={"attnkit_over_huggingface_tokens_per_s": round(speedup, 3)}, quick=args.quick,
                  config=args.config, steps=args.steps, warmup=args.warmup, rounds=args.rounds, threads=args.threads,
                  model_flops_per_timed_step=model_flops // max(1, args.steps))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
