"""attnkit train and attnkit demo: a run directory's training, which never replaces an earlier run unless asked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attnkit.cli.common import at_least
from attnkit.errors import AttnkitError


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--run-dir", help="default: runs/<name>")
    p.add_argument("--data-dir", help="default: $ATTNKIT_DATA, then ../shared/data")
    p.add_argument("--resume", nargs="?", const="last", help="continue from a checkpoint (default: the run's last)")
    p.add_argument("--overwrite", action="store_true",
                   help="start again in a run directory that holds checkpoints, removing them, its metrics and "
                        "config (its tokenizer files are kept and reused; default: refuse)")
    p.set_defaults(func=cmd_train)


def add_demo(sub) -> None:
    p = sub.add_parser("demo", help="train a small Transformer on dates -> ISO dates, show its attention")
    p.add_argument("--run-dir", default="runs/demo")
    p.add_argument("--minutes", type=float, default=2.5)
    p.add_argument("--steps", type=at_least(1), default=None,
                   help="stop after this many training steps (default: the demo's 3000, or --minutes first)")
    p.set_defaults(func=cmd_demo)


def cmd_train(args) -> int:
    import torch

    from attnkit.config import load_config
    from attnkit.train import Trainer

    overrides = args.set + ([f"train.threads={args.threads}"] if args.threads else [])  # --threads wins
    cfg = load_config(args.config, overrides)
    run_dir = Path(args.run_dir or Path("runs") / cfg.name)
    _check_run_dir(args, run_dir)
    created = not run_dir.exists()
    try:
        trainer = Trainer(cfg, run_dir, data_dir=args.data_dir)
        if args.resume:
            trainer.resume(args.resume if args.resume != "last" else run_dir)
    except BaseException:
        if created:  # refused before training started: leave no run directory behind
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    n_params = sum(p.numel() for p in trainer.model.parameters())
    print(f"{cfg.name}: {n_params / 1e6:.1f}M parameters, {len(trainer.task.lengths('train')[0])} training examples, "
          f"run dir {run_dir}, {torch.get_num_threads()} threads", file=sys.stderr)
    result = trainer.train()
    print(json.dumps(result))
    return 0


def _check_run_dir(args, run_dir: Path) -> None:
    """Nothing of an existing run is replaced unless asked: a run directory with checkpoints needs --resume
    (continue it) or --overwrite (start again, its checkpoints and metrics removed). Checked before any work."""
    overwrite = getattr(args, "overwrite", False)
    if args.resume and overwrite:
        raise AttnkitError("--resume and --overwrite: give one (continue the run, or start it again)")
    if run_dir.exists() and not run_dir.is_dir():
        raise AttnkitError(f"--run-dir {run_dir}: exists and is not a directory")
    ckpts = run_dir / "checkpoints"
    has_checkpoints = ckpts.is_dir() and any(not p.name.startswith(".") for p in ckpts.iterdir())
    if args.resume:
        if args.resume == "last":
            if not has_checkpoints:
                raise AttnkitError(f"--resume: {run_dir} has no checkpoints to resume from (train without --resume)")
        else:
            from attnkit.checkpoint import resolve_checkpoint

            resolve_checkpoint(args.resume)
        return
    if has_checkpoints:
        if not overwrite:
            raise AttnkitError(f"--run-dir {run_dir}: already holds checkpoints; pass --resume to continue that run "
                               "or --overwrite to replace it")
        import shutil

        shutil.rmtree(ckpts, ignore_errors=True)  # every rank under torchrun: whichever comes first
        for name in ("metrics.jsonl", "config.toml"):
            (run_dir / name).unlink(missing_ok=True)


def cmd_demo(args) -> int:
    from attnkit.demo import run_demo

    return run_demo(Path(args.run_dir), minutes=args.minutes, max_steps=args.steps)
