"""Export to Hugging Face Marian, CTranslate2 and ONNX, and import from Marian: the same greedy translations."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint, write_checkpoint
from attnkit.cli import main
from attnkit.data import generate_dates, pad
from attnkit.decode import generate, max_lengths, translate
from attnkit.errors import AttnkitError
from attnkit.export import export
from attnkit.export.huggingface import (
    attnkit_config,
    check_exportable,
    hf_greedy,
    import_marian,
    load_marian,
    log_prob_gap,
    marian_order,
    write_tokenizer,
)
from attnkit.models import BOS, EOS, Transformer
from attnkit.models.transformer import DecoderState
from attnkit.nn.positional import sinusoidal_table
from conftest import tiny_experiment, tiny_model_config

transformers = pytest.importorskip("transformers")
# MarianTokenizer asks for sacremoses; without it (here) it normalises nothing, as attnkit
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


def _batch(toks, sentences, cfg):
    """-> (PAD-padded source ids with EOS [B, S], attnkit's length limits [B])."""
    ids = [s + [EOS] for s in toks.src.encode(sentences)]
    lens = max_lengths(torch.tensor([len(s) - 1 for s in ids]), cfg.decode.max_len_a, cfg.decode.max_len_b)
    return pad(ids), lens


def _greedy(model, src, lens) -> list[list[int]]:
    return [h[0].tokens for h in generate(model, src, lens)]


RECIPE_CHECKPOINT = Path(__file__).resolve().parents[1] / "runs" / "multi30k_en_de" / "checkpoints" / "averaged"


@pytest.fixture(scope="module")
def multi30k_checkpoint(tmp_path_factory, data_dir):
    """`make multi30k`'s averaged checkpoint where this machine has one (only read: exports go to tmp_path), for
    real translations; else a tiny Transformer trained for 60 steps on 3000 Multi30k pairs."""
    if (RECIPE_CHECKPOINT / "model.safetensors").exists():
        return RECIPE_CHECKPOINT
    from attnkit.train import Trainer

    cfg = tiny_experiment(max_steps=60, max_tokens=800, lr=3e-3, warmup_steps=20)
    cfg.data = dataclasses.replace(cfg.data, format="multi30k", vocab_size=1000, max_train_pairs=3000,
                                   max_valid_pairs=20)
    run = tmp_path_factory.mktemp("multi30k_run")
    Trainer(cfg, run, data_dir=str(data_dir)).train()
    return (run / "checkpoints" / "last").resolve()


def test_marian_order_turns_interleaved_sinusoids_into_concatenated():
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(50, 16)
    ours = sinusoidal_table(50, 16)[:, marian_order(16)]
    torch.testing.assert_close(ours, marian.create_weight(), atol=1e-6, rtol=0)


@pytest.fixture(params=["dates", "multi30k"])
def checkpoint_and_sentences(request):
    """The 4-step dates checkpoint with 30 dates, and the 30-step Multi30k one with 30 test_2016 sources."""
    if request.param == "dates":
        return request.getfixturevalue("trained_checkpoint"), generate_dates(30, seed=5).src
    from attnkit.data import load_split

    checkpoint = request.getfixturevalue("multi30k_checkpoint")
    data_dir = request.getfixturevalue("data_dir")
    return checkpoint, load_split(load_checkpoint(checkpoint)[1].data, "test", str(data_dir)).src[:30]


def test_huggingface_round_trip(checkpoint_and_sentences, tmp_path):
    checkpoint, sentences = checkpoint_and_sentences
    model, cfg, toks, _ = load_checkpoint(checkpoint)
    src, lens = _batch(toks, sentences, cfg)
    ours = _greedy(model, src, lens)
    assert len({tuple(o) for o in ours}) > 1  # the outputs depend on the input

    hf_dir, gap = export(checkpoint, "huggingface", tmp_path / "marian")
    assert gap < 1e-4
    hf = load_marian(hf_dir)
    tokenizer = transformers.MarianTokenizer.from_pretrained(hf_dir)
    assert tokenizer(sentences)["input_ids"] == [[int(i) for i in row if i] for row in src]
    assert hf_greedy(hf, src, lens) == ours
    # the user's path: text -> MarianTokenizer -> generate -> text, as attnkit translate (39 tokens + EOS at most)
    inputs = tokenizer(sentences[:4], return_tensors="pt", padding=True)
    texts = tokenizer.batch_decode(hf.generate(**inputs, num_beams=1, max_length=40), skip_special_tokens=True)
    assert texts == [t.text[0] for t in translate(model, toks, sentences[:4], beam_size=1, max_len_a=0.0,
                                                  max_len_b=39)]

    back = import_marian(hf_dir, tmp_path / "back")
    model2, _, _, _ = load_checkpoint(back)
    for (name, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), name  # the permutation is exact: every weight comes back bit for bit
    assert _greedy(model2, src, lens) == ours


def test_ctranslate2_matches_greedy(checkpoint_and_sentences, tmp_path):
    pytest.importorskip("ctranslate2")
    from attnkit.export import ct2

    checkpoint, sentences = checkpoint_and_sentences
    model, cfg, toks, _ = load_checkpoint(checkpoint)
    src, lens = _batch(toks, sentences, cfg)
    path, gap = export(checkpoint, "ctranslate2", tmp_path / "ct2")
    assert gap < 1e-4
    src_ids = [[int(i) for i in row if i] for row in src]
    assert ct2.ct2_generate(ct2.translator(path), toks, src_ids, lens.tolist()) == _greedy(model, src, lens)


def test_a_ctranslate2_export_carries_a_vocabulary_map_it_translates_with(trained_checkpoint, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from attnkit.export import ct2

    vmap = tmp_path / "vmap.txt"
    assert main(["shortlist", str(trained_checkpoint), "--output", str(vmap)]) == 0
    path = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(trained_checkpoint), "--to", "ctranslate2", "-o", str(path),
                 "--vmap", str(vmap)]) == 0
    assert (path / "vmap.txt").read_text(encoding="utf-8") == vmap.read_text(encoding="utf-8")
    model, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    src, lens = _batch(toks, generate_dates(6, seed=3).src, cfg)
    src_ids = [[int(i) for i in row if i] for row in src]
    assert len(ct2.ct2_generate(ct2.translator(path), toks, src_ids, lens.tolist(), use_vmap=True)) == 6
    bad = tmp_path / "bad.txt"
    bad.write_text("\t</s>\nno tab\n", encoding="utf-8")
    for to, vmap_file, problem in (("ctranslate2", bad, f"{bad}:2: expected"),
                                   ("onnx", vmap, "--vmap: only a CTranslate2 export carries a vocabulary map")):
        out = tmp_path / f"refused-{to}"
        with pytest.raises(AttnkitError, match=problem):
            export(trained_checkpoint, to, out, vmap_file)
        assert not out.exists() or not any(out.iterdir())


def test_onnx_encoder_and_step_match_pytorch(trained_checkpoint, tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from attnkit.export.onnx_export import DecoderStepGraph, EncoderGraph, OnnxTransformer, step_gap

    model, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    src, lens = _batch(toks, generate_dates(12, seed=7).src, cfg)
    # the graphs' modules, in PyTorch: the core DecoderState(memory, memory_kv, caches, offset) built from tensors
    with torch.no_grad():
        state, tokens = model.init_state(model.encode(src)), torch.full((src.size(0),), BOS, dtype=torch.long)
        for _ in range(3):
            log_probs, state, _ = model.step(tokens, state)
            tokens = log_probs.argmax(-1)
        assert isinstance(state, DecoderState) and state.offset == 3
        cross_keys, cross_values = EncoderGraph(model)(src)
        graph = DecoderStepGraph(model)(tokens, src, cross_keys, cross_values,
                                        torch.stack([c.keys for c in state.caches]),
                                        torch.stack([c.values for c in state.caches]))
        log_probs, state, _ = model.step(tokens, state)
    torch.testing.assert_close(cross_keys, torch.stack([kv.keys for kv in state.memory_kv]))
    torch.testing.assert_close(cross_values, torch.stack([kv.values for kv in state.memory_kv]))
    torch.testing.assert_close(graph[0], log_probs)
    torch.testing.assert_close(graph[1], torch.stack([c.keys for c in state.caches]))
    torch.testing.assert_close(graph[2], torch.stack([c.values for c in state.caches]))

    path, _ = export(trained_checkpoint, "onnx", tmp_path / "onnx")
    onnx_model = OnnxTransformer(path)
    assert onnx_model.search_steps() == {}  # attnkit's own search steps over its step()
    assert step_gap(model, onnx_model, src, steps=10) < 1e-4
    assert _greedy(onnx_model, src, lens) == _greedy(model, src, lens)  # attnkit's search over onnxruntime

    def beam(m):  # beams reordered with select(..., same_source=True) on the numpy state too
        return [h[0].tokens for h in generate(m, src, lens, beam_size=3)]
    assert beam(onnx_model) == beam(model)


def test_random_marian_model_imports_with_the_same_greedy_outputs(trained_checkpoint, tmp_path):
    _, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    v = toks.src.vocab_size
    config = transformers.MarianConfig(
        vocab_size=v, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="gelu",
        max_position_embeddings=128, scale_embedding=True, pad_token_id=0, eos_token_id=3, bos_token_id=2,
        decoder_start_token_id=2, forced_eos_token_id=3, init_std=0.2)
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(config).eval()
    hf_dir = tmp_path / "random_marian"
    hf.save_pretrained(hf_dir)
    write_tokenizer(toks, cfg, hf_dir)

    ckpt = import_marian(hf_dir, tmp_path / "imported")
    model, cfg2, toks2, _ = load_checkpoint(ckpt)
    assert cfg2.model.activation == "gelu" and toks2.src.vocab_size == v
    src, lens = _batch(toks2, generate_dates(30, seed=5).src, cfg2)
    hf = load_marian(hf_dir)
    assert log_prob_gap(model, hf, src, src[:, :6]) < 1e-4
    outputs = _greedy(model, src, lens)
    assert len({tuple(o) for o in outputs}) > 1  # the outputs depend on the input
    assert hf_greedy(hf, src, lens) == outputs


def test_separate_vocabularies_export_and_come_back(tmp_path):
    """share_embeddings = false: two SentencePiece models, two embeddings, target_vocab.json; CTranslate2 gets two
    vocabularies."""
    from attnkit.data import train_tokenizer

    pairs = generate_dates(300, seed=0)
    files = [tmp_path / "spm.src.model", tmp_path / "spm.tgt.model"]
    src_tok, tgt_tok = train_tokenizer(pairs.src, files[0], 64), train_tokenizer(pairs.tgt, files[1], 40)
    cfg = tiny_experiment()
    cfg.data.joint_vocab, cfg.model.share_embeddings = False, False
    torch.manual_seed(0)
    model = Transformer(cfg.model, src_tok.vocab_size, tgt_tok.vocab_size)
    for p in model.parameters():  # a random model far from uniform, so that its outputs vary
        torch.nn.init.normal_(p, std=0.3)
    checkpoint = write_checkpoint(tmp_path / "ckpt", model, cfg, files, {})
    model, cfg, toks, _ = load_checkpoint(checkpoint)
    src, lens = _batch(toks, generate_dates(20, seed=3).src, cfg)
    ours = _greedy(model, src, lens)
    assert len({tuple(o) for o in ours}) > 1

    hf_dir, gap = export(checkpoint, "huggingface", tmp_path / "marian")
    assert gap < 1e-4 and (hf_dir / "target_vocab.json").exists()
    assert hf_greedy(load_marian(hf_dir), src, lens) == ours
    model2, _, _, _ = load_checkpoint(import_marian(hf_dir, tmp_path / "back"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    if importlib.util.find_spec("ctranslate2"):
        from attnkit.export import ct2

        path, gap = export(checkpoint, "ctranslate2", tmp_path / "ct2")
        src_ids = [[int(i) for i in row if i] for row in src]
        assert gap < 1e-4 and ct2.ct2_generate(ct2.translator(path), toks, src_ids, lens.tolist()) == ours


def test_export_refuses_what_marian_cannot_express():
    with pytest.raises(AttnkitError, match="norm_first"):
        check_exportable(tiny_model_config(norm_first=True))
    with pytest.raises(AttnkitError, match="positional"):
        check_exportable(tiny_model_config(positional="learned"))
    # Opus-MT's ids: pad = decoder start = the last id, eos = 0
    opus_like = transformers.MarianConfig(vocab_size=100, d_model=32, encoder_attention_heads=4,
                                          decoder_attention_heads=4, scale_embedding=True)
    with pytest.raises(AttnkitError, match="decoder_start"):
        attnkit_config(opus_like, "x")


def test_cli_errors_are_one_line(trained_checkpoint, tmp_path, capsys):
    _, cfg, toks, _ = load_checkpoint(trained_checkpoint)
    cfg.model.norm_first = True
    pre_ln = write_checkpoint(tmp_path / "pre_ln", Transformer(cfg.model, toks.src.vocab_size, toks.tgt.vocab_size),
                              cfg, [toks.src.path], {})
    assert main(["export", "--checkpoint", str(pre_ln), "--to", "huggingface", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "norm_first" in err and "\n" not in err

    assert main(["export", "--checkpoint", str(trained_checkpoint), "--to", "huggingface",
                 "-o", str(tmp_path / "hf")]) == 0
    for to in ("huggingface", "ctranslate2", "onnx"):  # never into a directory that holds something
        assert main(["export", "--checkpoint", str(trained_checkpoint), "--to", to, "-o", str(trained_checkpoint)]) == 2
        assert "not an empty directory" in capsys.readouterr().err
    assert (trained_checkpoint / "model.safetensors").exists()
    (tmp_path / "hf" / "source.spm").unlink()
    assert main(["import-marian", str(tmp_path / "hf"), "-o", str(tmp_path / "back")]) == 2
    assert "source.spm: missing" in capsys.readouterr().err
