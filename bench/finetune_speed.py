"""Fine-tuning and classification speed side by side: attnkit against Hugging Face on the same MiniLM and SST-2.

Training. all-MiniLM-L6-v2 with a classification head over BERT's [CLS] pooler, loaded twice from the same
directory: attnkit's ``load_pretrained_classifier(pooling="cls")`` and transformers'
``AutoModelForSequenceClassification``, the new head copied from attnkit's so that both start from the same
weights. Both take the same SST-2 training batches: attnkit's length-grouped batches of --batch-size examples, each
padded to its own longest (the same examples and the same sequence lengths on both sides), with the same AdamW
(configs/glue_sst2.toml's lr, betas, eps and weight decay, biases and LayerNorm gains not decayed, fused), the same
linear schedule (Hugging Face's, which its Trainer uses), clipping at 1.0, dropout 0.1 and the same torch threads.
attnkit steps as ``attnkit train`` does: the fast runtime's training tricks, the loss summed over the batch and the
gradients scaled to its mean. Hugging Face runs its ``Trainer`` over a dataset whose items are those batches (the
sequential sampler, batches of one item, a collator that hands each batch through): its own loop, data loader and
bookkeeping. The two alternate in one process: a Trainer callback, at the end of every --steps-th step, stops
Hugging Face's clock, runs attnkit's next round of --steps steps and starts the clock again, so drift in the
machine's speed falls on both. Throughput: training examples per second of training steps.

Inference. The 872 SST-2 dev sentences classified, in batches of --batch-size sentences each padded to its
longest, the systems taking turns in --rounds rounds, each called on a round's sentences as a user calls it on a
list: ``attnkit.decode.classify`` (attnkit's tokenizer included), which sorts its inputs by length before cutting
the batches, and transformers' ``pipeline("text-classification")`` on the Hugging Face export of the same model,
which cuts them in input order; onnxruntime on the ONNX export runs attnkit's batches (attnkit's tokenizer, the
same sentences per batch), so that it compares kernels on the same inputs. attnkit classifies as
``attnkit.load(run).classify`` does, with the fast runtime's copy of the model (``attnkit.fast.classifier``: the
fused attention kernel); beside it, for reference: the core's kernels, attnkit on the pipeline's own batches (input
order), and where the CPU has the instructions, the same copy at bf16 and int8 (``--precision``). The model:
--checkpoint's (a fine-tuned ``bert_classifier`` run), else attnkit's at the end of the training part.
BertForSequenceClassification has no mean pooling: a mean-pooled checkpoint's pipeline runs a [CLS] pooled twin of
it (same encoder and head, one more d x d layer; its labels are not compared). Checked on the way:
each export's largest logit difference, and the systems' agreement and dev accuracy.

    python bench/finetune_speed.py                          # -> bench/results/finetune_speed.json
    python bench/finetune_speed.py --checkpoint runs/glue_sst2 --rounds 4 --steps 25

Hugging Face's Trainer needs the accelerate package; ``--hf-loop`` times Hugging Face's model under the same plain
loop as attnkit instead (recorded as such). Targets: attnkit trains >= 1.5x the Trainer's examples/s; classifies
>= 2x the pipeline's sentences/s and >= 1.0x onnxruntime's.
"""

from __future__ import annotations

# MKL's kernels chosen by the CPU's instructions, asked for before torch loads (attnkit.mkl), as the attnkit command
# line asks for them
if __name__ == "__main__":
    from attnkit.mkl import use_feature_kernels

    use_feature_kernels()

import argparse
import copy
import importlib.metadata
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from attnkit import fast
from attnkit.checkpoint import load_checkpoint
from attnkit.data import WordPiece, read_glue, token_batches
from attnkit.data.wordpiece import collate_sentences
from attnkit.decode import classify
from attnkit.errors import AttnkitError
from attnkit.evaluate.results import write_results
from attnkit.export.classifier import (
    OnnxClassifier,
    hf_state,
    huggingface_gap,
    load_huggingface,
    onnx_feed,
    onnx_gap,
    write_huggingface,
    write_onnx,
)
from attnkit.fast.memory import keep_freed_memory
from attnkit.fast.precision import NEEDS, cpu_flags
from attnkit.models import SequenceClassifier, load_pretrained_classifier
from attnkit.models.bert import minilm_dir

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni",
              "amx_bf16", "amx_int8", "amx_tile")
TARGETS = {"train_speedup_vs_huggingface": 1.5, "inference_speedup_vs_pipeline": 2.0,
           "inference_speedup_vs_onnxruntime": 1.0}


def linear_schedule(step: int, lr: float, warmup: int, total: int) -> float:
    """Hugging Face's ``get_linear_schedule_with_warmup`` (the Trainer's default) at optimizer step ``step``
    (0-based): up from 0 over ``warmup`` steps, then down to 0 at ``total``."""
    if step < warmup:
        return lr * step / max(1, warmup)
    return lr * max(0.0, (total - step) / max(1, total - warmup))


def training_batches(tokenizer: WordPiece, n: int, batch_size: int, seed: int, data_dir):
    """The first ``n`` of attnkit's shuffled, length-grouped SST-2 training batches (as ``attnkit train`` cuts them):
    -> ([(SentenceBatch, class ids [B])], the label names)."""
    train = read_glue("sst2", "train", data_dir)
    index = {name: i for i, name in enumerate(train.label_names)}
    examples = [tokenizer.example(text) for text in train.texts]
    order = token_batches([len(ids) - 1 for ids, _ in examples], [0] * len(examples), 100_000, seed=seed,
                          max_examples=batch_size)[:n]
    if len(order) < n:
        raise AttnkitError(f"SST-2 has {len(order)} batches of {batch_size}, fewer than the {n} asked for")
    return [(collate_sentences([examples[i] for i in idx], tokenizer.pad_id),
             torch.tensor([index[train.labels[i]] for i in idx])) for idx in order], list(train.label_names)


def hf_inputs(batch, targets) -> dict:
    return {"input_ids": batch.tokens, "attention_mask": (~batch.padding_mask).long(),
            "token_type_ids": batch.token_types, "labels": targets}


def make_adamw(model, args) -> torch.optim.AdamW:
    """AdamW over two groups, as both attnkit (``make_optimizer``) and the Trainer make it: weight decay on the
    matrices, none on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() > 1], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() <= 1], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.999), eps=args.eps, fused=True)


class Loop:
    """One model under a plain training loop (attnkit's step, or Hugging Face's model with ``--hf-loop``).

    ``loss(batch, targets)`` -> a scalar to backpropagate; with ``summed`` it is a sum over the batch and the
    gradients are scaled to its mean after backward, as attnkit's ``Trainer._update`` does."""

    def __init__(self, model, loss, args, total_steps: int, summed: bool = False, autocast: torch.dtype | None = None):
        self.model, self.loss, self.args, self.total, self.summed = model, loss, args, total_steps, summed
        self.autocast = autocast  # mixed precision for the forward pass and loss, as train.precision does
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = make_adamw(model, args)
        self.step, self.seconds, self.examples = 0, 0.0, 0

    def run(self, batches, timed: bool = True) -> None:
        self.model.train()
        for batch, targets in batches:
            start = time.perf_counter()
            for g in self.opt.param_groups:
                g["lr"] = linear_schedule(self.step, self.args.lr, self.args.lr_warmup, self.total)
            with torch.autocast("cpu", dtype=self.autocast, enabled=self.autocast is not None):
                loss = self.loss(batch, targets)
            loss.backward()
            if self.summed:
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(1 / len(batch))
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            if timed:
                self.seconds += time.perf_counter() - start
                self.examples += len(batch)


def train_with_trainer(hf, batches, args, attnkit_round, total_steps: int, tmp: Path) -> tuple[float, int, int]:
    """Hugging Face's Trainer on ``batches``, calling ``attnkit_round(r)`` (r = -1: the warm-up) between its rounds
    -> (its timed seconds, examples, torch threads at the end)."""
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Batches(Dataset):
        """Each item one whole prepared batch: with batches of one item and :func:`unwrap` as the collator the
        Trainer's data loader yields exactly attnkit's batches, in order."""

        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    def unwrap(features):
        return features[0]

    class Interleave(TrainerCallback):
        def __init__(self):
            self.seconds, self.examples, self.mark = 0.0, 0, None

        def on_train_begin(self, *_, **__):
            torch.set_num_threads(args.threads)

        def on_step_end(self, _args, state, control, **__):
            now, step = time.perf_counter(), state.global_step
            if step == args.warmup:
                attnkit_round(-1)
            elif step > args.warmup and (step - args.warmup) % args.steps == 0:
                self.seconds += now - self.mark
                first = step - args.steps
                self.examples += sum(len(b["labels"]) for b in batches[first:step])
                attnkit_round((step - args.warmup) // args.steps - 1)
            else:
                return
            self.mark = time.perf_counter()

    training = TrainingArguments(
        output_dir=str(tmp / "trainer"), max_steps=total_steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=1, learning_rate=args.lr, weight_decay=args.weight_decay, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=args.eps, max_grad_norm=1.0, lr_scheduler_type="linear",
        warmup_steps=args.lr_warmup, optim="adamw_torch_fused", train_sampling_strategy="sequential",
        remove_unused_columns=False, dataloader_num_workers=0, dataloader_pin_memory=False, logging_strategy="no",
        save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True, seed=args.seed)
    clock = Interleave()
    trainer = Trainer(model=hf, args=training, train_dataset=Batches(batches), data_collator=unwrap,
                      callbacks=[clock])
    trainer.train()
    return clock.seconds, clock.examples, torch.get_num_threads()


def fine_tune(args, tokenizer: WordPiece, tmp: Path) -> tuple[dict, SequenceClassifier]:
    """The training part -> (its record, attnkit's model after it)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    directory = minilm_dir()
    total = args.warmup + args.rounds * args.steps
    data, labels = training_batches(tokenizer, total, args.batch_size, args.seed, args.data_dir)
    ours = load_pretrained_classifier(directory, len(labels), "cls", 0.1, labels=labels, seed=args.seed)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(directory, num_labels=len(labels))
    with torch.no_grad():  # the same starting weights: attnkit's new head (and pooler, where MiniLM has none)
        missing, unexpected = hf.load_state_dict(hf_state(ours), strict=False)
    if missing or unexpected:
        raise AttnkitError(f"the two models' weights do not correspond (missing {missing[:3]}, unexpected "
                           f"{unexpected[:3]})")
    fast.use(ours, *fast.TRAINING)  # as attnkit train runs
    ours.train()

    def ours_loss(batch, targets):
        return ours(batch.tokens, batch.padding_mask, batch.token_types, targets=targets).loss  # summed, as the task's

    attnkit = Loop(ours, ours_loss, args, total, summed=True)
    loops = {"attnkit": attnkit}
    if {"avx512_bf16", "amx_bf16"} & cpu_flags():  # train.precision = "bf16" on this CPU, beside fp32's headline
        ours_bf16 = copy.deepcopy(ours)

        def bf16_loss(batch, targets):
            return ours_bf16(batch.tokens, batch.padding_mask, batch.token_types, targets=targets).loss

        loops["attnkit_bf16"] = Loop(ours_bf16, bf16_loss, args, total, summed=True, autocast=torch.bfloat16)
    timed = data[args.warmup:]

    def attnkit_round(r: int) -> None:
        for loop in loops.values():
            if r < 0:
                loop.run(data[:args.warmup], timed=False)
            else:
                loop.run(timed[r * args.steps:(r + 1) * args.steps])

    if args.hf_loop:
        def hf_loss(batch, targets):
            return hf(**hf_inputs(batch, targets)).loss  # Hugging Face's mean cross-entropy

        loop = Loop(hf, hf_loss, args, total)
        loop.run(data[:args.warmup], timed=False)
        attnkit_round(-1)
        for r in range(args.rounds):
            loop.run(timed[r * args.steps:(r + 1) * args.steps])
            attnkit_round(r)
        hf_seconds, hf_examples, threads = loop.seconds, loop.examples, torch.get_num_threads()
    else:
        hf_batches = [hf_inputs(b, t) for b, t in data]
        hf_seconds, hf_examples, threads = train_with_trainer(hf, hf_batches, args, attnkit_round, total, tmp)
    hf_name = "huggingface_loop" if args.hf_loop else "huggingface_trainer"
    systems = {name: {"examples_per_s": round(loop.examples / loop.seconds, 2), "seconds": round(loop.seconds, 3),
                      "examples": loop.examples} for name, loop in loops.items()}
    systems[hf_name] = {"examples_per_s": round(hf_examples / hf_seconds, 2), "seconds": round(hf_seconds, 3),
                        "examples": hf_examples}
    ratio = systems["attnkit"]["examples_per_s"] / systems[hf_name]["examples_per_s"]
    for name, s in systems.items():
        print(f"train {name:>20}: {s['examples_per_s']:8.1f} examples/s", flush=True)
    print(f"train attnkit / {hf_name}: {ratio:.2f}x", flush=True)
    if "attnkit_bf16" in systems:
        print(f"train attnkit bf16 / {hf_name}: "
              f"{systems['attnkit_bf16']['examples_per_s'] / systems[hf_name]['examples_per_s']:.2f}x", flush=True)
    record = {"systems": systems, "attnkit_over_huggingface": round(ratio, 3), "huggingface_runner": hf_name,
              "batches": len(timed), "warmup_batches": args.warmup, "mean_batch_width":
                  round(float(np.mean([b.tokens.shape[1] for b, _ in timed])), 2), "torch_threads_at_end": threads}
    ours.eval()
    return record, ours


def cls_twin(model: SequenceClassifier) -> SequenceClassifier:
    """A mean-pooled classifier's encoder and head over BERT's [CLS] pooler (as initialised): what a
    BertForSequenceClassification of the same cost runs."""
    twin = SequenceClassifier(model.encoder, model.n_labels, "cls", model.dropout.p, model.problem, model.labels)
    twin.classifier.load_state_dict(model.classifier.state_dict())
    return twin.eval()


def classify_all(args, model: SequenceClassifier, tokenizer: WordPiece, tmp: Path) -> dict:
    """The inference part: every system over the dev sentences, in rounds -> its record."""
    import transformers

    dev = read_glue("sst2", "dev", args.data_dir)
    texts, gold = list(dev.texts), list(dev.labels)
    b = args.batch_size
    chunks = [texts[i:i + b] for i in range(0, len(texts), b)]
    model = fast.reference(copy.deepcopy(model)).eval()  # the core's kernels, as a loaded checkpoint's module
    same_weights = model.pooling == "cls"
    hf_dir = write_huggingface(model if same_weights else cls_twin(model), tokenizer, tmp / "hf")
    onnx_dir = write_onnx(model, tokenizer, tmp / "onnx")
    ort_model = OnnxClassifier(onnx_dir, args.threads)
    hf_model, hf_tokenizer = load_huggingface(hf_dir)
    gaps = {"onnxruntime": onnx_gap(model, tokenizer, ort_model)}
    if same_weights:
        gaps["huggingface"] = huggingface_gap(model, tokenizer, hf_model, hf_tokenizer)
    pipe = transformers.pipeline("text-classification", model=hf_model, tokenizer=hf_tokenizer, device="cpu")
    # what attnkit.load(run).classify runs: the fast runtime's copy, at each precision this CPU has the instructions for
    fast_models = {"attnkit": fast.classifier(model)}
    for precision in ("bf16", "int8"):
        if set(NEEDS[precision]) & cpu_flags():
            fast_models[f"attnkit_{precision}"] = fast.classifier(model, precision)
    labels = model.labels

    # each system takes a round's sentences, as chunks of b in input order -> their labels in input order
    def attnkit_system(m):
        def run(batches):
            # one call for the round, as a user calls it on a list: batches of b sentences of similar length
            return [c.label for c in classify(m, tokenizer, [t for chunk in batches for t in chunk],
                                              batch_tokens=10**9, batch_size=b)]
        return run

    def attnkit_in_order(batches):
        # one call per chunk of b in input order: the pipeline's batches exactly
        return [c.label for chunk in batches for c in classify(fast_models["attnkit"], tokenizer, chunk,
                                                                batch_tokens=10**9)]

    def pipeline_system(batches):
        # one call for the round, as one would call it on a list: it cuts the batches of b in input order itself
        out = pipe([t for batch_texts in batches for t in batch_texts], batch_size=b, truncation=True,
                   max_length=tokenizer.max_len)
        return [r["label"] for r in out]

    def onnx_system(batches):
        # attnkit's batches (b sentences of similar length), attnkit's tokenizer: onnxruntime's kernels against
        # attnkit's on the same inputs
        texts = [t for chunk in batches for t in chunk]
        lengths = [len(tokenizer.example(t)[0]) - 1 for t in texts]
        out = [None] * len(texts)
        for idx in token_batches(lengths, [0] * len(texts), 10**9, max_examples=b):
            for i, k in zip(idx, ort_model.run(onnx_feed(tokenizer.sentences([texts[i] for i in idx]))).argmax(-1)):
                out[i] = labels[int(k)]
        return out

    systems = {"attnkit": attnkit_system(fast_models["attnkit"]), "transformers_pipeline": pipeline_system,
               "onnxruntime": onnx_system, "attnkit_core": attnkit_system(model),
               "attnkit_input_order": attnkit_in_order,
               **{name: attnkit_system(m) for name, m in fast_models.items() if name != "attnkit"}}
    seconds = dict.fromkeys(systems, 0.0)
    predictions = {name: [] for name in systems}
    with torch.inference_mode():
        for run in systems.values():  # warm-up: one batch each, untimed
            run(chunks[:1])
        cuts = [len(chunks) * r // args.rounds for r in range(args.rounds + 1)]
        for r in range(args.rounds):
            names = list(systems) if r % 2 == 0 else list(reversed(systems))
            for name in names:
                start = time.perf_counter()
                out = systems[name](chunks[cuts[r]:cuts[r + 1]])
                seconds[name] += time.perf_counter() - start
                predictions[name].extend(out)
    # tokenizing alone, for where the time goes
    start = time.perf_counter()
    for chunk in chunks:
        tokenizer.sentences(chunk)
    attnkit_tokenizer = time.perf_counter() - start
    start = time.perf_counter()
    for chunk in chunks:
        hf_tokenizer(chunk, padding=True, truncation=True, max_length=tokenizer.max_len, return_tensors="pt")
    hf_tokenizer_seconds = time.perf_counter() - start

    record = {"sentences": len(texts), "batch_size": b, "systems": {}, "logit_gap": gaps,
              "pipeline_same_weights": same_weights,
              "tokenize_seconds": {"attnkit_wordpiece": round(attnkit_tokenizer, 3),
                                   "huggingface_tokenizer": round(hf_tokenizer_seconds, 3)}}
    for name in systems:
        preds = predictions[name]
        compared = same_weights or name != "transformers_pipeline"
        record["systems"][name] = {
            "sentences_per_s": round(len(texts) / seconds[name], 1), "seconds": round(seconds[name], 3),
            "dev_accuracy": round(float(np.mean([p == g for p, g in zip(preds, gold)])), 4) if compared else None,
            "agreement_with_attnkit": round(float(np.mean([p == q for p, q in zip(preds, predictions["attnkit"])])),
                                            4) if compared else None}
        print(f"classify {name:>24}: {len(texts) / seconds[name]:8.1f} sentences/s", flush=True)
    speed = {name: s["sentences_per_s"] for name, s in record["systems"].items()}
    record["attnkit_over_pipeline"] = round(speed["attnkit"] / speed["transformers_pipeline"], 3)
    record["attnkit_over_onnxruntime"] = round(speed["attnkit"] / speed["onnxruntime"], 3)
    print(f"classify attnkit / pipeline: {record['attnkit_over_pipeline']:.2f}x, attnkit / onnxruntime: "
          f"{record['attnkit_over_onnxruntime']:.2f}x", flush=True)
    for name in (n for n in fast_models if n != "attnkit"):  # the lower precisions, beside fp32's headline
        record[f"{name}_over_pipeline"] = round(speed[name] / speed["transformers_pipeline"], 3)
        print(f"classify {name} / pipeline: {record[f'{name}_over_pipeline']:.2f}x", flush=True)
    return record


def library_versions() -> dict:
    out = {}
    for name in ("transformers", "onnxruntime", "onnx", "accelerate", "tokenizers"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a fine-tuned bert_classifier run or checkpoint for the inference part "
                                         "(default: attnkit's model at the end of the training part)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds the systems alternate, in training and inference")
    ap.add_argument("--steps", type=int, default=25, help="timed training steps per system and round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed training steps per system first")
    ap.add_argument("--batch-size", type=int, default=32, help="examples per training batch and sentences per "
                                                               "inference batch (configs/glue_sst2.toml's 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch (and onnxruntime) threads, the same for all")
    ap.add_argument("--lr", type=float, default=6e-5)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf-loop", action="store_true",
                    help="time Hugging Face's model under attnkit's plain loop instead of its Trainer")
    ap.add_argument("--skip-training", action="store_true", help="the inference part only (needs --checkpoint)")
    ap.add_argument("--data-dir", help="holds glue/SST-2 (default: ATTNKIT_DATA)")
    ap.add_argument("--out", default="bench/results/finetune_speed.json")
    args = ap.parse_args()
    for name in ("rounds", "steps", "warmup", "batch_size", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected a positive number")
    if args.skip_training and not args.checkpoint:
        ap.error("--skip-training needs --checkpoint (the model to classify with)")
    if not args.hf_loop and not args.skip_training and importlib.util.find_spec("accelerate") is None:
        print("Hugging Face's Trainer needs the accelerate package (pip install 'accelerate>=1.1.0'); or pass "
              "--hf-loop to time its model under a plain loop", file=sys.stderr)
        return 2
    total = args.warmup + args.rounds * args.steps
    args.lr_warmup = round(0.06 * total)  # 6% of the steps, as the recipe
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    metrics, extra = {"targets": TARGETS}, {}
    try:
        tokenizer = WordPiece.from_pretrained(minilm_dir(), max_len=128)
        with tempfile.TemporaryDirectory() as tmp:
            model = None
            if not args.skip_training:
                extra["training"], model = fine_tune(args, tokenizer, Path(tmp))
                metrics["train_examples_per_s"] = extra["training"]["systems"]["attnkit"]["examples_per_s"]
                metrics["train_speedup_vs_huggingface"] = extra["training"]["attnkit_over_huggingface"]
            if args.checkpoint:
                model, cfg, tokenizer, _ = load_checkpoint(args.checkpoint)
                if not isinstance(model, SequenceClassifier) or model.problem != "classification":
                    raise AttnkitError(f"--checkpoint {args.checkpoint}: not a bert_classifier classifier (model."
                                       f"family = {cfg.model.family!r}); SST-2 is classified here")
            extra["inference"] = classify_all(args, model, tokenizer, Path(tmp))
    except AttnkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    inference = extra["inference"]
    metrics.update({"inference_sentences_per_s": inference["systems"]["attnkit"]["sentences_per_s"],
                    "inference_speedup_vs_pipeline": inference["attnkit_over_pipeline"],
                    "inference_speedup_vs_onnxruntime": inference["attnkit_over_onnxruntime"]})
    ratios = {k: v for k, v in metrics.items() if "speedup" in k}
    flags = cpu_flags()
    write_results(args.out, "finetune_speed", " ".join(["python", *sys.argv]), metrics, ratios=ratios, **extra,
                  libraries=library_versions(), cpu_flags=[f for f in SIMD_FLAGS if f in flags],
                  threads=args.threads, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                  batch_size=args.batch_size, lr=args.lr, eps=args.eps, weight_decay=args.weight_decay,
                  checkpoint=args.checkpoint, model=str(minilm_dir()))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
