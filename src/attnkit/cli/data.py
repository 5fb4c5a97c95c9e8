"""attnkit data fetch: the data sets, downloaded from upstream (or a mirror) with their checksums verified."""

from __future__ import annotations

from attnkit.cli.common import positive_float


def add_data(sub) -> None:
    p = sub.add_parser("data", help="data sets (data fetch)")
    data = p.add_subparsers(dest="data", required=True)
    p = data.add_parser("fetch", help="download data sets from upstream into the data directory, checksums verified")
    p.add_argument("names", nargs="+", metavar="NAME",
                   choices=("multi30k", "tatoeba", "flickr8k", "tinyshakespeare", "wikitext2", "all"),
                   help="multi30k, tatoeba, flickr8k, tinyshakespeare, wikitext2, or all")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--source", metavar="URL", help="a mirror (http(s)://, file:// or a directory) holding each "
                                                   "file at URL/HOST/PATH of its upstream URL (default: "
                                                   "$ATTNKIT_DATA_MIRROR, else upstream)")
    p.add_argument("--overwrite", action="store_true", help="replace existing files whose checksum differs")
    p.add_argument("--timeout", type=positive_float, default=60.0,
                   help="seconds to wait for a server (default 60)")
    p.add_argument("--list", action="store_true", help="print each upstream URL, its checksum and target; "
                                                       "download nothing")
    p.set_defaults(func=cmd_data_fetch, needs_torch=False)


def cmd_data_fetch(args) -> int:
    from attnkit.data.fetch import fetch, sources

    if args.list:
        print("\n".join(sources(args.names)))
        return 0
    for line in fetch(args.names, args.data_dir, args.source, overwrite=args.overwrite, timeout=args.timeout):
        print(line)
    return 0
