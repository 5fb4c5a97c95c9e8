"""Issue 23's bad-input suite: every user error ends as exit status 2 and exactly one line on stderr that names
the offending file, line, key or option, and leaves every file that existed before unchanged.

Each case builds its inputs in a fresh working directory (a copy of a tiny trained run and its last checkpoint,
plus whatever the case writes), hashes the whole tree, runs the CLI in-process (``attnkit.cli.main``), and
hashes the tree again. Cases are grouped by category; ``CATEGORY_COUNTS`` is what the issue's closing note lists.
"""

from __future__ import annotations

import collections
import errno
import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from attnkit.cli import main
from attnkit.config import dump_toml
from attnkit.data import generate_dates
from conftest import tiny_experiment


def tree_digest(root: Path) -> dict[str, str]:
    """Every file (content), symlink (target) and directory under ``root``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def tiny_run(trained_checkpoint) -> Path:
    """The conftest's tiny run directory (checkpoints/step-4, last, best)."""
    return trained_checkpoint.parent.parent


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory) -> Path:
    """A tiny character language model's checkpoint (random weights)."""
    import torch

    from attnkit.checkpoint import model_for, write_checkpoint
    from attnkit.config import ExperimentConfig
    from attnkit.data import CharTokenizer
    from attnkit.models.lm import LMConfig

    root = tmp_path_factory.mktemp("lm")
    cfg = ExperimentConfig(name="lm", model=LMConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, max_positions=32))
    cfg.data.format, cfg.data.block_size = "tinyshakespeare", 32
    toks = CharTokenizer.build("to be or not to be\n", root / "chars.json")
    torch.manual_seed(0)
    return write_checkpoint(root / "ckpt", model_for(cfg, toks), cfg, [toks.path], {})


class Work:
    """A case's working directory: ``run`` (a copy of the tiny run), ``ckpt`` (its last checkpoint), ``lm`` (a
    language model's checkpoint), a config."""

    def __init__(self, root: Path, tiny_run: Path, lm_checkpoint: Path | None = None):
        self.root = root
        self.run = root / "run"
        shutil.copytree(tiny_run, self.run, symlinks=True)
        if lm_checkpoint is not None:
            self.lm = root / "lm"
            shutil.copytree(lm_checkpoint, self.lm)
        self.ckpt = (self.run / "checkpoints" / "last").resolve()
        cfg = tiny_experiment()
        cfg.data.n_synthetic = 300
        self.config = self.write("tiny.toml", dump_toml(cfg))
        self.input = self.write("in.txt", "4 March 1997\n12 May 2001\n")

    def write(self, name: str, data: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        return path

    def edit(self, path: Path, old: str, new: str) -> None:
        text = path.read_text()
        assert old in text, (old, path)
        path.write_text(text.replace(old, new))

    def train(self, *more) -> list:
        return ["train", self.config, "--run-dir", self.root / "new_run", *more]

    def resume(self, *more) -> list:
        return ["train", self.config, "--run-dir", self.run, "--resume", *more]

    def translate(self, *more) -> list:
        return ["translate", "--checkpoint", self.ckpt, "--input", self.input, *more]


def _damage(path: Path, keep_size: bool = True) -> None:
    data = bytearray(path.read_bytes())
    if keep_size:
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(bytes(data[: len(data) // 3]))


# --- the cases: (category, id, setup(w) -> argv or (argv, stdin bytes), what the line must name)

CASES: list[tuple[str, str, object, object]] = []


def case(category: str, name: str, needle):
    def register(setup):
        CASES.append((category, name, setup, needle))
        return setup
    return register


# data
case("data", "input_missing", "nowhere.txt")(lambda w: w.translate()[:3] + ["--input", w.root / "nowhere.txt"])
case("data", "input_is_directory", "adir")(
    lambda w: (w.root / "adir").mkdir() or ["translate", "--checkpoint", w.ckpt, "--input", w.root / "adir"])
case("data", "fake_gzip", "src.gz")(lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.write(
    "src.gz", "not gzip\n"), "--ref", w.input])
case("data", "truncated_gzip", "src.gz")(lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.write(
    "src.gz", gzip.compress(b"1 May 2000\n" * 200)[:40]), "--ref", w.input])
case("data", "src_not_utf8", "bad.txt:2")(lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.write(
    "bad.txt", b"1 May 2000\n\xff\xfe oops\n"), "--ref", w.input])
case("data", "ref_not_utf8", "ref.txt:1")(lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.input,
                                                     "--ref", w.write("ref.txt", b"\xe9t\xe9\nok\n")])
case("data", "misaligned_src_ref", "one.txt")(lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.input,
                                                         "--ref", w.write("one.txt", "only one\n")])
case("data", "stdin_not_utf8", "stdin: line 2")(
    lambda w: (["translate", "--checkpoint", w.ckpt], b"1 May 2000\n\xc3\x28 bad\n"))
case("data", "source_over_max_tokens", "long.txt:2")(lambda w: w.translate()[:3] + [
    "--input", w.write("long.txt", "1 May 2000\n" + "9 " * 3000 + "\n")])
case("data", "evaluate_source_over_max_tokens", "long.txt:1")(lambda w: [
    "evaluate", "--checkpoint", w.ckpt, "--src", w.write("long.txt", "1 " * 1500 + "\nok\n"), "--ref", w.input])
case("data", "stdin_over_max_tokens", "stdin:1")(
    lambda w: (["translate", "--checkpoint", w.ckpt], ("y" * 5000 + "\n").encode()))


def _parallel(w: Work, src: bytes, tgt: bytes, src_name: str = "a.en") -> list:
    s, t = w.write(src_name, src), w.write("a.de", tgt)
    cfg = w.write("par.toml", f'name = "p"\n[data]\nformat = "parallel"\ntrain_src = "{s}"\ntrain_tgt = "{t}"\n'
                              f'valid_src = "{s}"\nvalid_tgt = "{t}"\n')
    return ["train", cfg, "--run-dir", w.root / "prun"]


case("data", "train_misaligned", "a.de")(lambda w: _parallel(w, b"a\nb\nc\n", b"x\ny\n"))
case("data", "train_empty_source_line", "a.en:2")(lambda w: _parallel(w, b"a\n \nc\n", b"x\ny\nz\n"))
case("data", "train_source_not_utf8", "a.en:1")(lambda w: _parallel(w, b"\x80\n", b"x\n"))
case("data", "train_fake_gzip", "a.en.gz")(lambda w: _parallel(w, b"plain", b"x\n", "a.en.gz"))

# config
case("config", "config_missing", "none.toml")(lambda w: ["train", w.root / "none.toml"])
case("config", "config_is_directory", "cfgdir")(lambda w: (w.root / "cfgdir").mkdir() or ["train", w.root / "cfgdir"])
case("config", "config_not_utf8", "latin.toml")(lambda w: ["train", w.write("latin.toml", b'name = "\xe9"\n')])
case("config", "config_invalid_toml", "broken.toml")(lambda w: ["train", w.write("broken.toml", "[model\n")])
case("config", "unknown_key", "d_modle")(lambda w: w.train("--set", "model.d_modle=3"))
case("config", "zero_heads", "model.n_heads")(lambda w: w.train("--set", "model.n_heads=0"))
case("config", "zero_layers", "model.n_encoder_layers")(lambda w: w.train("--set", "model.n_encoder_layers=0"))
case("config", "negative_layers", "model.n_decoder_layers")(lambda w: w.train("--set", "model.n_decoder_layers=-2"))
case("config", "nan_lr", "train.lr")(lambda w: w.train("--set", "train.lr=nan"))
case("config", "inf_lr", "train.lr")(lambda w: w.train("--set", "train.lr=inf"))
case("config", "negative_max_steps", "train.max_steps")(lambda w: w.train("--set", "train.max_steps=-1"))
case("config", "zero_max_steps", "train.max_steps")(lambda w: w.train("--set", "train.max_steps=0"))
case("config", "negative_max_epochs", "train.max_epochs")(lambda w: w.train("--set", "train.max_epochs=-1"))
case("config", "negative_save_every", "train.save_every")(lambda w: w.train("--set", "train.save_every=-5"))
case("config", "negative_warmup", "train.warmup_steps")(lambda w: w.train("--set", "train.warmup_steps=-1"))
case("config", "zero_keep_last", "train.keep_last")(lambda w: w.train("--set", "train.keep_last=0"))
case("config", "zero_max_tokens", "train.max_tokens")(lambda w: w.train("--set", "train.max_tokens=0"))
case("config", "label_smoothing_range", "train.label_smoothing")(
    lambda w: w.train("--set", "train.label_smoothing=1.5"))
case("config", "dropout_range", "model.dropout")(lambda w: w.train("--set", "model.dropout=1.0"))
case("config", "betas_range", "train.betas")(lambda w: w.train("--set", "train.betas=[0.9, 1.5]"))
case("config", "nan_min_lr", "train.min_lr")(lambda w: w.train("--set", "train.min_lr=nan"))
case("config", "heads_do_not_divide", "model.n_heads")(lambda w: w.train("--set", "model.n_heads=5"))
case("config", "unknown_family", "model.family")(lambda w: w.train("--set", "model.family=\"lstm\""))
case("config", "unknown_schedule", "train.schedule")(lambda w: w.train("--set", "train.schedule=\"warp\""))
case("config", "set_without_value", "--set train.lr")(lambda w: w.train("--set", "train.lr"))
case("config", "set_wrong_type", "train.lr")(lambda w: w.train("--set", "train.lr=\"fast\""))
case("config", "zero_max_source_tokens", "decode.max_source_tokens")(
    lambda w: w.train("--set", "decode.max_source_tokens=0"))
case("config", "zero_vocab", "data.vocab_size")(lambda w: w.train("--set", "data.vocab_size=0"))
case("config", "learned_positions_too_short", "model.max_positions")(
    lambda w: w.train("--set", "model.positional=\"learned\"", "--set", "model.max_positions=8"))

# command-line options
case("cli", "beam_zero", "argument --beam: expected an integer of at least 1, got '0'")(
    lambda w: w.translate("--beam", "0"))
case("cli", "beam_negative", "argument --beam: expected an integer of at least 1, got '-3'")(
    lambda w: w.translate("--beam", "-3"))
case("cli", "n_best_zero", "argument --n-best: expected an integer of at least 1, got '0'")(
    lambda w: w.translate("--n-best", "0"))
case("cli", "n_best_over_beam", "--n-best 3")(lambda w: w.translate("--beam", "2", "--n-best", "3"))
case("cli", "n_best_over_config_beam", "--n-best 9")(lambda w: w.translate("--n-best", "9"))
case("cli", "batch_tokens_zero", "argument --batch-tokens: expected an integer of at least 1, got '0'")(
    lambda w: w.translate("--batch-tokens", "0"))
case("cli", "len_penalty_nan", "argument --len-penalty: expected a finite number, got 'nan'")(
    lambda w: w.translate("--len-penalty", "nan"))
case("cli", "threads_zero", "argument --threads: expected an integer of at least 1, got '0'")(
    lambda w: w.translate("--threads", "0"))
case("cli", "evaluate_beam_zero", "argument --beam: expected an integer of at least 1, got '0'")(
    lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.input, "--ref", w.input, "--beam", "0"])
case("cli", "align_layer_zero", "argument --layer: expected an integer of at least 1, got '0'")(
    lambda w: ["align", "--checkpoint", w.ckpt, "--src", "1 May 2000", "-o", w.root / "a.png", "--layer", "0"])
case("cli", "align_beam_zero", "argument --beam: expected an integer of at least 1, got '0'")(
    lambda w: ["align", "--checkpoint", w.ckpt, "--src", "1 May 2000", "-o", w.root / "a.png", "--beam", "0"])
case("cli", "generate_temperature_nan", "argument --temperature: expected a finite number of at least 0, got 'nan'")(
    lambda w: ["generate", "--checkpoint", w.ckpt, "--temperature", "nan"])
case("cli", "generate_top_p_zero", "argument --top-p: expected a number above 0 and at most 1, got '0'")(
    lambda w: ["generate", "--checkpoint", w.ckpt, "--top-p", "0"])
case("cli", "generate_top_p_over_one", "argument --top-p: expected a number above 0 and at most 1, got '1.5'")(
    lambda w: ["generate", "--checkpoint", w.ckpt, "--top-p", "1.5"])
case("cli", "translation_model_generates", "checkpoints/step-4: a transformer model cannot generate")(
    lambda w: ["generate", "--checkpoint", w.ckpt])
case("cli", "embed_batch_size_zero", "argument --batch-size: expected an integer of at least 1, got '0'")(
    lambda w: ["embed", "hello", "--batch-size", "0"])
case("cli", "demo_steps_zero", "argument --steps: expected an integer of at least 1, got '0'")(
    lambda w: ["demo", "--run-dir", w.root / "demo", "--steps", "0"])
case("cli", "plot_json_list", "list.json")(lambda w: ["plot-by-length", w.write("list.json", "[1, 2]"),
                                                       "-o", w.root / "p.png"])
case("cli", "plot_invalid_json", "bad.json:1")(lambda w: ["plot-by-length", w.write("bad.json", "{oops"),
                                                           "-o", w.root / "p.png"])
case("cli", "plot_missing_json", "none.json")(lambda w: ["plot-by-length", w.root / "none.json",
                                                          "-o", w.root / "p.png"])
case("cli", "resume_and_overwrite", "--overwrite")(lambda w: w.resume("--overwrite"))
case("cli", "language_model_translates", "/lm: a transformer_lm model cannot translate")(
    lambda w: ["translate", "--checkpoint", w.lm, "--input", w.input])
case("cli", "language_model_evaluates", "/lm: a transformer_lm model cannot translate")(
    lambda w: ["evaluate", "--checkpoint", w.lm, "--src", w.input, "--ref", w.input])
case("cli", "language_model_aligns", "alignment")(
    lambda w: ["align", "--checkpoint", w.lm, "--src", "to be", "-o", w.root / "a.png"])
case("cli", "generate_prompt_over_max_tokens", "--prompt")(
    lambda w: ["generate", "--checkpoint", w.lm, "--prompt", "to be " * 200, "--max-new-tokens", "1"])
case("cli", "serve_port_zero", "argument --port: expected an integer from 1 to 65535, got '0'")(
    lambda w: ["serve", w.ckpt, "--port", "0"])
case("cli", "serve_timeout_nan", "argument --timeout: expected a finite number above 0, got 'nan'")(
    lambda w: ["serve", w.ckpt, "--timeout", "nan"])
case("cli", "serve_body_timeout_negative", "argument --body-timeout: expected a finite number above 0, got '-1'")(
    lambda w: ["serve", w.ckpt, "--body-timeout", "-1"])
case("cli", "serve_queue_size_zero", "argument --queue-size: expected an integer of at least 1, got '0'")(
    lambda w: ["serve", w.ckpt, "--queue-size", "0"])
case("cli", "serve_public_without_key", "--host 0.0.0.0")(lambda w: ["serve", w.ckpt, "--host", "0.0.0.0"])
case("cli", "serve_missing_model", "nowhere")(lambda w: ["serve", w.root / "nowhere"])

# checkpoints
case("checkpoint", "checkpoint_missing", "nowhere")(lambda w: w.translate()[:1] + [
    "--checkpoint", w.root / "nowhere", "--input", w.input])
case("checkpoint", "not_a_checkpoint", "emptydir")(lambda w: (w.root / "emptydir").mkdir() or [
    "translate", "--checkpoint", w.root / "emptydir", "--input", w.input])
case("checkpoint", "weights_bit_flip", "model.safetensors")(
    lambda w: _damage(w.ckpt / "model.safetensors") or w.translate())
case("checkpoint", "weights_truncated", "model.safetensors")(
    lambda w: _damage(w.ckpt / "model.safetensors", keep_size=False) or w.translate())
case("checkpoint", "tokenizer_damaged", "spm.model")(lambda w: _damage(w.ckpt / "spm.model") or w.translate())
case("checkpoint", "meta_wrong_shape", "meta.json")(
    lambda w: (w.ckpt / "meta.json").write_text("[1, 2, 3]") and w.translate())
case("checkpoint", "meta_invalid_json", "meta.json")(
    lambda w: (w.ckpt / "meta.json").write_text("{") and w.translate())
case("checkpoint", "meta_files_wrong_type", "meta.json")(lambda w: (w.ckpt / "meta.json").write_text(
    json.dumps({**json.loads((w.ckpt / "meta.json").read_text()), "files": 3})) and w.translate())
case("checkpoint", "heads_contradict_weights", "model.n_heads")(
    lambda w: w.edit(w.ckpt / "config.toml", "n_heads = 4\n", "n_heads = 2\n") or w.translate())
case("checkpoint", "activation_contradicts_weights", "model.activation")(
    lambda w: w.edit(w.ckpt / "config.toml", 'activation = "relu"\n', 'activation = "gelu"\n') or w.translate())
case("checkpoint", "checkpoint_config_not_utf8", "config.toml")(
    lambda w: (w.ckpt / "config.toml").write_bytes(b"\xff\xfe") and w.translate())
case("checkpoint", "average_into_its_input", "--output")(
    lambda w: ["average", w.ckpt, w.ckpt, "-o", w.ckpt])
case("checkpoint", "average_into_run_last", "--output")(
    lambda w: ["average", w.ckpt, "-o", w.run / "checkpoints" / "last"])
case("checkpoint", "average_damaged_input", "model.safetensors")(
    lambda w: _damage(w.ckpt / "model.safetensors") or ["average", w.ckpt, "-o", w.root / "avg"])

# images
case("images", "caption_with_a_translation_model", "checkpoints/step-4: a transformer model cannot caption")(
    lambda w: ["caption", "--checkpoint", w.ckpt, w.write("x.jpg", b"not a jpeg")])
case("images", "caption_beam_zero", "argument --beam: expected an integer of at least 1, got '0'")(
    lambda w: ["caption", "--checkpoint", w.ckpt, w.write("x.jpg", b"not a jpeg"), "--beam", "0"])
case("images", "caption_list_names_a_missing_image", "line 2")(
    lambda w: ["caption", "--checkpoint", w.ckpt, "--list",
               w.write("list.txt", f"{w.write('a.jpg', b'jpg')}\nb.jpg\n")])
case("images", "caption_list_of_nothing", "names no image")(
    lambda w: ["caption", "--checkpoint", w.ckpt, "--list", w.write("list.txt", "\n\n")])
case("images", "caption_no_images", "no images")(lambda w: ["caption", "--checkpoint", w.ckpt])
case("images", "caption_image_dir_without_list", "--image-dir")(
    lambda w: ["caption", "--checkpoint", w.ckpt, w.write("x.jpg", b"jpg"), "--image-dir", w.root])
case("images", "show_attention_is_a_file", "--show-attention")(
    lambda w: ["caption", "--checkpoint", w.ckpt, w.write("x.jpg", b"jpg"), "--show-attention", w.input])

# output paths (all checked before any work)
case("output", "translate_output_is_directory", "--output")(lambda w: w.translate("--output", w.run))
case("output", "translate_output_missing_parent", "--output")(
    lambda w: w.translate("--output", w.root / "no" / "out.txt"))
case("output", "evaluate_output_is_directory", "--output")(
    lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.input, "--ref", w.input, "--output", w.run])
case("output", "evaluate_json_missing_parent", "--json")(
    lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.input, "--ref", w.input, "--json",
               w.root / "no" / "r.json"])
case("output", "align_output_is_directory", "--output")(
    lambda w: ["align", "--checkpoint", w.ckpt, "--src", "1 May 2000", "-o", w.run])
case("output", "plot_output_missing_parent", "--output")(
    lambda w: ["plot-by-length", w.write("r.json", '{"by_length": [{"min_len": 0, "max_len": null, "n": 1, '
                                                   '"bleu": 1.0}]}'), "-o", w.root / "no" / "p.png"])
case("output", "embed_output_missing_parent", "--output")(
    lambda w: ["embed", "hello", "-o", w.root / "no" / "e.npy"])
case("output", "average_output_nonempty_directory", "--output")(
    lambda w: w.write("keep/mine.txt", "precious") and ["average", w.ckpt, "-o", w.root / "keep"])
case("output", "average_output_is_a_file", "--output")(lambda w: ["average", w.ckpt, "-o", w.input])
case("output", "average_output_missing_parent", "--output")(
    lambda w: ["average", w.ckpt, "-o", w.root / "no" / "where" / "avg"])
case("output", "average_overwrite_non_checkpoint", "--output")(
    lambda w: w.write("keep/mine.txt", "precious") and ["average", w.ckpt, "-o", w.root / "keep", "--overwrite"])

case("output", "import_marian_into_a_checkpoint", "--output")(
    lambda w: ["import-marian", w.root / "no_hf", "-o", w.ckpt])

# resume and run directories
case("resume", "train_into_run_with_checkpoints", "--resume")(
    lambda w: ["train", w.config, "--run-dir", w.run])
case("resume", "resume_max_steps_below_checkpoint", "train.max_steps")(
    lambda w: w.resume("--set", "train.max_steps=2"))
case("resume", "resume_heads_contradict", "model.n_heads")(lambda w: w.resume("--set", "model.n_heads=2"))
case("resume", "resume_norm_contradicts", "model.norm_first")(lambda w: w.resume("--set", "model.norm_first=true"))
case("resume", "resume_without_checkpoints", "no checkpoints")(
    lambda w: ["train", w.config, "--run-dir", w.root / "fresh", "--resume"])
case("resume", "resume_missing_path", "nowhere")(
    lambda w: ["train", w.config, "--run-dir", w.run, "--resume", w.root / "nowhere"])
case("resume", "resume_without_trainer_state", "trainer.safetensors")(
    lambda w: (w.ckpt / "trainer.safetensors").unlink() or w.resume())
case("resume", "resume_all_checkpoints_damaged", "model.safetensors")(
    lambda w: _damage(w.ckpt / "model.safetensors") or w.resume())
case("resume", "resume_trainer_state_damaged", "trainer.safetensors")(
    lambda w: _damage(w.ckpt / "trainer.safetensors") or w.resume())
case("resume", "run_dir_is_a_file", "--run-dir")(lambda w: ["train", w.config, "--run-dir", w.input])

CATEGORY_COUNTS = collections.Counter(c[0] for c in CASES)


def test_there_are_enough_cases():
    assert len(CASES) >= 60, CATEGORY_COUNTS
    assert len({c[1] for c in CASES}) == len(CASES)


def _with_stdin(argv, monkeypatch) -> list:
    """A case's argv; a case given as (argv, bytes) reads those bytes on stdin, through a pipe."""
    if not isinstance(argv, tuple):
        return argv
    argv, stdin = argv
    r, wfd = os.pipe()
    os.write(wfd, stdin)
    os.close(wfd)
    monkeypatch.setattr("sys.stdin", os.fdopen(r, "rb"))
    return argv


@pytest.mark.parametrize("category, name, setup, needle", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_bad_input(category, name, setup, needle, tmp_path, tiny_run, lm_checkpoint, capsys, monkeypatch):
    monkeypatch.delenv("ATTNKIT_DEBUG", raising=False)
    w = Work(tmp_path, tiny_run, lm_checkpoint)
    monkeypatch.chdir(tmp_path)  # anything written by mistake lands in the hashed tree
    argv = _with_stdin(setup(w), monkeypatch)
    # nothing may be decoded before an option, an output path or a source is refused
    import attnkit.decode

    def no_work(*a, **k):
        raise AssertionError("decoding started before the input was checked")

    if category in ("cli", "output") or "max_tokens" in name:
        monkeypatch.setattr(attnkit.decode, "translate", no_work)
    before = tree_digest(tmp_path)
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnkit: error: "), lines[0]
    needles = needle if isinstance(needle, tuple) else (needle,)
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert tree_digest(tmp_path) == before


# --- beyond the table: a full disk, a damaged newest checkpoint, a bug


@pytest.mark.parametrize("where", ["weights", "trainer_state_from_safetensors", "tokenizer_copy"])
def test_full_disk_during_a_save_keeps_earlier_checkpoints(where, tmp_path, tiny_run, capsys, monkeypatch):
    w = Work(tmp_path, tiny_run)
    checkpoints = w.run / "checkpoints"
    before = tree_digest(checkpoints)
    from safetensors import SafetensorError

    import attnkit.checkpoint

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(a[1]) if len(a) > 1 else None)

    def full_as_safetensors_says(*a, **k):  # what its Rust writer raises
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    if where == "weights":
        monkeypatch.setattr(attnkit.checkpoint, "save_model", full)
    elif where == "trainer_state_from_safetensors":
        monkeypatch.setattr(attnkit.checkpoint, "save_file", full_as_safetensors_says)
    else:  # copying the tokenizer beside the weights
        monkeypatch.setattr(attnkit.checkpoint.shutil, "copyfile", full)
    capsys.readouterr()
    code = main([str(a) for a in w.resume("--set", "train.max_steps=6")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("attnkit: error: ") and "no space left" in lines[-1], err
    assert ".tmp-step-" in lines[-1] or "checkpoints" in lines[-1], err  # it happened in the checkpoint write
    assert sum(line.startswith("attnkit:") for line in lines) == 1
    assert tree_digest(checkpoints) == before  # nothing earlier touched, no temporary folder left


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, tiny_run, capsys):
    w = Work(tmp_path, tiny_run)
    from attnkit.train import Trainer

    cfg = tiny_experiment(max_steps=8, save_every=2)
    t = Trainer(cfg, w.root / "r", train_pairs=generate_dates(300), valid_pairs=generate_dates(20, seed=1))
    t.train()
    ckpts = w.root / "r" / "checkpoints"
    newest = ckpts / "last"
    assert newest.resolve().name == "step-8"
    _damage(newest.resolve() / "model.safetensors")
    (ckpts / ".tmp-step-9.abcd").mkdir()  # what a killed write leaves
    resumed = Trainer(tiny_experiment(max_steps=10, save_every=2), w.root / "r",
                      train_pairs=generate_dates(300), valid_pairs=generate_dates(20, seed=1))
    capsys.readouterr()
    resumed.resume(w.root / "r")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "warning" in err[0] and "step-6" in err[0] and "step-8" in err[0], err
    assert resumed.progress.step == 6
    assert not (ckpts / ".tmp-step-9.abcd").exists()  # cleaned as the resumed run started


def test_a_bug_is_one_line_and_says_so(tmp_path, capsys, monkeypatch):
    import attnkit.cli

    def broken(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(attnkit.cli, "cmd_demo", broken)
    parser = attnkit.cli.build_parser
    monkeypatch.setattr(attnkit.cli, "build_parser", lambda: _with_demo(parser(), broken))
    monkeypatch.delenv("ATTNKIT_DEBUG", raising=False)
    assert main(["demo", "--run-dir", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "bug in attnkit" in err and "ZeroDivisionError" in err, err
    monkeypatch.setenv("ATTNKIT_DEBUG", "1")
    assert main(["demo", "--run-dir", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("attnkit: internal error")


def _with_demo(parser, func):
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict) and "demo" in action.choices:
            action.choices["demo"].set_defaults(func=func)
    return parser


# --- and what is asked for explicitly still works


def test_overwrite_starts_a_run_again_and_average_overwrites_a_checkpoint(tmp_path, tiny_run, capsys):
    w = Work(tmp_path, tiny_run)
    old = sorted(p.name for p in (w.run / "checkpoints").iterdir())
    assert main([str(a) for a in ["train", w.config, "--run-dir", w.run, "--overwrite", "--set",
                                  "train.max_steps=2"]]) == 0
    new = sorted(p.name for p in (w.run / "checkpoints").iterdir())
    assert "step-4" in old and "step-4" not in new and "step-2" in new
    out = w.root / "avg"
    assert main([str(a) for a in ["average", w.run / "checkpoints" / "step-2", "-o", out]]) == 0
    assert main([str(a) for a in ["average", w.run / "checkpoints" / "step-2", "-o", out]]) == 2
    assert main([str(a) for a in ["average", w.run / "checkpoints" / "step-2", "-o", out, "--overwrite"]]) == 0


# --- classifiers: attnkit classify and attnkit evaluate --data, each refused in one line before anything is
# classified, with every file (the runs' included) left as it was

CLASSIFIER_CASES: list[tuple[str, object, object]] = []


def classifier_case(name: str, needle):
    def register(setup):
        CLASSIFIER_CASES.append((name, setup, needle))
        return setup
    return register


class ClassifierWork:
    """A classifier case's working directory and the runs it may use: ``cls`` (single sentences, labels 0 and 1),
    ``reg`` (a regressor of sentence pairs), ``ckpt`` (a translation model's checkpoint)."""

    def __init__(self, root: Path, cls: Path, reg: Path, ckpt: Path):
        self.root, self.cls, self.reg, self.ckpt = root, cls, reg, ckpt
        self.input = self.write("in.txt", "a gorgeous film\na dull film\n")
        self.pairs = self.write("pairs.tsv", "a man plays\ta man is playing\na dog runs\ta cat sleeps\n")

    def write(self, name: str, data: str | bytes) -> Path:
        path = self.root / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        return path

    def classify(self, run: Path, path: Path, *more) -> list:
        return ["classify", "--checkpoint", run, "--input", path, *more]


classifier_case("empty_line", "gaps.txt:2")(lambda w: w.classify(w.cls, w.write("gaps.txt", "a film\n \nfine\n")))
classifier_case("empty_line_on_stdin", "stdin:2")(lambda w: (["classify", "--checkpoint", w.cls], b"a film\n\nok\n"))
classifier_case("not_utf8", "latin.txt:2")(lambda w: w.classify(w.cls, w.write("latin.txt", b"a film\n\xe9t\xe9\n")))
classifier_case("pair_for_single_sentence_model", ("pairs.tsv:1", "single sentences"))(
    lambda w: w.classify(w.cls, w.pairs))
classifier_case("pair_on_stdin_for_single_sentence_model", ("stdin:2", "single sentences"))(
    lambda w: (["classify", "--checkpoint", w.cls], b"a film\na film\tanother\n"))
classifier_case("single_sentence_for_pair_model", ("in.txt:1", "sentence pairs"))(lambda w: w.classify(w.reg, w.input))
classifier_case("lines_format_for_pair_model", ("pairs.tsv:1", "--format tsv"))(
    lambda w: w.classify(w.reg, w.pairs, "--format", "lines"))
classifier_case("three_fields", "three.tsv:2")(
    lambda w: w.classify(w.reg, w.write("three.tsv", "a\tb\na\tb\tc\n")))
classifier_case("empty_second_sentence", ("half.tsv:1", "second sentence"))(
    lambda w: w.classify(w.reg, w.write("half.tsv", "a man plays\t \n")))
classifier_case("glue_format_not_glue", ("plain.tsv:1", "GLUE"))(
    lambda w: w.classify(w.cls, w.write("plain.tsv", "a film\nanother\n"), "--format", "glue"))
classifier_case("glue_format_on_stdin", "--format glue")(
    lambda w: (["classify", "--checkpoint", w.cls, "--format", "glue"], b"a film\n"))
classifier_case("text_column_not_in_header", ("cols.tsv:1", "column nope"))(
    lambda w: w.classify(w.cls, w.write("cols.tsv", "text\tid\na film\t1\n"), "--text-column", "nope"))
classifier_case("named_pair_column_for_single_sentence_model", ("cols.tsv:2", "single sentences"))(
    lambda w: w.classify(w.cls, w.write("cols.tsv", "a\tb\nx\ty\n"), "--text-column", "a", "--pair-column", "b"))
classifier_case("translation_model_classifies", "checkpoints/step-4: a transformer model cannot classify")(
    lambda w: w.classify(w.ckpt, w.input))
classifier_case("classify_missing_input", "nowhere.txt")(lambda w: w.classify(w.cls, w.root / "nowhere.txt"))
classifier_case("classify_batch_size_zero", "argument --batch-size: expected an integer of at least 1, got '0'")(
    lambda w: w.classify(w.cls, w.input, "--batch-size", "0"))
classifier_case("classify_output_is_directory", "--output")(lambda w: w.classify(w.cls, w.input, "-o", w.root))
classifier_case("evaluate_unknown_label", ("dev.tsv:3", "'2'", "column label"))(
    lambda w: ["evaluate", "--checkpoint", w.cls, "--data", w.write("dev.tsv", "sentence\tlabel\na\t0\nb\t2\n")])
classifier_case("evaluate_score_not_a_number", ("dev.tsv:2", "'high'"))(
    lambda w: ["evaluate", "--checkpoint", w.reg, "--data",
               w.write("dev.tsv", "sentence\tsentence2\tlabel\na\tb\thigh\n")])
classifier_case("evaluate_unlabelled_glue_test", ("test.tsv:1", "unlabelled"))(
    lambda w: ["evaluate", "--checkpoint", w.cls, "--data", w.write("test.tsv", "index\tsentence\n0\ta film\n")])
classifier_case("evaluate_data_missing", "nowhere.tsv")(
    lambda w: ["evaluate", "--checkpoint", w.cls, "--data", w.root / "nowhere.tsv"])
classifier_case("evaluate_data_and_src", "--data")(
    lambda w: ["evaluate", "--checkpoint", w.cls, "--data", w.input, "--src", w.input, "--ref", w.input])
classifier_case("evaluate_classifier_with_src_ref", "evaluate --data")(
    lambda w: ["evaluate", "--checkpoint", w.cls, "--src", w.input, "--ref", w.input])
classifier_case("evaluate_translation_without_src", "--src")(lambda w: ["evaluate", "--checkpoint", w.ckpt])
classifier_case("evaluate_text_column_without_data", "--text-column")(
    lambda w: ["evaluate", "--checkpoint", w.ckpt, "--src", w.input, "--ref", w.input, "--text-column", "a"])
classifier_case("evaluate_translation_model_on_data", "checkpoints/step-4: a transformer model cannot classify")(
    lambda w: ["evaluate", "--checkpoint", w.ckpt, "--data", w.write("dev.tsv", "sentence\tlabel\na\t0\n")])


@pytest.mark.parametrize("name, setup, needle", CLASSIFIER_CASES, ids=[c[0] for c in CLASSIFIER_CASES])
def test_classifier_bad_input(name, setup, needle, tmp_path, classifier_run, regressor_run, trained_checkpoint,
                              capsys, monkeypatch):
    import attnkit.decode

    monkeypatch.delenv("ATTNKIT_DEBUG", raising=False)
    w = ClassifierWork(tmp_path, classifier_run, regressor_run, trained_checkpoint)
    monkeypatch.chdir(tmp_path)
    argv = _with_stdin(setup(w), monkeypatch)

    def no_work(*a, **k):
        raise AssertionError("classifying started before the input was checked")

    monkeypatch.setattr(attnkit.decode, "classify", no_work)
    roots = (tmp_path, classifier_run, regressor_run)
    before = [tree_digest(root) for root in roots]
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: ") and "Traceback" not in err, err
    for n in needle if isinstance(needle, tuple) else (needle,):
        assert n in lines[0], (n, lines[0])
    assert [tree_digest(root) for root in roots] == before


# --- visual question answering: attnkit answer and evaluate --data with a VQA model

VQA_CASES = []


def vqa_case(name, needle):
    def register(setup):
        VQA_CASES.append((name, setup, needle))
        return setup
    return register


class VQAWork:
    def __init__(self, root: Path, vqa: Path, translator: Path):
        from serving import png

        self.root, self.vqa, self.translator = root, vqa, translator
        self.image = root / "shape.png"
        self.image.write_bytes(png())

    def write(self, name: str, text) -> Path:
        path = self.root / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        return path

    def answer(self, *more) -> list:
        return ["answer", "--checkpoint", self.vqa, *more]


def _huge_png() -> bytes:
    """A PNG whose header declares 100,000 x 100,000 pixels (past PIL's decompression-bomb limit)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


vqa_case("not_an_image", ("notes.png", "cannot read image"))(
    lambda w: w.answer(w.write("notes.png", "just some text\n"), "what color is the shape?"))
vqa_case("image_past_the_pixel_limit", ("huge.png", "cannot read image"))(
    lambda w: w.answer(w.write("huge.png", _huge_png()), "what color is the shape?"))
vqa_case("empty_question", "QUESTION: empty")(lambda w: w.answer(w.image, "  "))
vqa_case("missing_image", "nowhere.png: image not found")(lambda w: w.answer(w.root / "nowhere.png", "what?"))
vqa_case("one_argument", "IMAGE QUESTION")(lambda w: w.answer(w.image))
vqa_case("jsonl_invalid", "q.jsonl:2: invalid JSON")(
    lambda w: w.answer("--input", w.write("q.jsonl", '{"image": "shape.png", "question": "what?"}\n{oops\n')))
vqa_case("jsonl_missing_question", ("q.jsonl:1", "'question'"))(
    lambda w: w.answer("--input", w.write("q.jsonl", '{"image": "shape.png"}\n')))
vqa_case("jsonl_empty_question", ("q.jsonl:1", "'question'", "non-empty"))(
    lambda w: w.answer("--input", w.write("q.jsonl", '{"image": "shape.png", "question": ""}\n')))
vqa_case("jsonl_image_not_found", ("q.jsonl:1", "field 'image'", "gone.png"))(
    lambda w: w.answer("--input", w.write("q.jsonl", '{"image": "gone.png", "question": "what?"}\n')))
vqa_case("tsv_without_question_column", ("q.tsv:1", "'question'"))(
    lambda w: w.answer("--input", w.write("q.tsv", "image\tquery\nshape.png\twhat?\n")))
vqa_case("image_dir_without_input", "--image-dir")(lambda w: w.answer(w.image, "what?", "--image-dir", w.root))
vqa_case("translation_model_answers", "cannot answer")(
    lambda w: ["answer", "--checkpoint", w.translator, w.image, "what color is the shape?"])
vqa_case("evaluate_without_answers", ("d.jsonl:1", "'answer'"))(
    lambda w: ["evaluate", "--checkpoint", w.vqa, "--data",
               w.write("d.jsonl", '{"image": "shape.png", "question": "what?"}\n')])
vqa_case("evaluate_format_of_another_task", ("sst2:dev", "not a corpus of questions"))(
    lambda w: ["evaluate", "--checkpoint", w.vqa, "--data", "sst2:dev"])


@pytest.fixture(scope="module")
def vqa_checkpoint(tmp_path_factory) -> Path:
    from serving import tiny_answerer_checkpoint

    return tiny_answerer_checkpoint(tmp_path_factory.mktemp("vqa"))


@pytest.mark.parametrize("name, setup, needle", VQA_CASES, ids=[c[0] for c in VQA_CASES])
def test_vqa_bad_input(name, setup, needle, tmp_path, vqa_checkpoint, trained_checkpoint, capsys, monkeypatch):
    monkeypatch.delenv("ATTNKIT_DEBUG", raising=False)
    w = VQAWork(tmp_path, vqa_checkpoint, trained_checkpoint)
    monkeypatch.chdir(tmp_path)
    argv = [str(a) for a in setup(w)]
    before = [tree_digest(tmp_path), tree_digest(vqa_checkpoint)]
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: ") and "Traceback" not in err, err
    for n in needle if isinstance(needle, tuple) else (needle,):
        assert n in lines[0], (n, lines[0])
    assert [tree_digest(tmp_path), tree_digest(vqa_checkpoint)] == before
# --- speech: bad audio files for attnkit transcribe and evaluate --data


@pytest.fixture(scope="module")
def speech_checkpoint(tmp_path_factory) -> Path:
    """A tiny LAS's checkpoint (random weights) hearing 8 kHz audio, at most 2 s of it."""
    import torch

    from attnkit.checkpoint import model_for, write_checkpoint
    from attnkit.config import ExperimentConfig
    from attnkit.data import CharTokenizer
    from attnkit.models.las import LASConfig

    root = tmp_path_factory.mktemp("speech")
    cfg = ExperimentConfig(name="las", model=LASConfig(listener_size=8, speller_size=8, embedding_size=4,
                                                       attention_size=4))
    cfg.data.format, cfg.data.n_mels, cfg.data.max_audio_seconds = "fsdd_digits", 20, 2.0
    toks = CharTokenizer.build("0 1 2 3 4 5 6 7 8 9", root / "chars.json")
    torch.manual_seed(0)
    return write_checkpoint(root / "ckpt", model_for(cfg, toks), cfg, [toks.path], {})


def _wav(seconds: float, rate: int = 8000, amplitude: float = 0.3) -> bytes:
    import io

    import numpy as np
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (amplitude * np.sin(2 * np.pi * 440 * t)).astype("float32"), rate, format="WAV")
    return buf.getvalue()


SPEECH_CASES = {
    "not_audio": (b"plain text, not a sound\n" * 40, "not an audio file"),
    "empty": (b"", "empty file"),
    "silent": (_wav(1.0, amplitude=0.0), "silent"),
    "truncated_wav": (_wav(1.0)[:4000], "truncated WAV"),
    "rate_too_low": (_wav(1.0, rate=4000), "below the 8000 Hz"),
    "too_long": (_wav(3.0), "longer than the limit"),
}


@pytest.mark.parametrize("name", sorted(SPEECH_CASES))
@pytest.mark.parametrize("command", ["transcribe", "evaluate"])
def test_bad_audio_is_one_line_and_status_2(name, command, speech_checkpoint, tmp_path, capsys):
    data, needle = SPEECH_CASES[name]
    audio = tmp_path / f"{name}.wav"
    audio.write_bytes(data)
    (tmp_path / "good.wav").write_bytes(_wav(1.0))
    listing = tmp_path / "list.tsv"
    listing.write_text(f"good.wav\t1 2\n{audio.name}\t3\n")
    before = tree_digest(tmp_path)
    argv = ["transcribe", "--checkpoint", str(speech_checkpoint), str(tmp_path / "good.wav"), str(audio)] \
        if command == "transcribe" else ["evaluate", "--checkpoint", str(speech_checkpoint), "--data", str(listing)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and str(audio) in err[0], err
    assert tree_digest(tmp_path) == before  # nothing written, nothing changed
