"""Throughput of attnkit against an earlier revision of itself, in one process, interleaved: training tokens/s of
the Multi30k Transformer and translation tokens/s (greedy and beam 5, batches of 1 and 64, eager and compiled as
``attnkit translate --compile`` compiles), on the same weights and the same batches.

The earlier revision is read from git (``git archive REV src/attnkit``) into a temporary folder as the package
``attnkit_before``, so both are imported side by side. Each measurement alternates the two systems over
``--rounds`` rounds (the order swapped every round), so drift in the machine's speed falls on both alike.

    python bench/relayout_speed.py --before REV      # -> bench/results/relayout_speed.json

Training: the recipe's model (configs/multi30k_en_de.toml), its dropout on, one thread, Adam, the same batches of
the Multi30k training set. Translation: the first test_2016_flickr sentences, length-sorted batches, decoded by
the current revision's fast decoder (what ``attnkit translate`` runs) and by the earlier revision's model, both
with the weights of ``--checkpoint`` (a trained Multi30k model of that config, so that outputs have their real
lengths; without one, random weights, and every output runs to its length limit).
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import copy
import importlib
import io
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

import attnkit
from attnkit import fast
from attnkit.checkpoint import load_checkpoint
from attnkit.config import load_config
from attnkit.data import build_tokenizers, collate, encode_pairs, load_split, pad, token_batches
from attnkit.decode import generate, max_lengths
from attnkit.evaluate.results import write_results
from attnkit.models import EOS, build_model


def import_revision(rev: str, name: str = "attnkit_before"):
    """The package ``src/attnkit`` of git revision ``rev``, imported as ``name``."""
    folder = Path(tempfile.mkdtemp(prefix="attnkit-rev-"))
    archive = subprocess.run(["git", "archive", rev, "src/attnkit"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    package = folder / name
    (folder / "src" / "attnkit").rename(package)
    for file in package.rglob("*.py"):
        text = file.read_text(encoding="utf-8")
        text = re.sub(r"\battnkit(?=[.\s])", name, text)
        file.write_text(text, encoding="utf-8")
    sys.path.insert(0, str(folder))
    package = importlib.import_module(name)
    for module in ("config", "models", "decode"):
        importlib.import_module(f"{name}.{module}")
    return package


def commit_of(rev: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def interleaved(runs: dict, rounds: int) -> dict[str, float]:
    """``runs``: name -> a function that does one round's work and returns (units, seconds). -> units per second."""
    totals = {name: [0.0, 0.0] for name in runs}
    for r in range(rounds):
        names = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in names:
            units, seconds = runs[name]()
            totals[name][0] += units
            totals[name][1] += seconds
    return {name: units / seconds for name, (units, seconds) in totals.items()}


def training_runs(before_pkg, cfg, toks, batches, steps_per_round: int) -> dict:
    torch.manual_seed(cfg.train.seed)
    after = fast.use(build_model(cfg.model, toks.src.vocab_size, toks.tgt.vocab_size), *fast.TRAINING)
    m = cfg.model
    old_cfg = before_pkg.config.ModelConfig(
        d_model=m.d_model, n_heads=m.n_heads, d_ff=m.d_ff, n_encoder_layers=m.n_encoder_layers,
        n_decoder_layers=m.n_decoder_layers, dropout=m.dropout, attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout, activation=m.activation, norm_first=m.norm_first,
        positional=m.positional, max_positions=m.max_positions, share_embeddings=m.share_embeddings)
    before = before_pkg.models.Transformer(old_cfg, toks.src.vocab_size, toks.tgt.vocab_size)
    before.load_state_dict(after.state_dict())
    eps = cfg.train.label_smoothing

    def trainer(model, loss_of):
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        position = [0]

        def one_round():
            tokens, start = 0, time.perf_counter()
            for _ in range(steps_per_round):
                b = batches[position[0] % len(batches)]
                position[0] += 1
                loss = loss_of(model, b)
                optimizer.zero_grad(set_to_none=True)
                (loss / b.n_tokens).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                tokens += b.n_tokens
            return tokens, time.perf_counter() - start

        return one_round

    runs = {"before": trainer(before, lambda mod, b: mod(b.src, b.tgt_in, targets=b.tgt_out, label_smoothing=eps)[0]),
            "after": trainer(after, lambda mod, b: mod(b.src, b.tgt_in, targets=b.tgt_out,
                                                      label_smoothing=eps).loss)}
    for run in runs.values():  # warm-up
        run()
    return runs, before, after


def decode_runs(decoders: dict, batches, beam: int, len_penalty: float):
    """``decoders``: name -> (its revision's ``generate``, the decoder it runs)."""
    outputs = {}

    def runner(name, search, decoder):
        def one_round():
            start, out = time.perf_counter(), []
            for src, lens in batches:
                hyps = search(decoder, src, lens, beam_size=beam, len_penalty=len_penalty)
                out += [h[0].tokens for h in hyps]
            seconds = time.perf_counter() - start
            outputs[name] = out
            return sum(len(t) for t in out), seconds
        return one_round

    return {name: runner(name, *d) for name, d in decoders.items()}, outputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the git revision to compare with")
    ap.add_argument("--config", default="configs/multi30k_en_de.toml")
    ap.add_argument("--checkpoint", default="runs/multi30k_en_de/checkpoints/averaged",
                    help="a trained checkpoint of --config's model (its weights and tokenizer); "
                         "missing: random weights")
    ap.add_argument("--data-dir")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=12, help="timed training steps per system and round")
    ap.add_argument("--sentences", type=int, default=256, help="test sentences decoded in batches of 64")
    ap.add_argument("--sentences-one", type=int, default=24, help="test sentences decoded one at a time")
    ap.add_argument("--no-compile", action="store_true", help="eager decoding only")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/relayout_speed.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fast.keep_freed_memory()
    before_pkg = import_revision(args.before)

    cfg = load_config(args.config)
    pairs = load_split(cfg.data, "train", args.data_dir)
    trained = None
    if Path(args.checkpoint).exists():
        trained, trained_cfg, toks, checkpoint = load_checkpoint(args.checkpoint)
        if trained_cfg.model != cfg.model:
            raise SystemExit(f"{args.checkpoint}: not a model of {args.config}")
        print(f"weights and tokenizer of {checkpoint}", flush=True)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            toks = build_tokenizers(cfg.data, pairs, Path(tmp))
    data = encode_pairs(toks, pairs, cfg.data.max_len)
    order = token_batches([len(s) for s in data.src], [len(t) for t in data.tgt], cfg.train.max_tokens,
                          seed=cfg.train.seed)[: 2 * args.train_steps * (args.rounds + 1)]
    batches = [collate([data.src[i] for i in idx], [data.tgt[i] for i in idx], idx) for idx in order]

    print("training ...", flush=True)
    runs, before_model, after_model = training_runs(before_pkg, cfg, toks, batches, args.train_steps)
    speeds = interleaved(runs, args.rounds)
    metrics = {"training_tokens_per_s": {k: round(v, 1) for k, v in speeds.items()}
               | {"after_over_before": round(speeds["after"] / speeds["before"], 4)}}
    print(metrics, flush=True)

    test = load_split(cfg.data, "test", args.data_dir)
    ids = [s + [EOS] for s in toks.src.encode(test.src)]
    d = cfg.decode

    def length_batches(n, size):
        chosen = sorted(range(n), key=lambda i: (len(ids[i]), i))
        out = []
        for k in range(0, n, size):
            chunk = [ids[i] for i in chosen[k:k + size]]
            out.append((pad(chunk), max_lengths(torch.tensor([len(s) - 1 for s in chunk]), d.max_len_a, d.max_len_b)))
        return out

    if trained is not None:
        after_model.load_state_dict(trained.state_dict())
    before_model.load_state_dict(after_model.state_dict())  # trained with other dropout masks: the same weights again
    before_model.eval()
    after_model.eval()
    old_generate = before_pkg.decode.generate
    eager = {"before": (old_generate, before_model),
             "after": (generate, fast.decoder(fast.reference(copy.deepcopy(after_model))))}
    compiled = {}
    if not args.no_compile:
        # as `attnkit translate --compile` does: ahead of time, frozen unless one sentence is decoded greedily
        compiled = {
            "before_one_row": before_pkg.decode.compile_step(copy.deepcopy(before_model), ahead_of_time=True),
            "before_frozen": before_pkg.decode.compile_step(copy.deepcopy(before_model), freeze=True,
                                                            ahead_of_time=True),
            "after_one_row": fast.compile_step(after_model),
            "after_frozen": fast.compile_step(after_model, freeze=True)}
    translation = {}
    for mode in ("eager", "compiled"):
        if mode == "compiled" and not compiled:
            continue
        for beam in (1, 5):
            for size, n in ((64, args.sentences), (1, args.sentences_one)):
                if mode == "eager":
                    decoders = eager
                else:
                    kind = "one_row" if beam == 1 and size == 1 else "frozen"
                    decoders = {"before": (old_generate, compiled[f"before_{kind}"]),
                                "after": (generate, compiled[f"after_{kind}"])}
                sentence_batches = length_batches(n, size)
                runs, outputs = decode_runs(decoders, sentence_batches, beam, d.len_penalty)
                for search, decoder in decoders.values():  # warm-up (and compilation) on the first batches
                    for src, lens in sentence_batches[:2]:
                        search(decoder, src, lens, beam_size=beam, len_penalty=d.len_penalty)
                speeds = interleaved(runs, args.rounds)
                same = sum(a == b for a, b in zip(outputs["before"], outputs["after"]))
                key = f"{mode}_{'greedy' if beam == 1 else f'beam{beam}'}_batch{size}"
                translation[key] = {"before_tokens_per_s": round(speeds["before"], 1),
                                    "after_tokens_per_s": round(speeds["after"], 1),
                                    "after_over_before": round(speeds["after"] / speeds["before"], 4),
                                    "identical_outputs": f"{same}/{len(outputs['after'])}"}
                print(key, translation[key], flush=True)
    metrics["translation"] = translation
    write_results(args.out, "relayout_speed", "python " + shlex.join(sys.argv), metrics,
                  before=commit_of(args.before), after_version=attnkit.__version__, threads=args.threads,
                  checkpoint=args.checkpoint if trained is not None else None,
                  rounds=args.rounds, train_steps_per_round=args.train_steps, sentences_batch64=args.sentences,
                  sentences_batch1=args.sentences_one)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
