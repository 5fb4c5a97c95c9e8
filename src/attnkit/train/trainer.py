"""The training loop: teacher forcing, accumulation, clipping, validation, checkpoints, exact resume."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from attnkit.checkpoint import (
    checkpoint_damage,
    checkpoint_is_intact,
    remove_debris,
    verify_files,
    verify_model_config,
)
from attnkit.config import ExperimentConfig, TrainConfig, check_positions, dump_toml
from attnkit.data import Parallel, token_batches
from attnkit.errors import AttnkitError
from attnkit.fast import bound_kernel_caches, reference, use
from attnkit.train import distributed, sharding
from attnkit.train.checkpoint import (
    average_checkpoints,
    load_weights,
    point,
    read_meta,
    read_trainer_state,
    resolve_checkpoint,
    set_aside,
    step_directories,
    step_number,
    write_checkpoint,
)
from attnkit.train.schedule import learning_rate
from attnkit.train.tasks import make_task


@dataclass
class Progress:
    """Where training stands; saved in meta.json so --resume continues exactly here."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # index of the next batch of this epoch
    train_seconds: float = 0.0
    train_tokens: int = 0
    best_score: float | None = None
    validations_since_best: int = 0  # early stopping (train.patience) counts these
    history: list[str] = field(default_factory=list)  # checkpoint directory names, oldest first
    schedule_steps: int = 0  # the schedule's last step as train.fit_schedule set it (0: not fitted)
    precision: str = ""  # what train.precision = "auto" measured faster here, which a resumed run keeps ("": none)
    fast: dict[str, bool] = field(default_factory=dict)  # the timed decisions of train.fast's tricks, kept likewise

    # the progress bar: a run stops at max_steps or when train.max_minutes of training time are spent, whichever
    # comes first, so its ETA is the smaller of the two (a 100,000-step cap under a 60-minute budget is not 15 h)

    def steps_left(self, max_steps: int, max_minutes: float = 0.0, steps_per_second: float | None = None) -> float:
        """Steps this run still takes: to max_steps, or fewer when the time budget (``max_minutes``, 0: none)
        runs out first at ``steps_per_second`` of training time (None: not measured yet, the budget not used)."""
        left = float(max(max_steps - self.step, 0))
        if max_minutes and steps_per_second:
            left = min(left, self.budget_left(max_minutes) * steps_per_second)
        return left

    def budget_left(self, max_minutes: float) -> float:
        """Seconds of training time left in a ``max_minutes`` budget (inf for none)."""
        return max(max_minutes * 60 - self.train_seconds, 0.0) if max_minutes else math.inf

    def eta_seconds(self, max_steps: int, max_minutes: float = 0.0,
                    steps_per_second: float | None = None) -> float | None:
        """Seconds of training left: the smaller of the step-based estimate and the budget left; None while
        neither is known (no rate measured, no budget)."""
        by_steps = max(max_steps - self.step, 0) / steps_per_second if steps_per_second else math.inf
        eta = min(by_steps, self.budget_left(max_minutes))
        return None if math.isinf(eta) else eta

    def expected_total(self, max_steps: int, max_minutes: float = 0.0,
                       steps_per_second: float | None = None) -> int | None:
        """The step the run should end at, the bar's total: with it the bar's ETA (steps to go over its rate) is
        :meth:`eta_seconds`. None while a budget is set and no rate is measured yet (the bar then shows no ETA)."""
        if max_minutes and not steps_per_second and self.step < max_steps:
            return None
        return self.step + math.ceil(self.steps_left(max_steps, max_minutes, steps_per_second))


def training_precision(precision: str, device: torch.device) -> str:
    """``train.precision`` with "auto" resolved by the hardware: bf16 where ``device`` has bf16 matrix instructions (a
    CPU with AVX512_BF16 or AMX-BF16, a CUDA GPU that supports bf16), else fp32. On a CPU the Trainer then keeps
    bf16 only where it measures faster (:meth:`Trainer.choose_precision`)."""
    from attnkit.fast.precision import NEEDS, cpu_flags

    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and any(f in cpu_flags() for f in NEEDS["bf16"]) else "fp32"


def mixed_precision(precision: str, device: torch.device):
    """``train.precision`` (resolved by :func:`training_precision`) -> (autocast dtype or None, GradScaler or
    None). On CUDA bf16, or fp16 with loss scaling. On a CPU bf16 only, and only where the CPU has AVX512_BF16 or
    AMX-BF16: elsewhere bfloat16 matrix products run tens of times slower than fp32, so it is refused in one line
    naming what is missing."""
    from attnkit.fast.precision import NEEDS, check_precision

    if precision == "fp32":
        return None, None
    if device.type != "cuda":
        if precision == "fp16":
            raise AttnkitError(f"train.precision = 'fp16' is for CUDA, and this run is on the {device.type}: use bf16 "
                               f"(on a CPU with {' or '.join(NEEDS['bf16'])}) or fp32")
        try:
            check_precision("bf16", "cpu")
        except AttnkitError as e:
            raise AttnkitError(f"train.{e} on this {device.type}: use fp32") from None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return dtype, (torch.amp.GradScaler(device.type) if precision == "fp16" else None)


def gradient_sync(model, sync: bool):
    """A context in which backward reduces gradients over ranks only if ``sync`` (DDP's ``no_sync``, FSDP's
    ``set_requires_gradient_sync``): accumulated batches all-reduce once, at an update's last one."""
    if sharding.is_sharded(model):
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if sync else model.no_sync()


def make_optimizer(model, t) -> torch.optim.Optimizer:
    """``train.optimizer``: Adam, whose ``weight_decay`` adds an L2 term to the gradient, or AdamW (Loshchilov &
    Hutter 2019), which decays the weights themselves, and (as BERT's fine-tuning) not biases nor LayerNorm
    gains: the parameters with one dimension."""
    if t.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=t.lr, betas=t.betas, eps=t.eps, weight_decay=t.weight_decay,
                                fused=True)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() > 1], "weight_decay": t.weight_decay},
              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=t.betas, eps=t.eps, fused=True)


def checkpoint_of(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory standing for its last checkpoint."""
    path = Path(path)
    if not (path / "model.safetensors").exists() and (path / "checkpoints" / "last").exists():
        path = (path / "checkpoints" / "last").resolve()
    return resolve_checkpoint(path)


class Trainer:
    """Trains ``task``'s model (by default a TranslationTask built from ``cfg``) into ``run_dir``."""

    def __init__(self, cfg: ExperimentConfig, run_dir: str | Path, data_dir: str | None = None,
                 train_pairs: Parallel | None = None, valid_pairs: Parallel | None = None, task=None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        bound_kernel_caches()  # before the first product: see attnkit.fast.memory
        check_positions(cfg)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.device = distributed.training_device(cfg.train.device)
        self.use_precision(training_precision(cfg.train.precision, self.device))
        self.rank, self.world = distributed.setup(self.device)
        self.task = task or make_task(cfg, self.run_dir, data_dir, train_pairs, valid_pairs, self.world, self.rank)
        self.metrics = {m.name: m for m in self.task.metrics}
        self.metric = cfg.train.best_metric or self.task.metric
        if self.metric not in self.metrics:
            raise AttnkitError(f"train.best_metric = {self.metric!r}: this task's validation reports "
                               f"{', '.join(self.metrics)}")
        torch.manual_seed(cfg.train.seed)
        self.progress = Progress()  # before the model: train.fast's timed tricks write their decisions into it
        self.model = self.build_model()
        if cfg.train.init_from:
            self.init_from(cfg.train.init_from)
        self.model.to(self.device)
        self.forward_model = self.model
        self._unsharded = None  # under FSDP, rank 0's whole copy for validation and checkpoints
        if self.world > 1:
            torch.manual_seed(cfg.train.seed + 1000 * self.rank)  # same initial weights, different dropout
            if cfg.train.parallel == "fsdp":
                self.forward_model = sharding.shard(self.model)  # in place: self.model is the sharded model
            else:
                self.forward_model = torch.nn.parallel.DistributedDataParallel(
                    self.model, device_ids=None if self.device.type == "cpu" else [self.device.index])
        t = cfg.train
        self.optimizer = make_optimizer(self.model, t)
        self._recorded = False  # config.toml and run.jsonl are written when training starts, not before: a
        # rejected --resume leaves the run as it was
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.writer = None
        if t.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise AttnkitError("train.tensorboard = true needs the tensorboard package (pip install tensorboard)") \
                    from None
            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def _record_run(self) -> None:
        """config.toml, a run.jsonl line, and what a killed checkpoint write left behind: once, as training starts."""
        if self._recorded or self.rank != 0:
            return
        self._recorded = True
        (self.run_dir / "config.toml").write_text(dump_toml(self.cfg), encoding="utf-8")
        self._record_provenance()
        remove_debris(self.ckpt_dir)

    def _record_provenance(self) -> None:
        """Append who started this run with what (command line, code, versions) to run.jsonl: resumes add lines."""
        from attnkit.evaluate.results import git_commit, machine, versions

        local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in self.model.parameters())
        record = {"argv": sys.argv, "world_size": self.world, "parallel": self.cfg.train.parallel if self.world > 1
                  else None, "precision": self.precision, "parameters_on_rank0": local, "git_commit": git_commit(),
                  "versions": versions(), "machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(self.run_dir / "run.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    # --- state

    def trainer_tensors(self) -> dict[str, torch.Tensor]:
        """RNG states and optimizer moments, whole (gathered under FSDP): every rank calls this."""
        tensors = {f"rng.torch.{r}": state for r, state in enumerate(distributed.gather_rng(self.world))}
        if self.device.type == "cuda":  # dropout draws on the GPU
            tensors.update({f"rng.cuda.{r}": state for r, state in enumerate(distributed.gather_rng(self.world, True))})
        for i, state in self.optimizer.state_dict()["state"].items():
            for name, value in state.items():
                tensors[f"optim.{i}.{name}"] = sharding.full(torch.as_tensor(value)).clone()
        if self.scaler is not None:
            tensors["amp.scale"] = torch.tensor([self.scaler.get_scale()], dtype=torch.float64)
            tensors["amp.growth_tracker"] = torch.tensor([self.scaler.state_dict()["_growth_tracker"]])
        return tensors

    def build_model(self):
        """The task's model with the fast runtime's tricks named in ``train.fast`` (:func:`attnkit.fast.use`), which
        time what pays on this machine once and follow the decisions in ``progress.fast`` after."""
        model = self.task.build_model()
        return use(model, *self.cfg.train.fast, choices=self.progress.fast) if self.cfg.train.fast else model

    def follow_fast_choices(self, decided: dict[str, bool]) -> None:
        """Compute as the run's first process did: where the resumed progress's ``fast`` holds other decisions of
        ``train.fast``'s timed tricks than this process made building the model (``decided``), install the tricks
        again with the kept ones, over the same parameters (the optimizer keeps them). A model sharded by FSDP keeps
        this process's decisions, with one warning line: its layers are not swapped under the sharding."""
        kept = self.progress.fast
        if all(decided.get(name) == value for name, value in kept.items()):
            self.progress.fast = {**decided, **kept}
        elif sharding.is_sharded(self.model):
            if self.rank == 0:
                print(f"attnkit: warning: the run trained with train.fast decisions {kept}, this process decided "
                      f"{decided}; a sharded model keeps them, so the resumed run may differ from an uninterrupted "
                      "one in the last bits", file=sys.stderr, flush=True)
            self.progress.fast = decided
        else:
            use(reference(self.model), *self.cfg.train.fast, choices=kept)  # fills in what kept lacks

    def full_model(self):
        """The model with whole weights: itself, or under FSDP an unsharded copy on rank 0 (None elsewhere).
        Every rank calls this: the weights are gathered."""
        if not sharding.is_sharded(self.model):
            return self.model
        state = {name: sharding.full(value) for name, value in self.model.state_dict().items()}
        if self.rank != 0:
            return None
        if self._unsharded is None:
            self._unsharded = self.build_model().to(self.device)
        self._unsharded.load_state_dict(state)
        return self._unsharded

    def init_from(self, path: str | Path) -> None:
        """Start from another run's weights (fine-tuning): the model and its tokenizer files must match."""
        path = checkpoint_of(path)
        for mine in self.task.files:
            theirs = path / Path(mine).name
            if not theirs.is_file() or theirs.read_bytes() != Path(mine).read_bytes():
                raise AttnkitError(f"train.init_from: {theirs} is not this run's {Path(mine).name}: fine-tuning "
                                   "needs the pretrained model's tokenizer (e.g. data.spm_model, shared)")
        load_weights(self.model, path / "model.safetensors")

    def resume(self, path: str | Path) -> None:
        """Load weights, optimizer moments, RNG and data position from a checkpoint (or a run's last one).

        Every file is verified against the checkpoint's meta.json first; given a run directory whose newest
        checkpoint is damaged, the newest intact one is used, and the damaged ones are set aside
        (:meth:`_set_aside_damaged`), with one warning line. A config whose model contradicts the checkpoint's, or
        whose train.max_steps is below its step, is refused. A refused resume writes nothing."""
        path, fell_back_from = self._intact_checkpoint(path)
        meta = read_meta(path)
        verify_model_config(path, self.cfg, meta, what="the config given to --resume")
        step = meta.get("progress", {}).get("step") if isinstance(meta.get("progress"), dict) else None
        if not isinstance(step, int):
            raise AttnkitError(f"{path}/meta.json: no progress.step; this checkpoint cannot resume training")
        if self.cfg.train.max_steps < step:
            raise AttnkitError(f"train.max_steps = {self.cfg.train.max_steps} is below the step of the checkpoint "
                               f"resumed from ({path.name}, step {step}); raise it or train a new run")
        if sharding.is_sharded(self.model):  # every rank reads the whole weights and keeps its shard
            whole = self.build_model()
            load_weights(whole, path / "model.safetensors")
            sharding.copy_full_into(self.model, whole)
        else:
            load_weights(self.model, path / "model.safetensors")
        tensors = read_trainer_state(path)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        state: dict[int, dict] = {}
        for key, value in tensors.items():
            if key.startswith("optim."):
                _, i, name = key.split(".", 2)
                if int(i) >= len(params):
                    raise AttnkitError(f"{path}/trainer.safetensors: {key} is for a parameter this model lacks")
                state.setdefault(int(i), {})[name] = sharding.shard_like(value, params[int(i)])
        sd = self.optimizer.state_dict()
        sd["state"] = state
        try:
            self.optimizer.load_state_dict(sd)
        except (ValueError, KeyError) as e:
            raise AttnkitError(f"{path}/trainer.safetensors: optimizer state does not fit this model ({e})") from None
        # the same world size continues each rank's dropout stream exactly; another reuses rank 0's
        key = f"rng.torch.{self.rank}"
        torch.set_rng_state(tensors[key if key in tensors else "rng.torch.0"])
        key = f"rng.cuda.{self.rank}"
        if self.device.type == "cuda" and ("rng.cuda.0" in tensors):
            torch.cuda.set_rng_state(tensors[key if key in tensors else "rng.cuda.0"])
        if self.scaler is not None and "amp.scale" in tensors:
            self.scaler.load_state_dict({**self.scaler.state_dict(), "scale": float(tensors["amp.scale"][0]),
                                         "_growth_tracker": int(tensors["amp.growth_tracker"][0])})
        try:
            decided, self.progress = self.progress.fast, Progress(**meta["progress"])
        except TypeError as e:
            raise AttnkitError(f"{path}/meta.json: progress does not describe a training run ({e})") from None
        self.follow_fast_choices(decided)
        self.choose_precision()  # the precision the run measured and kept, if it did
        self._set_aside_damaged(path, step, fell_back_from)
        self._record_run()
        # records a killed run logged after this checkpoint are redone; read_metrics drops them
        self.log({"step": self.progress.step, "resumed_from": path.name})

    def _intact_checkpoint(self, path: str | Path) -> tuple[Path, Path | None]:
        """``path``'s checkpoint, verified; for a run directory whose last checkpoint is damaged or missing, the
        newest intact step-N. -> (checkpoint, the ``last`` link it stands in for, or None)."""
        given = Path(path)
        run_ckpts = given / "checkpoints"
        if (given / "model.safetensors").exists() or not run_ckpts.is_dir():
            path = checkpoint_of(given)
            verify_files(path, resuming=True)
            return path, None
        last = run_ckpts / "last"
        if last.exists() and checkpoint_is_intact(last.resolve()):
            return last.resolve(), None
        for candidate in reversed(step_directories(run_ckpts)):
            if checkpoint_is_intact(candidate):
                return candidate, last
        if last.exists():
            verify_files(last.resolve(), resuming=True)  # names what is wrong
        raise AttnkitError(f"{given}: no intact checkpoint to resume from in {run_ckpts}")

    def _set_aside_damaged(self, resumed: Path, step: int, fell_back_from: Path | None) -> None:
        """Before training writes checkpoints again, rename each damaged step-N of this run to step-N.damaged: one
        newer than the checkpoint resumed from (training would write over it), one the resumed progress keeps
        (it would be averaged, then pruned), or one ``last`` or ``best`` points at. Its files are the evidence of
        what went wrong, kept byte for byte. ``last`` and ``best`` left pointing at nothing are repointed at intact
        checkpoints. One warning line says what was wrong and where it went. Rank 0 alone: the other ranks only
        read, and never a directory moved here."""
        if self.rank != 0:
            return
        ckpts = self.ckpt_dir
        here = ckpts.resolve()
        last, best = ckpts / "last", ckpts / "best"
        resumed_here = resumed.resolve().parent == here
        fallback_note = None
        if fell_back_from is not None:  # the link resume stood in for: say what was wrong with it
            if fell_back_from.is_symlink() and not fell_back_from.exists():
                fallback_note = f"{fell_back_from} points at {os.readlink(fell_back_from)}, which is missing"
            elif not fell_back_from.exists():
                fallback_note = f"{fell_back_from} is missing"
            elif fell_back_from.resolve().parent != here or step_number(fell_back_from.resolve().name) is None:
                fallback_note = f"{fell_back_from} is damaged ({checkpoint_damage(fell_back_from.resolve())})"
            # else a damaged step-N of this run: set aside below, and named there
        suspects = {d.name for d in step_directories(ckpts) if step_number(d.name) > step}
        if resumed_here:  # the history names this run's checkpoints only then
            suspects.update(self.progress.history)
        suspects.update(link.resolve().name for link in (last, best)
                        if link.is_symlink() and link.resolve().parent == here)
        suspects = {name for name in suspects if step_number(name) is not None and (ckpts / name).is_dir()}
        if resumed_here:
            suspects.discard(resumed.name)
        notes = [fallback_note] if fallback_note else []
        moved = set()
        for name in sorted(suspects, key=step_number, reverse=True):
            # an older one may lack its trainer state on purpose (kept for inference); a newer one was passed over
            # by resume for it
            damage = checkpoint_damage(ckpts / name, resuming=step_number(name) > step)
            if damage is not None:
                notes.append(f"{ckpts / name} is damaged ({damage}); moved to {set_aside(ckpts / name)}")
                moved.add(name)
        self.progress.history = [name for name in self.progress.history if name not in moved]
        if last.is_symlink() and not last.exists():
            if resumed_here:
                point(last, ckpts / resumed.name)
            else:
                last.unlink()
        if best.is_symlink() and not best.exists():
            self._repoint_best(step)
        if notes:
            which = f"{resumed.name}, the newest intact checkpoint" if fell_back_from is not None else resumed.name
            print(f"attnkit: warning: {'; '.join(notes)}; resuming from {which}", file=sys.stderr)

    def _repoint_best(self, step: int) -> None:
        """Point ``best`` at the intact checkpoint, at or before ``step``, that holds the best score recorded so
        far; remove it if none does (the next better validation sets it)."""
        best = self.ckpt_dir / "best"
        if self.progress.best_score is not None:
            for directory in reversed(step_directories(self.ckpt_dir)):
                if step_number(directory.name) > step:
                    continue
                try:
                    scores = read_meta(directory).get("scores")
                except AttnkitError:
                    continue
                if isinstance(scores, dict) and self.score_value(scores) == self.progress.best_score \
                        and checkpoint_is_intact(directory, resuming=False):
                    point(best, directory)
                    return
        best.unlink()

    def save(self, model, scores: dict | None = None) -> Path | None:
        """Write a checkpoint of ``model`` (:meth:`full_model`). Every rank calls this (the RNG gather); rank 0
        writes."""
        p = self.progress
        name = f"step-{p.step}"
        if name not in p.history:
            p.history.append(name)
        tensors = self.trainer_tensors()
        stale = p.history[:-max(self.cfg.train.keep_last, self.cfg.train.average_last, 1)]
        del p.history[:len(stale)]
        if self.rank != 0:
            return None
        meta = {"progress": vars(p), "scores": scores or {}}
        path = write_checkpoint(self.ckpt_dir / name, model, self.cfg, self.task.files, meta, tensors)
        point(self.ckpt_dir / "last", path)
        best = self.ckpt_dir / "best"
        for old in stale:
            if step_number(old) is not None and not (best.is_symlink() and best.resolve().name == old):
                shutil.rmtree(self.ckpt_dir / old, ignore_errors=True)
        return path

    # --- logging

    def log(self, record: dict) -> None:
        if self.rank != 0:
            return
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(k, v, record["step"])

    # --- validation

    @torch.no_grad()
    def validate(self, model=None) -> dict:
        """The task's validation scores of ``model`` (default ``self.model``), on this rank."""
        model = self.model if model is None else model
        model.eval()
        scores = self.task.validate(model, self.device, self.cfg.train.max_tokens)
        model.train()
        return scores

    def score_value(self, scores: dict) -> float | None:
        """What ranks checkpoints: ``valid_<name>`` of the task's metric (or train.best_metric), or of the metric
        it falls back to where ``scores`` lacks it; None where neither is there. Higher is better: a metric the task
        declares lower-is-better is negated, so one comparison ranks every metric, and that is the value
        ``progress.best_score`` keeps."""
        metric = self.metrics[self.metric]
        if f"valid_{metric.name}" not in scores and metric.fallback:
            metric = self.metrics[metric.fallback]
        value = scores.get(f"valid_{metric.name}")
        if not isinstance(value, (int, float)):
            return None
        return value if metric.higher_is_better else -value

    def is_better(self, scores: dict) -> bool:
        value = self.score_value(scores)
        if value is None:
            return False
        if self.progress.best_score is None or value > self.progress.best_score:
            self.progress.best_score = value
            self.progress.validations_since_best = 0
            return True
        self.progress.validations_since_best += 1
        return False

    def out_of_patience(self) -> bool:
        """Early stopping: ``train.patience`` validations in a row without a better score."""
        patience = self.cfg.train.patience
        return bool(patience) and self.progress.validations_since_best >= patience

    def evaluate_and_save(self) -> dict:
        model = self.full_model()
        scores = self.validate(model) if self.rank == 0 else {}
        self.log({"step": self.progress.step, "epoch": self.progress.epoch, **scores})
        better = self.rank == 0 and self.is_better(scores)
        path = self.save(model, scores)
        if better:
            best = self.ckpt_dir / "best"
            previous = best.resolve().name if best.is_symlink() else None
            point(best, path)
            if previous and step_number(previous) is not None and previous not in self.progress.history:
                # a step-N kept only because it was best (a set-aside step-N.damaged is never removed)
                shutil.rmtree(self.ckpt_dir / previous, ignore_errors=True)
        distributed.barrier(self.world)
        return scores

    # --- the loop

    def _update(self, group: list[list[int]], lr: float) -> tuple[int, float]:
        """One optimizer step over this rank's share of ``group`` (lists of example indices).

        Returns the number of the task's units (target tokens, or examples) and their summed NLL, over all ranks.
        """
        model, t = self.forward_model, self.cfg.train
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        n_tokens, loss_sum = 0, 0.0
        for k, idx in enumerate(group):
            b = self.task.batch("train", idx).to(self.device)
            sync = self.world == 1 or k == len(group) - 1  # all-reduce gradients once per update
            with gradient_sync(model, sync):
                with self.autocast():
                    loss, nll, count = self.task.loss(model, b, t.label_smoothing)
                (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            n_tokens += count
            loss_sum += float(nll)
        n_tokens = int(distributed.all_sum(n_tokens, self.world))
        loss_sum = distributed.all_sum(loss_sum, self.world)
        if self.scaler is not None:  # fp16: the per-token scaling and clipping see the true gradients
            self.scaler.unscale_(self.optimizer)
        # the loss is a sum over tokens (examples) and DDP (and FSDP) average over ranks: make it a per-token mean
        for param in self.model.parameters():
            if param.grad is not None:
                param.grad.mul_(self.world / n_tokens)
        if t.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_norm)
        if self.scaler is None:
            self.optimizer.step()
        else:  # skipped when a gradient overflowed; the scale then shrinks
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return n_tokens, loss_sum

    def stops_early(self) -> bool:
        """Whether early stopping ends the run now (rank 0 validates and decides for every rank)."""
        stop = distributed.any_true(self.rank == 0 and self.out_of_patience(), self.world)
        if stop and self.rank == 0:
            self.log({"step": self.progress.step, "early_stop": True,
                      "validations_since_best": self.progress.validations_since_best})
        return stop

    def total_steps(self, src_lens, tgt_lens) -> int:
        """The step the run ends at unless a time budget or early stopping ends it first: ``max_steps``, or
        fewer where ``max_epochs`` ends first (the last step of the linear and cosine schedules)."""
        t = self.cfg.train
        if not t.max_epochs:
            return t.max_steps
        per_update = t.update_freq * self.world
        n = len(token_batches(src_lens, tgt_lens, t.max_tokens, seed=t.seed, epoch=0, max_examples=t.batch_size))
        last = n if self.world == 1 else n - per_update + 1
        return min(t.max_steps, t.max_epochs * len(range(0, max(last, 0), per_update)))

    def use_precision(self, precision: str) -> None:
        """Train at ``precision`` (resolved: fp32, bf16 or fp16) from now on."""
        self.precision = precision
        self.amp_dtype, self.scaler = mixed_precision(precision, self.device)

    def choose_precision(self) -> None:
        """``train.precision = "auto"`` on a CPU with bf16 matrix instructions: bf16 only where it trains faster here,
        as measured by :meth:`precision_seconds`, on every rank (else fp32). The instructions alone do not say: the
        Multi30k model trained 1.39x as fast in bf16 on an AMD EPYC Zen 5 and 1.21x on a Zen 4, but 0.55x as fast on
        an Intel Xeon with AMX (bench/results/train_throughput*.json). The choice is kept in the run's progress, so a
        resumed run trains at it without measuring again, and logged with the timings."""
        if self.cfg.train.precision != "auto" or self.device.type != "cpu" or self.precision != "bf16":
            return
        p = self.progress
        if not p.precision:
            seconds = self.precision_seconds()
            faster = distributed.all_sum(int(seconds["bf16"] < seconds["fp32"]), self.world) == self.world
            p.precision = "bf16" if faster else "fp32"
            self.log({"step": p.step, "precision": p.precision,
                      "seconds_per_batch": {k: round(v, 5) for k, v in seconds.items()}})
            if self.rank == 0:
                print(f"attnkit: train.precision = auto: {p.precision} (a batch's forward and backward took "
                      f"{seconds['bf16']:.3f} s in bf16, {seconds['fp32']:.3f} s in fp32)", file=sys.stderr, flush=True)
        self.use_precision(p.precision)

    def precision_seconds(self, rounds: int = 4) -> dict[str, float]:
        """Seconds of the forward pass, loss and backward pass of the first training batch, in fp32 and under bf16
        autocast (the better of ``rounds - 1`` timings each, after one warm-up, the two taking turns), on a model
        built as this one (its own weights, RNG and optimizer untouched)."""
        t = self.cfg.train
        src_lens, tgt_lens = self.task.lengths("train")
        first = token_batches(src_lens, tgt_lens, t.max_tokens, seed=t.seed, epoch=0, max_examples=t.batch_size)[0]
        batch = self.task.batch("train", first).to(self.device)
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        with torch.random.fork_rng(devices=[]):
            model = self.build_model().to(self.device).train()
            for _ in range(rounds):
                for precision in times:
                    start = time.perf_counter()
                    with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                        loss, _, _ = self.task.loss(model, batch, t.label_smoothing)
                    loss.backward()
                    model.zero_grad(set_to_none=True)
                    times[precision].append(time.perf_counter() - start)
        return {precision: min(seconds[1:]) for precision, seconds in times.items()}

    def autocast(self):
        """Mixed precision for the forward pass and loss (``train.precision``); nothing at fp32."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train(self) -> dict:
        t, p = self.cfg.train, self.progress
        self.choose_precision()
        self._record_run()
        self.forward_model.train()
        src_lens, tgt_lens = self.task.lengths("train")
        per_update = t.update_freq * self.world  # batches consumed by one optimizer step, over all ranks
        total_steps = self.total_steps(src_lens, tgt_lens)  # max_steps, or where max_epochs ends first
        if p.schedule_steps:  # fitted to the time budget by the run this one resumes
            total_steps = min(total_steps, p.schedule_steps)
        planned = total_steps  # where the schedule ends unless fitted to the time budget
        fit = FittedSchedule(t, p) if t.fit_schedule and t.max_minutes and not p.schedule_steps else None
        unit = self.task.unit
        bar = tqdm(total=p.expected_total(total_steps, t.max_minutes), initial=p.step,
                   disable=not t.progress or self.rank != 0, file=sys.stderr, dynamic_ncols=True,
                   mininterval=1.0 if sys.stderr.isatty() else 60.0, desc="train")
        bar_from = (p.step, p.train_seconds)  # this session's rate sets where a time budget ends the run
        start = time.monotonic() - p.train_seconds
        window_loss, window_tokens, window_start = 0.0, 0, p.train_seconds  # throughput over training time only
        scores: dict = {}
        stop = p.step >= (p.schedule_steps or t.max_steps)  # a run resumed at its last step trains no further
        while not stop:
            if t.max_epochs and p.epoch >= t.max_epochs:
                break
            batches = token_batches(src_lens, tgt_lens, t.max_tokens, seed=t.seed, epoch=p.epoch,
                                    max_examples=t.batch_size)
            # every rank needs a batch for each step: an epoch's last, incomplete group is skipped
            last = len(batches) if self.world == 1 else len(batches) - per_update + 1
            while p.batch_in_epoch < last:
                group = batches[p.batch_in_epoch: p.batch_in_epoch + per_update][self.rank::self.world]
                lr = learning_rate(p.step + 1, t, self.cfg.model.width, total_steps)
                n_tokens, loss_sum = self._update(group, lr)
                p.step += 1
                p.batch_in_epoch += per_update
                p.train_tokens += n_tokens
                p.train_seconds = time.monotonic() - start
                window_loss += loss_sum
                window_tokens += n_tokens
                if fit is not None and fit.measure(p):
                    p.schedule_steps = fit.steps(p, self.world)
                    total_steps, fit = min(planned, p.schedule_steps), None if fit.done else fit
                    self.log({"step": p.step, "schedule_steps": p.schedule_steps})
                rate = (p.step - bar_from[0]) / max(p.train_seconds - bar_from[1], 1e-9)
                bar.total = p.expected_total(total_steps, t.max_minutes, rate)
                bar.update(1)
                if p.step % t.log_every == 0:
                    elapsed = p.train_seconds - window_start
                    record = {"step": p.step, "epoch": p.epoch, "lr": lr, "train_nll": window_loss / window_tokens,
                              f"{unit}_per_s": window_tokens / max(elapsed, 1e-9), "minutes": p.train_seconds / 60}
                    self.log(record)
                    bar.set_postfix(nll=f"{record['train_nll']:.3f}", per_s=f"{record[f'{unit}_per_s']:.0f}")
                    window_loss, window_tokens, window_start = 0.0, 0, p.train_seconds
                out_of_time = bool(t.max_minutes) and p.train_seconds >= t.max_minutes * 60
                stop = p.step >= (p.schedule_steps or t.max_steps) or distributed.any_true(out_of_time, self.world)
                if stop or (t.eval_every and p.step % t.eval_every == 0):
                    scores = self.evaluate_and_save()
                    start = time.monotonic() - p.train_seconds  # validation time is not training time
                    stop = stop or self.stops_early()
                elif t.save_every and p.step % t.save_every == 0:
                    self.save(self.full_model())
                if stop:
                    break
            else:
                p.epoch += 1
                p.batch_in_epoch = 0
                if not t.eval_every:
                    scores = self.evaluate_and_save()
                    start = time.monotonic() - p.train_seconds
                    if self.stops_early():
                        break
        bar.close()
        if f"step-{p.step}" not in p.history:
            scores = self.evaluate_and_save()
        if self.rank == 0 and t.average_last > 1 and len(p.history) >= 2:
            paths = [self.ckpt_dir / n for n in p.history[-t.average_last:]]
            average_checkpoints(paths, self.ckpt_dir / "averaged")
        distributed.barrier(self.world)
        return {"step": p.step, "epoch": p.epoch, "train_minutes": p.train_seconds / 60,
                f"{unit}_per_s": p.train_tokens / max(p.train_seconds, 1e-9), **scores}


class FittedSchedule:
    """``train.fit_schedule``: the step where ``train.max_minutes`` of training end, so that a cosine or linear
    schedule ends with the budget on whatever machine runs it (a fixed max_steps tuned on one CPU left another's
    learning rate undecayed when its time ran out). The speed is measured over the second half of warmup (at least
    steps 5 to 10: the first steps pay for start-up), which gives the schedule its end before it decays; then once
    more over the steps that follow, up to a fifth of the steps that end left, and the end moves there. Warmup's
    few steps time the speed roughly: LAS on spoken digits, whose batches differ in length, took from 0.51 to 0.71 s
    a step over windows of 25 steps, and fitted at warmup alone it ended with an eighth of its budget unused. Moving
    the end by a tenth, a fifth of the way into the decay, changes a cosine's learning rate there by about 2%. A
    resumed run keeps the end it was given. Every rank takes the ranks' mean, so all agree. The estimate keeps 3% of
    the budget in hand for checkpoints, whose writing counts as training time."""

    MARGIN = 0.97

    def __init__(self, t: TrainConfig, p: Progress):
        self.t = t
        self.at = max(t.warmup_steps, 10)  # learning rates up to here do not depend on the last step
        self.start = None if p.step < self.at // 2 else (p.step, p.train_seconds)
        self.fitted = 0  # how many times the end was set

    def measure(self, p: Progress) -> bool:
        """Called after each step: whether the speed is measured now (then :meth:`steps`)."""
        if self.start is None and p.step >= self.at // 2:
            self.start = (p.step, p.train_seconds)
        return self.start is not None and p.step >= max(self.at, self.start[0] + 5)

    def steps(self, p: Progress, world: int) -> int:
        """The schedule's last step, from the speed since the measurement began; the next measurement begins here
        and ends a fifth of the way to that step (a step count, so that every rank measures at the same step)."""
        seconds_per_step = (p.train_seconds - self.start[1]) / (p.step - self.start[0])
        left = max(self.t.max_minutes * 60 - p.train_seconds, 0.0) * self.MARGIN
        estimate = distributed.all_sum(left / max(seconds_per_step, 1e-9), world) / world
        last = min(self.t.max_steps, p.step + max(int(estimate), 1))
        self.fitted += 1
        self.start, self.at = (p.step, p.train_seconds), p.step + max((last - p.step) // 5, 5)
        return last

    @property
    def done(self) -> bool:
        """Whether the end is set for good: measured at warmup, then once more."""
        return self.fitted == 2


def read_metrics(run_dir: str | Path) -> list[dict]:
    """A run's metrics.jsonl as one history: what a killed run logged after the checkpoint it was resumed
    from is dropped, since the resumed run logs those steps again. Each resume leaves its marker record."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise AttnkitError(f"{path}: no such file (did the run train?)")
    records: list[dict] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise AttnkitError(f"{path}:{n}: not a JSON record ({e.msg})") from None
        if "resumed_from" in record:
            records = [r for r in records if r["step"] <= record["step"]]
        records.append(record)
    return records
