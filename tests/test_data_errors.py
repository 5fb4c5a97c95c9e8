"""Readers, batching and config, and the CLI's promise: every user error is one line on stderr and exit 2."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnkit.cli import main
from attnkit.config import ExperimentConfig, dump_toml, load_config
from attnkit.data import BOS, EOS, PAD, collate, read_lines, read_multi30k, read_parallel, read_tatoeba, token_batches
from attnkit.data.prepare import tatoeba_split
from attnkit.errors import AttnkitError
from attnkit.models.lm import LMConfig
from attnkit.models.rnn import RNNSearchConfig
from attnkit.models.transformer import TransformerConfig


def _assert_one_line_error(err: str, *needles: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("attnkit: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _run_cli(capsys, *argv) -> str:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 2, (code, out.err)
    return out.err


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _parallel_config(tmp_path: Path, src: Path, tgt: Path) -> Path:
    return _write(tmp_path / "exp.toml", f"""name = "t"
[data]
format = "parallel"
train_src = "{src}"
train_tgt = "{tgt}"
valid_src = "{src}"
valid_tgt = "{tgt}"
""")


# --- corpus errors, through `attnkit train` and `attnkit evaluate`


def test_misaligned_files(tmp_path, capsys):
    src = _write(tmp_path / "train.en", "a b\nc d\ne f\n")
    tgt = _write(tmp_path / "train.de", "x y\nz w\n")
    err = _run_cli(capsys, "train", _parallel_config(tmp_path, src, tgt), "--run-dir", tmp_path / "run")
    _assert_one_line_error(err, str(src), str(tgt), "3", "2")
    with pytest.raises(AttnkitError, match="not aligned"):
        read_parallel(src, tgt)


def test_evaluate_misaligned_files(tmp_path, capsys, trained_checkpoint):
    src = _write(tmp_path / "test.src", "1 May 2000\n2 May 2000\n")
    ref = _write(tmp_path / "test.ref", "2000-05-01\n")
    err = _run_cli(capsys, "evaluate", "--checkpoint", trained_checkpoint, "--src", src, "--ref", ref)
    _assert_one_line_error(err, str(src), str(ref))


def test_invalid_utf8_names_file_and_line(tmp_path, capsys):
    src = _write(tmp_path / "train.en", b"fine\nalso fine\nbad \xff\xfe byte\n")
    tgt = _write(tmp_path / "train.de", "gut\nauch gut\nschlecht\n")
    err = _run_cli(capsys, "train", _parallel_config(tmp_path, src, tgt), "--run-dir", tmp_path / "run")
    _assert_one_line_error(err, f"{src}:3:", "UTF-8")


def test_invalid_utf8_in_gzip(tmp_path):
    import gzip

    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(b"ok\n\xc3\x28\n"))
    with pytest.raises(AttnkitError, match=rf"^{path}:2: invalid UTF-8"):
        read_lines(path)


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_empty_side_names_file_and_line(tmp_path, capsys, side):
    lines = {"src": "a\nb\nc\n", "tgt": "x\ny\nz\n"}
    lines[side] = {"src": "a\n   \nc\n", "tgt": "x\n\nz\n"}[side]
    src = _write(tmp_path / "train.en", lines["src"])
    tgt = _write(tmp_path / "train.de", lines["tgt"])
    err = _run_cli(capsys, "train", _parallel_config(tmp_path, src, tgt), "--run-dir", tmp_path / "run")
    bad = src if side == "src" else tgt
    _assert_one_line_error(err, f"{bad}:2:", "empty")


def test_missing_file(tmp_path, capsys):
    src = tmp_path / "nope.en"
    tgt = _write(tmp_path / "train.de", "x\n")
    err = _run_cli(capsys, "train", _parallel_config(tmp_path, src, tgt), "--run-dir", tmp_path / "run")
    _assert_one_line_error(err, str(src), "not found")


# --- config errors


def test_unknown_config_key(tmp_path, capsys):
    cfg = _write(tmp_path / "exp.toml", 'name = "t"\n[train]\nlr = 1e-3\nlearning_rat = 0.1\n')
    err = _run_cli(capsys, "train", cfg, "--run-dir", tmp_path / "run")
    _assert_one_line_error(err, str(cfg), "learning_rat")
    assert not (tmp_path / "run").exists()


def test_unknown_key_in_set(tmp_path, capsys):
    cfg = _write(tmp_path / "exp.toml", 'name = "t"\n')
    err = _run_cli(capsys, "train", cfg, "--set", "model.d_modle=64", "--run-dir", tmp_path / "run")
    _assert_one_line_error(err, "d_modle")


def test_unknown_table(tmp_path, capsys):
    cfg = _write(tmp_path / "exp.toml", '[optim]\nlr = 1\n')
    _assert_one_line_error(_run_cli(capsys, "train", cfg), str(cfg), "optim")


@pytest.mark.parametrize("line,key", [('lr = "fast"', "train.lr"), ("max_steps = 1.5", "train.max_steps"),
                                      ("progress = 1", "train.progress"), ("betas = [0.9]", "train.betas")])
def test_bad_value_type(tmp_path, capsys, line, key):
    cfg = _write(tmp_path / "exp.toml", f"[train]\n{line}\n")
    err = _run_cli(capsys, "train", cfg, "--run-dir", tmp_path / "run")
    _assert_one_line_error(err, str(cfg), key)


@pytest.mark.parametrize("text,needle", [("[model]\nd_model = 30\nn_heads = 4\n", "divisible"),
                                         ("[model]\ndropout = 1.5\n", "model.dropout"),
                                         ('[data]\nformat = "csv"\n', "data.format"),
                                         ("[model\nd_model = 3\n", "invalid TOML"),
                                         # one config dataclass per family: its own keys, its own checks
                                         ('[model]\nfamily = "lstm"\n', "model.family"),
                                         ('[model]\nfamily = "rnnsearch"\nd_model = 64\n', "'embedding_size'"),
                                         ('[model]\nfamily = "rnnsearch"\nn_heads = 4\n', "unknown key 'n_heads'"),
                                         ("[model]\nn_encoder_layers = 0\n", "model.n_encoder_layers"),
                                         ('[model]\nfamily = "show_attend_tell"\n', "flickr8k"),
                                         ('[data]\nformat = "flickr8k"\n', "'transformer'"),
                                         ('[model]\nfamily = "transformer_lm"\n', "tinyshakespeare"),
                                         ('[model]\npreset = "lm_tiny"\n', "model.preset"),
                                         ('[model]\nfamily = "conv_transformer"\nconv_kernel = 4\n', "conv_kernel"),
                                         ('[train]\nfast = ["turbo"]\n', "train.fast")])
def test_invalid_config_values(tmp_path, capsys, text, needle):
    cfg = _write(tmp_path / "exp.toml", text)
    _assert_one_line_error(_run_cli(capsys, "train", cfg), str(cfg), needle)


def test_config_loading_and_round_trip(tmp_path):
    cfg_file = _write(tmp_path / "exp.toml", '[model]\npreset = "tiny"\ndropout = 0.2\n[train]\nlr = 1\n')
    cfg = load_config(cfg_file, ["train.max_steps=7", "data.format=dates", "train.betas=[0.8, 0.9]"])
    assert cfg.model.d_model == 128 and cfg.model.dropout == 0.2  # preset, then the file's keys win
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 7 and cfg.data.format == "dates" and cfg.train.betas == (0.8, 0.9)
    again = load_config(_write(tmp_path / "dumped.toml", dump_toml(cfg)))
    assert again == cfg and isinstance(cfg.model, TransformerConfig)
    assert load_config(None) == ExperimentConfig()
    # other families: their own dataclass and presets, and the same round trip
    lm = load_config(_write(tmp_path / "lm.toml", '[model]\nfamily = "transformer_lm"\npreset = "lm_tiny"\n'
                                                 '[data]\nformat = "tinyshakespeare"\n'))
    assert isinstance(lm.model, LMConfig) and lm.model.n_layers == 2 and lm.model.d_model == 128
    assert load_config(_write(tmp_path / "lm_dumped.toml", dump_toml(lm))) == lm
    rnn = load_config(_write(tmp_path / "rnn.toml", '[model]\nfamily = "rnnsearch"\nhidden_size = 64\n'
                                                   'attention_score = "dot"\n[data]\nformat = "dates"\n'))
    assert isinstance(rnn.model, RNNSearchConfig) and rnn.model.hidden_size == rnn.model.width == 64
    assert load_config(_write(tmp_path / "rnn_dumped.toml", dump_toml(rnn))) == rnn


# --- checkpoint errors


def _checkpoint_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_truncated_safetensors(tmp_path, capsys, trained_checkpoint):
    ckpt = _checkpoint_copy(trained_checkpoint, tmp_path / "ckpt")
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    inp = _write(tmp_path / "in.txt", "4 March 1997\n")
    for cut in (len(data) // 2, 5):
        weights.write_bytes(data[:cut])
        err = _run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", inp)
        _assert_one_line_error(err, str(weights))


def test_checkpoint_from_another_config(tmp_path, capsys, trained_checkpoint):
    ckpt = _checkpoint_copy(trained_checkpoint, tmp_path / "ckpt")
    config = ckpt / "config.toml"
    text = config.read_text()
    assert "d_model = 32\n" in text
    config.write_text(text.replace("d_model = 32\n", "d_model = 48\n"))
    inp = _write(tmp_path / "in.txt", "4 March 1997\n")
    err = _run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", inp)
    line = _assert_one_line_error(err, "model.safetensors")
    assert "config" in line


def test_checkpoint_with_another_depth(tmp_path, capsys, trained_checkpoint):
    ckpt = _checkpoint_copy(trained_checkpoint, tmp_path / "ckpt")
    config = ckpt / "config.toml"
    config.write_text(config.read_text().replace("n_decoder_layers = 2\n", "n_decoder_layers = 3\n"))
    err = _run_cli(capsys, "translate", "--checkpoint", ckpt, "--input", _write(tmp_path / "in.txt", "1 May 2000\n"))
    _assert_one_line_error(err, "model.safetensors", "missing")


def test_not_a_checkpoint(tmp_path, capsys):
    err = _run_cli(capsys, "translate", "--checkpoint", tmp_path, "--input", _write(tmp_path / "in.txt", "x\n"))
    _assert_one_line_error(err, str(tmp_path), "not a checkpoint")


@pytest.mark.parametrize("case", ["misaligned", "truncated", "unknown_key"])
def test_cli_subprocess_exit_code(tmp_path, trained_checkpoint, case):
    """The real entry point (``python -m attnkit``): exit status 2, one line, no traceback, nothing on stdout."""
    if case == "misaligned":
        src = _write(tmp_path / "a.en", "a\nb\n")
        tgt = _write(tmp_path / "a.de", "x\n")
        argv = ["train", _parallel_config(tmp_path, src, tgt), "--run-dir", tmp_path / "run"]
        needles = [str(src), str(tgt)]
    elif case == "truncated":
        ckpt = _checkpoint_copy(trained_checkpoint, tmp_path / "ckpt")
        (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:1000])
        argv = ["translate", "--checkpoint", ckpt, "--input", _write(tmp_path / "in.txt", "1 May 2000\n")]
        needles = ["model.safetensors"]
    else:
        cfg = _write(tmp_path / "exp.toml", "[decode]\nbeam = 4\n")
        argv = ["train", cfg]
        needles = [str(cfg), "beam"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "attnkit", *map(str, argv)], capture_output=True, text=True,
                          check=False, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    _assert_one_line_error(proc.stderr, *needles)


# --- batching


def _lengths(n=400, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 40, n).tolist(), rng.integers(1, 40, n).tolist()


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_token_batches_respect_budget_and_cover_everything(seed):
    src, tgt = _lengths()
    max_tokens = 200
    batches = token_batches(src, tgt, max_tokens, seed=seed, epoch=0)
    assert len(batches) > 10
    for b in batches:
        longest = max(max(src[i], tgt[i]) for i in b)
        assert len(b) * (longest + 1) <= max_tokens
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(src)))
    # batches are length-bucketed: their padding waste is small
    padded = sum(len(b) * (max(max(src[i], tgt[i]) for i in b) + 1) for b in batches)
    real = sum(max(s, t) + 1 for s, t in zip(src, tgt))
    assert real / padded > 0.8


def test_token_batches_order_is_reproducible():
    src, tgt = _lengths()
    a = token_batches(src, tgt, 200, seed=5, epoch=3)
    assert a == token_batches(src, tgt, 200, seed=5, epoch=3)
    assert a != token_batches(src, tgt, 200, seed=5, epoch=4)
    assert a != token_batches(src, tgt, 200, seed=6, epoch=3)
    plain = token_batches(src, tgt, 200)
    assert plain == token_batches(src, tgt, 200)
    lens = [max(src[b[0]], tgt[b[0]]) for b in plain]
    assert [src[b[0]] for b in plain] == sorted(src[b[0]] for b in plain)  # decoding order: by length
    assert lens


def test_collate_adds_bos_eos_and_padding():
    b = collate([[5, 6, 7], [8]], [[9], [10, 11]], [4, 2])
    assert b.src.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert b.tgt_in.tolist() == [[BOS, 9, PAD], [BOS, 10, 11]]
    assert b.tgt_out.tolist() == [[9, EOS, PAD], [10, 11, EOS]]
    assert b.n_tokens == 5 and b.indices == [4, 2]


# --- the real corpora


def test_read_tatoeba_deu_eng(data_dir):
    path = data_dir / "tatoeba" / "deu-eng.zip"
    if not path.exists():
        pytest.skip(f"{path} missing")
    pairs = read_tatoeba(path)
    assert len(pairs.src) == len(pairs.tgt) == 169813
    assert all(s.strip() and t.strip() for s, t in zip(pairs.src[:1000], pairs.tgt[:1000]))
    assert pairs.src[0] == "Hi."  # English first
    from attnkit.config import DataConfig

    sizes = {split: len(tatoeba_split(DataConfig(format="tatoeba"), split, str(data_dir)).src)
             for split in ("train", "valid", "test")}
    assert sum(sizes.values()) == 169813
    assert sizes["valid"] == 3397 and sizes["test"] == 3396


def test_read_tatoeba_errors(tmp_path):
    good = _write(tmp_path / "t.txt", "Hi.\tHallo!\tCC-BY\nGo.\tGeh.\n")
    pairs = read_tatoeba(good, reverse=True)
    assert pairs.src == ["Hallo!", "Geh."] and pairs.tgt == ["Hi.", "Go."]
    bad = _write(tmp_path / "bad.txt", "Hi.\tHallo!\nno tab here\n")
    with pytest.raises(AttnkitError, match=rf"{bad}:2: expected two tab-separated columns"):
        read_tatoeba(bad)


def test_read_multi30k(data_dir):
    if not (data_dir / "multi30k" / "task1" / "raw" / "val.en.gz").exists():
        pytest.skip("multi30k missing")
    val = read_multi30k(data_dir, "val")
    assert len(val.src) == len(val.tgt) == 1014
    assert "\n" not in val.src[0] and "\r" not in val.tgt[0]
