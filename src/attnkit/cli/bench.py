"""Measurements and their figures: attnkit bench complexity, and attnkit plot-by-length (BLEU against source
length, from attnkit evaluate --by-length --json or a benchmark's results)."""

from __future__ import annotations

import json
from pathlib import Path

from attnkit.cli.common import at_least, check_output
from attnkit.errors import AttnkitError


def add_plot_by_length(sub) -> None:
    p = sub.add_parser("plot-by-length", help="plot BLEU against source length for several systems")
    p.add_argument("results", nargs="+", help="JSON files of attnkit evaluate --by-length --json (or bench results)")
    p.add_argument("--output", "-o", required=True)
    p.add_argument("--labels", nargs="+", help="one name per system (default: the file names)")
    p.add_argument("--title", default="")
    p.set_defaults(func=cmd_plot_by_length, needs_torch=False)


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="measurements (bench complexity)")
    bench = p.add_subparsers(dest="bench", required=True)
    p = bench.add_parser("complexity", help="time, memory, sequential steps and path length of one RNN, "
                                            "convolution and self-attention layer as n and d vary")
    p.add_argument("--quick", action="store_true", help="a few small sizes, in seconds (what the tests run)")
    p.add_argument("--out", help="the results JSON (default bench/results/complexity.json; "
                                 "complexity_quick.json with --quick)")
    p.add_argument("--plot", help="the figure (default: the JSON's name with .png)")
    p.add_argument("--threads", type=at_least(1), default=1, help="torch threads for the timings (default 1)")
    p.set_defaults(func=cmd_bench)


def _by_length_rows(path: str) -> dict[str, list[dict]]:
    """By-length rows from `attnkit evaluate --json`, a benchmark's results JSON, or bench/bleu_by_length.py's."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AttnkitError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise AttnkitError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise AttnkitError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if not isinstance(data, dict):
        raise AttnkitError(f"{path}: expected a JSON object with by_length rows, got a {type(data).__name__}")
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

    check_output(args.output)
    systems: dict[str, list[dict]] = {}
    for path in args.results:
        for name, rows in _by_length_rows(path).items():
            systems[name if name not in systems else f"{path}:{name}"] = rows  # two results.json files
    if args.labels:
        if len(args.labels) != len(systems):
            raise AttnkitError(f"--labels gives {len(args.labels)} names for {len(systems)} systems")
        systems = dict(zip(args.labels, systems.values()))
    plot_bleu_by_length(systems, args.output, title=args.title)
    print(args.output)
    return 0


def cmd_bench(args) -> int:
    from attnkit import bench_complexity

    return bench_complexity.main(args)
