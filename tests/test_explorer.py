"""The attention explorer (``attnkit serve``'s page at ``/``) used as a person uses it: a real server on
127.0.0.1 serving tiny models of five families, driven by a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, installed by ``make browser``) through Selenium.

Each view is loaded, used (translate and watch the matrix fill, switch layer and head, mask heads and re-run,
generate at two temperatures, caption an image, ...), exported, reproduced from its URL, and photographed into
``$ATTNKIT_SCREENSHOTS/explorer_<view>.png`` (a temporary folder by default: a test run leaves the checkout as it
was; the README's pictures come from the recipes' models, bench/screenshots.py, whose browser set-up these tests
share and whose own run is tested last). The long-input test renders the model view of a 200-token source with
every head of a 6-layer, 8-head model and prints how long that took.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from attnkit.checkpoint import load_checkpoint, load_tokenizers, model_for, read_config, write_checkpoint
from attnkit.config import ExperimentConfig
from attnkit.data import WordVocab, generate_dates, load_image, pad
from attnkit.models.captioner import ShowAttendTellConfig
from attnkit.models.lm import LMConfig
from attnkit.models.rnn import RNNSearchConfig
from attnkit.tokens import BOS, EOS
from conftest import tiny_model_config
from serving import tiny_answerer_checkpoint, tiny_speech_checkpoint

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIGURES = Path(os.environ.get("ATTNKIT_SCREENSHOTS") or Path(tempfile.gettempdir()) / "attnkit-explorer-shots")
SAMPLES = ROOT / "src" / "attnkit" / "serve" / "static" / "samples"


def _bench_screenshots():
    """bench/screenshots.py (the README's pictures from the recipes' models): its browser set-up is the tests'."""
    spec = importlib.util.spec_from_file_location("bench_screenshots", ROOT / "bench" / "screenshots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHOTS = _bench_screenshots()
SENTENCE = "March 3, 2021"

pytestmark = pytest.mark.skipif(SHOTS.CHROMIUM is None or SHOTS.CHROMEDRIVER is None,
                                reason="no Chromium: `make browser` installs Debian's chromium and chromium-driver")


# --- tiny checkpoints of the families the views need (seconds to build on one thread)


def _fit(model, batches, steps: int, lr: float):
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for i in range(steps):
        src, tgt_in, tgt_out = batches(i)
        loss = model(src, tgt_in, targets=tgt_out).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model


def _teacher(rows: list[list[int]]):
    return pad([[BOS] + r for r in rows]), pad([r + [EOS] for r in rows])


def _tokenizer_files(checkpoint: Path) -> list[Path]:
    return [f for f in checkpoint.iterdir() if f.suffix in (".model", ".vocab") or f.name.endswith(".txt")]


def build_lm(path: Path) -> Path:
    """A word-level language model on a toy grammar ("the dog runs in the park ."), 80 steps."""
    rnd = random.Random(0)
    lines = [f"the {rnd.choice(['dog', 'cat', 'bird', 'horse'])} {rnd.choice(['runs', 'sleeps', 'sits', 'plays'])} "
             f"in the {rnd.choice(['park', 'garden', 'house', 'field'])} ." for _ in range(300)]
    cfg = ExperimentConfig(name="tiny_lm")
    cfg.model = LMConfig(d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_positions=64)
    cfg.data = dataclasses.replace(cfg.data, format="wikitext2", block_size=32)
    path.mkdir(parents=True)
    vocab = WordVocab.build(lines, path / "vocab.txt", min_count=1, pretokenized=True)
    stream = [i for ids in vocab.encode(lines) for i in (*ids, EOS)]
    torch.manual_seed(0)
    model = model_for(cfg, vocab)

    def batches(_):
        rows = torch.tensor([[BOS] + stream[s:s + 31] for s in (rnd.randrange(len(stream) - 32) for _ in range(16))])
        return None, rows[:, :-1], rows[:, 1:]

    _fit(model, batches, 80, 1e-2)
    return write_checkpoint(path / "checkpoint", model, cfg, [path / "vocab.txt"], {})


CAPTIONS = {"dog": "a brown dog stands on the green grass", "beach": "a red umbrella on a sandy beach",
            "street": "a red car drives down a city street"}


def build_captioner(path: Path) -> Path:
    """Show, Attend and Tell fitted to the page's three sample images and a caption each."""
    from attnkit.nn.vision import load_pretrained, normalize

    cfg = ExperimentConfig(name="tiny_captioner")
    cfg.model = ShowAttendTellConfig(hidden_size=64, attention_size=64, dropout=0.0)
    cfg.data = dataclasses.replace(cfg.data, format="flickr8k")
    path.mkdir(parents=True)
    vocab = WordVocab.build(CAPTIONS.values(), path / "vocab.txt", min_count=1)
    encoder = load_pretrained(cfg.data.image_grid).eval()
    with torch.no_grad():
        pixels = normalize(torch.stack([load_image(SAMPLES / f"{name}.png") for name in CAPTIONS]))
        grids = encoder.forward_features(pixels).flatten(2).transpose(1, 2).contiguous()
    torch.manual_seed(0)
    model = model_for(cfg, vocab)
    tgt_in, tgt_out = _teacher(vocab.encode(list(CAPTIONS.values())))
    _fit(model, lambda _: (grids, tgt_in, tgt_out), 60, 2e-2)
    return write_checkpoint(path / "checkpoint", model, cfg, [path / "vocab.txt"], {})


def _dates_batches(toks, seed: int = 0):
    pairs = generate_dates(2000, seed=seed)
    rnd = random.Random(seed)

    def batches(_):
        idx = [rnd.randrange(len(pairs.src)) for _ in range(32)]
        src = pad([s + [EOS] for s in toks.src.encode([pairs.src[k] for k in idx])])
        return (src, *_teacher(toks.tgt.encode([pairs.tgt[k] for k in idx])))

    return batches


def build_dates(path: Path, dates_checkpoint: Path) -> Path:
    """The tiny dates checkpoint (4 training steps) trained on for 200 more: its translations and attention
    start to make sense, which the screenshots show."""
    model, cfg, toks, _ = load_checkpoint(dates_checkpoint)
    torch.manual_seed(0)
    model = _fit(model, _dates_batches(toks), 200, 5e-3)
    return write_checkpoint(path, model, cfg, _tokenizer_files(dates_checkpoint), {})


def build_rnnsearch(path: Path, dates_checkpoint: Path) -> Path:
    """RNNsearch on the dates task with the dates checkpoint's tokenizer."""
    base = read_config(dates_checkpoint)
    toks = load_tokenizers(base, dates_checkpoint)
    cfg = dataclasses.replace(base, model=RNNSearchConfig(embedding_size=32, hidden_size=64, n_encoder_layers=1,
                                                          n_decoder_layers=1, dropout=0.0))
    torch.manual_seed(0)
    model = _fit(model_for(cfg, toks), _dates_batches(toks, seed=1), 100, 1e-2)
    return write_checkpoint(path, model, cfg, _tokenizer_files(dates_checkpoint), {})


def build_wide(path: Path, dates_checkpoint: Path) -> Path:
    """An untrained Transformer of 6 + 6 layers and 8 heads that reads 512 positions: the long-input test's."""
    base = read_config(dates_checkpoint)
    toks = load_tokenizers(base, dates_checkpoint)
    cfg = dataclasses.replace(base, model=tiny_model_config(d_model=64, n_heads=8, d_ff=64, n_encoder_layers=6,
                                                             n_decoder_layers=6, max_positions=512))
    torch.manual_seed(0)
    return write_checkpoint(path, model_for(cfg, toks).eval(), cfg, _tokenizer_files(dates_checkpoint), {})


# --- the server and the browser


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, trained_checkpoint) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("explorer_models")
    return {"dates": build_dates(root / "dates", trained_checkpoint),
            "rnnsearch": build_rnnsearch(root / "rnnsearch", trained_checkpoint),
            "lm": build_lm(root / "lm"), "captioner": build_captioner(root / "captioner"),
            "wide": build_wide(root / "wide", trained_checkpoint),
            "vqa": tiny_answerer_checkpoint(root / "vqa"), "las": tiny_speech_checkpoint(root / "las")}


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory):
    """``attnkit serve`` on a free loopback port, as a user starts it."""
    proc, url = SHOTS.start_server(checkpoints, tmp_path_factory.mktemp("serve") / "serve.log")
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory, downloads):
    driver = SHOTS.open_browser(tmp_path_factory.mktemp("chromium-profile"), downloads)
    yield driver
    driver.quit()


class Page:
    """What the tests do in the page: open a view, wait for it, read it, photograph it."""

    def __init__(self, driver, url: str):
        self.d, self.url = driver, url

    def js(self, script: str, *args):
        return self.d.execute_script(script, *args)

    def wait(self, condition, timeout: float = 30, what: str = ""):
        try:
            return WebDriverWait(self.d, timeout, poll_frequency=0.05).until(lambda _: condition())
        except TimeoutException:
            status = self.js("return [...document.querySelectorAll('[data-role=status]')].map(e => e.textContent)")
            logs = [e["message"] for e in self.d.get_log("browser")]
            raise AssertionError(f"timed out waiting for {what or condition}; status {status}; "
                                 f"console {logs}") from None

    def open(self, view_hash: str, runs: int | None = None):
        """Load the page on a view and wait for it, and for the run it starts on its (first) example."""
        self.d.get("about:blank")
        self.d.get(f"{self.url}/#{view_hash}")
        self.wait_view(view_hash.split("?")[0])
        if runs:
            self.wait_done(runs)

    def wait_view(self, view: str):
        """Wait for ``view`` to be shown and the run it started on opening to be over."""
        self.wait(lambda: self.js("return !!(window.attnkit && window.attnkit.ready && window.attnkit.viewId)") and
                  self.js("return window.attnkit.viewId") == view, what=f"the {view} view")
        self.wait(lambda: self.js("return window.attnkit.settled === true"), what=f"the {view} view's first run")

    def tab(self, view: str):
        """Click ``view``'s tab (the page stays: the example it shows carries over) and wait for it."""
        self.find(f"#tabs a[data-view={view}]").click()
        self.wait_view(view)

    def canvas_colors(self, css: str) -> int:
        """How many colours a canvas shows: 0 for an empty one, 1 for a blank square."""
        return self.js("const c = document.querySelector(arguments[0]); if (!c || !c.width || !c.height) return 0; "
                       "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; "
                       "const seen = new Set(); "
                       "for (let i = 0; i < d.length; i += 4) seen.add(`${d[i]},${d[i + 1]},${d[i + 2]}`); "
                       "return seen.size", css)

    def done(self) -> int:
        return int(self.js("return +(document.getElementById('view').dataset.done || 0)"))

    def wait_done(self, n: int, timeout: float = 40):
        self.wait(lambda: self.done() >= n, timeout, what=f"run {n} of {self.js('return window.attnkit.viewId')}")

    def find(self, css: str):
        return self.d.find_element(By.CSS_SELECTOR, css)

    def finds(self, css: str):
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def type(self, css: str, text: str):
        field = self.find(css)
        field.clear()
        field.send_keys(text)

    def data(self, css: str, key: str) -> str | None:
        return self.js(f"const e = document.querySelector({css!r}); return e ? e.dataset[{key!r}] ?? null : null")

    def errors(self) -> list[str]:
        return [e["message"] for e in self.d.get_log("browser") if e["level"] == "SEVERE"]

    def screenshot(self, name: str, height: int | None = None):
        """The view from the top, the whole page or ``height`` pixels of it, into FIGURES/explorer_<name>.png."""
        SHOTS.capture(self.d, FIGURES / f"explorer_{name}.png", height)


@pytest.fixture
def page(browser, server):
    p = Page(browser, server)
    yield p
    assert not [e for e in p.errors() if "favicon" not in e], "errors in the browser's console"


def _export(page: Page, downloads: Path, kind: str) -> Path:
    """Click the view's export button and wait for the downloaded file."""
    before = set(downloads.iterdir())
    page.find(f"button[data-export={kind}]").click()

    def finished() -> bool:
        # Chromium may reserve the file's name while it still writes NAME.crdownload: done once that is gone
        new = set(downloads.iterdir()) - before
        return bool(new) and not any(f.name.endswith(".crdownload") for f in new)

    page.wait(finished, 15, f"the {kind} download")
    (new,) = set(downloads.iterdir()) - before
    assert new.suffix == f".{kind}" and new.stat().st_size > 0
    return new


# --- the views


def test_translate_streams_and_fills_the_cross_attention(page, downloads):
    page.open("translate")  # translates its first example
    page.type("[data-role=source]", SENTENCE)
    page.type("[data-role=beam]", "3")
    n = page.done()
    page.find("[data-role=run]").click()
    # the translation streams: the output grows token by token before the run is done
    page.wait(lambda: len(page.finds("[data-role=output] .tok")) > 0 or page.done() > n, what="the first token")
    page.wait_done(n + 1)
    canvas = "[data-role=cross] canvas.matrix"
    rows, cols = int(page.data(canvas, "rows")), int(page.data(canvas, "cols"))
    assert rows >= 1 and cols == len(page.js("return window.attnkit.view.exportJSON().attention.source"))
    assert int(page.data(canvas, "filled")) == rows
    # it streamed: one event per step, the matrix drawn after each with one more row filled
    fills = page.js("return window.attnkit.view.fills")
    assert len(fills) >= 2 and fills[0] < fills[-1] <= rows, fills
    output = [e.text for e in page.finds("[data-role=output] .tok")]
    assert output[-1] == "</s>" and len(output) == rows
    hyps = page.finds("[data-role=hypotheses] tr")
    assert len(hyps) >= 2  # header and the best hypothesis with its score

    # hover a word: the head view keeps only that word's links and marks it
    all_links = len(page.finds("[data-role=headview] line"))
    ActionChains(page.d).move_to_element(page.finds("[data-role=output] .tok")[2]).perform()
    page.wait(lambda: page.finds("[data-role=headview] text.hot"), 5, "the hovered word in the head view")
    assert 0 < len(page.finds("[data-role=headview] line")) <= cols < all_links
    ActionChains(page.d).move_to_element(page.find("h2")).perform()
    page.wait(lambda: len(page.finds("[data-role=headview] line")) == all_links, 5, "all links back")
    # click it: its links stay (and the URL says so)
    page.finds("[data-role=output] .tok")[2].click()
    ActionChains(page.d).move_to_element(page.find("h2")).perform()
    assert page.find("[data-role=headview] text.hot").text == output[2]
    assert "word=2" in page.js("return location.hash")
    page.screenshot("translate")  # the last layer's average, one word's links

    # layer and head: each choice redraws a different map
    sums = {(page.data(canvas, "layer"), page.data(canvas, "head")): page.data(canvas, "sum")}
    Select(page.find("[data-role=layer]")).select_by_value("0")
    Select(page.find("[data-role=head]")).select_by_value("2")
    assert (page.data(canvas, "layer"), page.data(canvas, "head")) == ("0", "2")
    sums[("0", "2")] = page.data(canvas, "sum")
    Select(page.find("[data-role=head]")).select_by_value("1")
    sums[("0", "1")] = page.data(canvas, "sum")
    assert len(set(sums.values())) == 3, sums
    assert "head=1" in page.js("return location.hash") and "layer=0" in page.js("return location.hash")

    for kind in ("png", "svg", "json"):
        exported = _export(page, downloads, kind)
    data = json.loads(exported.read_text())
    assert data["source"] == SENTENCE and len(data["attention"]["cross"][0]) == 4

    # the URL reproduces the view: same sentence, same translation, same layer and head
    link, translation = page.js("return location.href"), page.js("return window.attnkit.view.result.translation")
    page.d.get("about:blank")
    page.d.get(link)
    page.wait(lambda: page.js("return !!(window.attnkit && window.attnkit.view && window.attnkit.view.result)"),
              what="the translation from the link")
    assert page.js("return window.attnkit.view.result.translation") == translation
    assert (page.data(canvas, "layer"), page.data(canvas, "head")) == ("0", "1")
    assert page.find("[data-role=headview] text.hot").text == output[2]


def test_model_view_shows_every_layer_and_head(page, downloads):
    page.open(f"model?src={SENTENCE}&open=cross:1:avg", runs=1)
    for kind in ("encoder", "decoder", "cross"):
        assert len(page.finds(f"[data-kind={kind}] .thumb")) == 2 * (4 + 1)  # 2 layers x (4 heads + average)
    assert page.data("[data-role=detail]", "key") == "cross:1:avg"
    page.find(".thumb[data-key='encoder:0:3']").click()
    assert page.data("[data-role=detail]", "key") == "encoder:0:3"
    assert "open=encoder%3A0%3A3" in page.js("return location.hash") or "open=encoder:0:3" in page.js(
        "return decodeURIComponent(location.hash)")
    _export(page, downloads, "png")
    maps = json.loads(_export(page, downloads, "json").read_text())["attention"]
    assert len(maps["encoder"]) == 2 and len(maps["encoder"][0]) == 4
    page.screenshot("model")


def test_masking_heads_changes_the_output_or_its_score(page, downloads):
    page.open("interventions")
    page.type("[data-role=source]", SENTENCE)
    n = page.done()
    page.find("[data-role=load]").click()
    page.wait_done(n + 1)
    page.wait(lambda: page.finds("[data-head]"), what="the head toggles")
    before = page.find("[data-role=before] [data-role=score]").text
    for layer in (0, 1):
        for head in range(4):
            page.find(f"[data-head='cross.{layer}.{head}']").click()
    page.find("[data-role=source-tokens] .tok[data-i='1']").click()
    # each click re-runs at once: wait for the run with all nine masks
    page.wait(lambda: page.data("[data-role=after]", "masks") == "8,1", what="the run with every mask")
    after_output = page.data("[data-role=after]", "output")
    after = page.find("[data-role=after] [data-role=score]").text
    assert after_output is not None
    assert after and after != before, (before, after)
    assert "cross.1.3" in page.js("return decodeURIComponent(location.hash)")
    data = json.loads(_export(page, downloads, "json").read_text())
    assert len(data["mask_heads"]) == 8 and data["mask_source"] == [1] and data["masked"]["score"] is not None
    page.screenshot("interventions")


def test_language_model_at_two_temperatures(page, downloads):
    page.open("lm")
    page.type("[data-role=prompt]", "the dog")
    page.type("[data-role=max]", "8")
    page.type("[data-role=seed]", "0")
    page.type("[data-role=temperature]", "1")
    n = page.done()  # the first example's text, generated on opening
    page.find("[data-role=run]").click()
    page.wait_done(n + 1)
    bars_hot = page.data("[data-role=bars]", "first")
    assert bars_hot and len(page.finds("[data-role=bars] .bar")) >= 2
    assert page.finds("[data-role=attention-row] .tok")  # the chosen token's causal self-attention
    first_text = page.find("[data-role=output]").text
    page.type("[data-role=temperature]", "0.3")
    page.find("[data-role=run]").click()
    page.wait_done(n + 2)
    bars_cold = page.data("[data-role=bars]", "first")
    assert bars_cold != bars_hot  # a colder distribution to sample from
    assert "temp=0.3" in page.js("return location.hash")
    # choose an earlier token: its distribution and attention row come back
    page.finds("[data-role=output] .tok.toggle")[0].click()
    assert page.data("[data-role=bars]", "step") == "0"
    assert page.data("[data-role=attention-row]", "row") is not None
    assert first_text
    data = json.loads(_export(page, downloads, "json").read_text())
    assert data["request"]["temperature"] == 0.3 and data["steps"][0]["top"]
    _export(page, downloads, "png")
    page.screenshot("lm")
    # the link samples the same text again (the seed is in it) and shows the same step
    link, text = page.js("return location.href"), page.find("[data-role=output]").text
    page.d.get("about:blank")
    page.d.get(link)
    page.wait_done(1)
    assert page.find("[data-role=output]").text == text and page.data("[data-role=bars]", "step") == "0"


def test_caption_an_uploaded_image_word_by_word(page, downloads):
    page.open("caption")  # captions its first example, a sample image
    n = page.done()
    page.find("[data-role=upload]").send_keys(str(SAMPLES / "dog.png"))
    page.wait_done(n + 1)
    words = [f.text for f in page.finds("[data-role=words] figure")]
    assert words and words == page.js("return window.attnkit.view.exportJSON().answer.words")
    vocabulary = {w for caption in CAPTIONS.values() for w in caption.split()}
    assert len(words) >= 3 and {w for w in words if not w.startswith("<")} <= vocabulary

    def pixels():
        return page.js("const c = document.querySelector('[data-role=image]'); "
                       "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; "
                       "let s = 0; for (let i = 0; i < d.length; i += 97) s += d[i]; return s")

    ActionChains(page.d).move_to_element(page.finds("[data-role=words] figure")[1]).perform()
    one = (page.data("[data-role=image]", "word"), pixels())
    ActionChains(page.d).move_to_element(page.finds("[data-role=words] figure")[3]).perform()
    other = (page.data("[data-role=image]", "word"), pixels())
    assert one[0] == "1" and other[0] == "3" and one[1] != other[1]  # each word its own heat map
    data = json.loads(_export(page, downloads, "json").read_text())
    assert data["answer"]["grid"] == [7, 7] and len(data["answer"]["attention"]) == len(words)
    _export(page, downloads, "png")
    page.screenshot("caption")
    # a link to a sample image captions it again and shows the word it names
    page.open("caption?image=beach&word=2", runs=1)
    assert page.data("[data-role=image]", "word") == "2"
    assert page.find("canvas[data-sample=beach]").get_attribute("class") == "on"


def test_ask_answers_and_each_question_moves_the_glimpses(page, downloads):
    page.open("ask", runs=1)  # answers its first question about a sample easy-VQA image
    answers = set(page.js("return window.attnkit.view.exportJSON().answer.probabilities ? "
                          "Object.keys(window.attnkit.view.exportJSON().answer.probabilities) : []"))
    assert page.find("[data-role=answer]").text.split(" (")[0] in answers
    assert len(page.finds("[data-role=probabilities] [data-answer]")) == len(answers)
    glimpses = page.finds("[data-role=glimpses] figure")
    assert len(glimpses) == 2

    def maps():
        return page.js("return window.attnkit.view.exportJSON().answer.glimpses")

    first = maps()
    for g in first:
        assert abs(sum(sum(row) for row in g) - 1) < 0.01  # each glimpse a distribution over the grid
    n = page.done()
    page.type("[data-role=question]", "is there a circle in the image?")  # re-answered as it is edited
    page.wait(lambda: page.done() > n and page.js("return window.attnkit.view.exportJSON().question")
              == "is there a circle in the image?", what="the edited question's answer")
    page.wait(lambda: page.js("return window.attnkit.view.exportJSON().answer.question")
              == "is there a circle in the image?", what="the answer to the edited question")
    assert maps() != first  # another question, another map
    assert "question=is" in page.js("return location.hash")
    data = json.loads(_export(page, downloads, "json").read_text())
    assert data["answer"]["grid"] == [8, 8] and len(data["answer"]["glimpses"]) == 2
    _export(page, downloads, "png")
def test_listen_draws_the_spectrogram_and_each_characters_attention(page, downloads):
    """The Listen view streams the sample clip's transcript, then draws its spectrogram and each character's
    attention; a hover shows a character's, a click plays what it attended to; an upload is transcribed alike."""
    page.open("listen", runs=1)  # transcribes the sample clip that ships with the page
    page.wait(lambda: page.data("[data-role=transcript]", "done") == "1", what="the transcript's last character")
    answer = page.js("return window.attnkit.view.exportJSON().answer")
    chars = page.finds("[data-role=transcript] span")
    assert len(chars) == len(answer["characters"]) == len(answer["attention"]) >= 1
    # streamed: the transcript grew by a step event per character while the search ran
    assert page.data("[data-role=transcript]", "steps") == str(len(answer["characters"]))
    assert page.canvas_colors("[data-role=spectrogram]") > 20  # the log-mel frames, drawn
    assert page.js("return document.querySelector('[data-role=audio]').src").startswith("blob:")
    assert page.js("return document.querySelector('[data-role=audio]').duration") > 0.5  # the clip is in the player

    def bars():
        return page.canvas_colors("[data-role=attention]")

    ActionChains(page.d).move_to_element(chars[0]).perform()
    assert page.data("[data-role=attention]", "char") == "0" and bars() >= 2  # its attention over the frames
    chars[-1].click()  # plays the stretch the last character attended to
    assert page.data("[data-role=attention]", "char") == str(len(chars) - 1)
    assert abs(sum(answer["attention"][0]) - 1) < 1e-2
    n = page.done()
    page.find("[data-role=upload]").send_keys(str(SAMPLES / "digits.wav"))
    page.wait_done(n + 1)
    assert page.js("return window.attnkit.view.exportJSON().answer.transcript") == answer["transcript"]


def test_rnnsearch_alignment(page, downloads):
    page.open(f"rnnsearch?model=rnnsearch&src={SENTENCE}", runs=1)
    canvas = page.find("[data-role=alignment] canvas.matrix")
    assert canvas.size["width"] > 100 and page.find("[data-role=output]").text
    data = json.loads(_export(page, downloads, "json").read_text())
    (layer,) = data["attention"]["cross"]
    (alignment,) = layer  # additive attention: one layer, one head
    assert all(abs(sum(row) - 1) < 1e-2 for row in alignment)
    page.screenshot("rnnsearch")


def test_the_example_carries_from_view_to_view(page):
    """A sentence translated in the Translate view is the one the Model, Interventions and RNNsearch views open on,
    each with its attention drawn, not an empty form and a blank square."""
    page.open("translate")
    page.type("[data-role=source]", SENTENCE)
    n = page.done()
    page.find("[data-role=run]").click()
    page.wait_done(n + 1)
    page.tab("model")
    assert page.find("[data-role=source]").get_attribute("value") == SENTENCE
    assert page.js("return window.attnkit.view.exportJSON().attention.source.length") > 1
    assert len(page.finds("[data-kind=cross] .thumb")) == 2 * (4 + 1)
    assert page.canvas_colors(".thumb[data-key='cross:1:avg'] canvas") >= 2
    page.tab("interventions")
    assert page.find("[data-role=source]").get_attribute("value") == SENTENCE
    assert page.find("[data-role=before] [data-role=output]").text and page.finds("[data-head]")
    assert page.canvas_colors("[data-role=before] canvas.matrix") >= 3
    assert page.js("return window.attnkit.view.exportJSON().unmasked.attention.source.length") > 1
    page.tab("rnnsearch")
    assert page.find("[data-role=source]").get_attribute("value") == SENTENCE
    assert page.find("[data-role=output]").text and page.canvas_colors("[data-role=alignment] canvas.matrix") >= 3
    # back in the Translate view: the same sentence, translated again
    page.tab("translate")
    assert page.find("[data-role=source]").get_attribute("value") == SENTENCE
    assert page.js("return window.attnkit.view.result.source") == SENTENCE


def test_a_fresh_page_opens_on_a_first_example(page):
    """Nothing typed: the Model view shows a first example's maps, the language model a text, the captioner a
    caption of a sample image."""
    page.open("model")
    first = page.find("[data-role=source]").get_attribute("value")
    assert first and first != SENTENCE
    assert len(page.finds("[data-kind=cross] .thumb")) == 2 * (4 + 1)
    assert page.canvas_colors(".thumb[data-key='encoder:0:avg'] canvas") >= 2
    assert "maps" in page.find("[data-role=status]").text
    page.tab("lm")
    prompt = page.find("[data-role=prompt]").get_attribute("value")
    assert prompt and page.finds("[data-role=output] .tok.toggle")  # generated tokens after the prompt
    assert page.canvas_colors("[data-role=self-attention] canvas.matrix") >= 3
    page.tab("caption")
    assert len(page.finds("[data-role=words] figure")) >= 3
    assert page.find("canvas[data-sample=dog]").get_attribute("class") == "on"
    page.tab("translate")
    assert page.find("[data-role=source]").get_attribute("value") == first
    assert page.js("return window.attnkit.view.result.translation")


@pytest.fixture(scope="module")
def translation_only(checkpoints):
    """A server of one translation model (a Transformer): no captioner, no language model, no RNNsearch."""
    import attnkit
    from serving import LiveServer

    live = LiveServer({"dates": attnkit.load(checkpoints["dates"])})
    yield live.url
    live.close()


def test_a_tab_without_its_model_says_which_it_needs(browser, translation_only):
    page = Page(browser, translation_only)
    page.errors()  # the log so far is the other tests'
    needs = {"caption": ("captioning model", "capability: caption"),
             "lm": ("language model", "family: transformer_lm"),
             "rnnsearch": ("RNNsearch model", "family: rnnsearch")}
    for view, (what, which) in needs.items():
        page.open(view)
        tab = page.find(f"#tabs a[data-view={view}]")
        assert tab.is_displayed() and "unserved" in tab.get_attribute("class") and what in tab.get_attribute("title")
        note = page.find("[data-role=nomodel]").text
        assert f"No {what} is served" in note and which in note and "attnkit serve" in note, note
        assert not page.finds("[data-role=run]") and not page.finds("canvas.matrix")
    # what the translation model can do opens on its first example
    for view in ("translate", "model", "interventions"):
        assert "unserved" not in page.find(f"#tabs a[data-view={view}]").get_attribute("class")
    page.open("model")
    assert not page.finds("[data-role=nomodel]") and page.find("[data-role=source]").get_attribute("value")
    assert page.canvas_colors(".thumb[data-key='cross:0:avg'] canvas") >= 2
    assert not [e for e in page.errors() if "favicon" not in e], "errors in the browser's console"


def test_positional_encoding_computed_in_the_page(page, downloads):
    page.open("positional?d=64&n=60&pos=10", runs=1)
    assert "60 positions × 64 dimensions" in page.find("[data-role=status]").text
    values = page.js("return window.attnkit.view.exportJSON()")
    assert values["matrix"][3][0] == pytest.approx(0.1411, abs=1e-4)  # sin(3)
    assert values["matrix"][3][1] == pytest.approx(-0.99, abs=1e-2)  # cos(3)
    assert values["dot"][7][7] == pytest.approx(32, abs=1e-3)  # |PE[p]|^2 = d_model / 2
    _export(page, downloads, "png")
    page.screenshot("positional")


@pytest.mark.internals  # wall-clock time
def test_long_input_every_head_of_every_layer(page):
    """200 source tokens through a 6-layer, 8-head model: 162 maps drawn; how long, printed."""
    wide = _wide_checkpoint(page)
    toks = load_tokenizers(read_config(wide), wide)
    # dates, cut to 199 pieces (and EOS: 200 tokens); the page trims spaces, so no cut ends in one
    prefixes = [long[:k] for month in ("march", "june", "may", "july") for long in
                [" ".join(f"{d} {month} {1990 + d}" for d in range(1, 60))] for k in range(len(long), 0, -1)
                if not long[:k].endswith(" ")]
    text = next(t for t in prefixes if len(toks.src.pieces(t)) == 199)
    n = len(toks.src.pieces(text)) + 1
    page.open("model")
    Select(page.find("[data-role=model]")).select_by_value("wide")
    page.type("[data-role=source]", text)
    page.type("[data-role=target]", text)
    runs = page.done()
    start = time.monotonic()
    page.find("[data-role=run]").click()
    page.wait_done(runs + 1, timeout=60)
    wall = time.monotonic() - start
    timing = page.js("return window.attnkit.timings.model")
    assert timing["source_tokens"] == n == 200
    assert timing["maps"] == 3 * 6 * (8 + 1)
    print(f"\nexplorer long input: {n} source tokens, {timing['maps']} maps drawn in {timing['render_ms']:.0f} ms; "
          f"the answer ({timing['answer_bytes'] / 1e6:.1f} MB) took {timing['wait_ms']:.0f} ms, JSON.parse "
          f"{timing['parse_ms']:.0f} ms, conversion {timing['convert_ms']:.0f} ms; click to done {wall:.2f} s")
    assert timing["render_ms"] < 3000
    # still responsive: opening one map is quick
    t0 = time.monotonic()
    page.find(".thumb[data-key='cross:5:avg']").click()
    assert page.data("[data-role=detail]", "key") == "cross:5:avg"
    assert time.monotonic() - t0 < 2


def _wide_checkpoint(page: Page) -> Path:
    models = json.load(urllib.request.urlopen(f"{page.url}/v1/models"))["models"]
    return Path(next(m["path"] for m in models if m["name"] == "wide"))


# --- the Classify view: fine-tuned BERTs (an SST-2 classifier, an STS-B regressor of sentence pairs)

REVIEW = "a gorgeous , witty , seductive movie ."
PAIR = ("A man is playing a guitar.", "A man plays the guitar.")


@pytest.fixture(scope="module")
def classifiers(classifier_run, regressor_run):
    """A server of two fine-tuned BERTs: "sst2", a classifier of sentences, and "stsb", a regressor of pairs."""
    import attnkit
    from serving import LiveServer

    live = LiveServer({"sst2": attnkit.load(classifier_run), "stsb": attnkit.load(regressor_run)})
    yield live.url
    live.close()


def _explained(run: Path, text: str, pair: str | None = None):
    """What attnkit.decode says of one input, offline: (its Classification, its Explanation, the model config)."""
    from attnkit.decode import classify, explain

    model, cfg, tokenizer, _ = load_checkpoint(run)
    return classify(model, tokenizer, [text], None if pair is None else [pair])[0], explain(model, tokenizer, text,
                                                                                           pair), cfg


def _close(text: str, value: float) -> bool:
    """Whether a number the page shows (a minus sign for a minus) is ``value`` to the decimals it shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text.replace("−", "-")) - value) <= 0.5 * 10 ** -decimals + 2e-6


def _check_explanation(page: Page, why, cfg):
    """One coloured span per word piece with its occlusion (red: it supports the prediction, blue: against), every
    layer x head drawn, and the rollout from [CLS] over the pieces, as attnkit.decode.explain has them."""
    spans = page.finds("[data-role=occlusion] .piece")
    assert [s.get_attribute("data-piece") for s in spans] == why.pieces
    top = max(abs(v) for v in why.occlusion)
    for span, piece, value in zip(spans, why.pieces, why.occlusion):
        assert float(span.get_attribute("data-value")) == pytest.approx(value, abs=1e-5)
        if piece in ("[CLS]", "[SEP]"):
            assert value == 0 and not span.find_element(By.CSS_SELECTOR, ".value").text
            continue
        shown = span.find_element(By.CSS_SELECTOR, ".value").text
        assert _close(shown, value), (piece, shown, value)
        if abs(value) > 0.25 * top:
            r, _, b = (int(c) for c in page.js("return getComputedStyle(arguments[0]).backgroundColor", span)
                       .split("(")[1].rstrip(")").split(",")[:3])
            assert (r > b) == (value > 0), (piece, value, r, b)
    assert "hidden" in page.find("[data-role=occlusion-legend]").text
    layers, heads = cfg.model.n_layers, cfg.model.n_heads
    assert (len(why.attention), why.attention[0].shape[0]) == (layers, heads)
    assert len(page.finds("[data-role=grids] .thumb canvas")) == layers * heads
    assert page.canvas_colors(f".thumb[data-key='{layers - 1}:{heads - 1}'] canvas") >= 2
    cls = page.finds("[data-role=cls-rollout] .piece")
    assert [float(s.get_attribute("data-value")) for s in cls] == pytest.approx(why.rollout[0].tolist(), abs=1e-5)
    assert page.canvas_colors("[data-role=rollout] canvas.matrix") >= 3


def test_classify_a_sentence_and_why(browser, classifiers, classifier_run, downloads):
    page = Page(browser, classifiers)
    page.errors()  # the log so far is the other tests'
    # a page of classifiers opens on the Classify view, on the first model's example
    page.d.get("about:blank")
    page.d.get(f"{classifiers}/")
    page.wait_view("classify")
    assert page.find("[data-role=text]").get_attribute("value") and page.finds("[data-role=occlusion] .piece")

    Select(page.find("[data-role=model]")).select_by_value("sst2")
    assert not page.find("[data-role=pair]").is_displayed()  # a model of single sentences
    page.type("[data-role=text]", REVIEW)
    n = page.done()
    page.find("[data-role=run]").click()
    page.wait_done(n + 1)
    expected, why, cfg = _explained(classifier_run, REVIEW)
    assert page.data("[data-role=prediction]", "label") == expected.label == why.label
    assert page.find("[data-role=label]").text == expected.label
    bars = {b.get_attribute("data-label"): b for b in page.finds("[data-role=probabilities] .bar")}
    assert list(bars) == list(expected.probabilities)
    for label, p in expected.probabilities.items():
        assert float(bars[label].get_attribute("data-p")) == pytest.approx(p, abs=1e-5)
        assert _close(bars[label].find_element(By.CSS_SELECTOR, ".p").text, p)
    assert "chosen" in bars[expected.label].get_attribute("class")
    _check_explanation(page, why, cfg)
    assert f"log-odds of {expected.label}" in page.find("[data-role=occlusion-legend]").text  # what occlusion measures

    # a map opens large, and the link says which
    page.find(".thumb[data-key='1:0']").click()
    assert page.data("[data-role=detail]", "key") == "1:0" and page.canvas_colors("[data-role=detail] canvas") >= 3
    assert "open=1%3A0" in page.js("return location.hash") or "open=1:0" in page.js("return location.hash")
    data = json.loads(_export(page, downloads, "json").read_text())
    assert data["text"] == REVIEW and data["result"]["label"] == expected.label
    assert data["explanation"]["occlusion"] == pytest.approx(why.occlusion, abs=1e-5)
    _export(page, downloads, "png")
    page.screenshot("classify")

    # the link reproduces the view: the same sentence, label and opened map
    link = page.js("return location.href")
    page.d.get("about:blank")
    page.d.get(link)
    page.wait_view("classify")
    assert page.find("[data-role=text]").get_attribute("value") == REVIEW
    assert page.data("[data-role=prediction]", "label") == expected.label
    assert page.data("[data-role=detail]", "key") == "1:0"

    # a bad input: the server's one-line error, and no stale result
    answer = urllib.request.Request(f"{classifiers}/v1/classify", method="POST",
                                    data=json.dumps({"model": "sst2", "sentences": [""], "explain": True}).encode(),
                                    headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(answer)
    message = json.load(refused.value)["error"]
    assert 400 <= refused.value.code < 500 and message and "\n" not in message
    page.type("[data-role=text]", "")
    page.find("[data-role=run]").click()
    page.wait(lambda: "error" in page.find("[data-role=status]").get_attribute("class"), 15, "the error")
    assert page.find("[data-role=status]").text == message
    assert not page.finds("[data-role=occlusion] .piece") and not page.finds("[data-role=grids] .thumb")
    assert not [e for e in page.errors() if "favicon" not in e and "/v1/classify" not in e], \
        "errors in the browser's console"


def test_classify_scores_a_sentence_pair(browser, classifiers, regressor_run):
    page = Page(browser, classifiers)
    page.errors()
    page.open("classify")
    Select(page.find("[data-role=model]")).select_by_value("stsb")
    assert page.find("[data-role=pair]").is_displayed()  # a regressor of sentence pairs: a second box
    page.type("[data-role=text]", PAIR[0])
    page.type("[data-role=pair]", PAIR[1])
    n = page.done()
    page.find("[data-role=run]").click()
    page.wait_done(n + 1)
    expected, why, cfg = _explained(regressor_run, *PAIR)
    assert expected.probabilities is None and not page.finds("[data-role=probabilities] .bar")
    score = page.find("[data-role=score]")
    assert float(score.get_attribute("data-value")) == pytest.approx(expected.score, abs=1e-5)
    assert _close(score.text, expected.score)
    assert why.value == pytest.approx(expected.score, abs=1e-5)
    _check_explanation(page, why, cfg)
    # the second sentence's pieces are marked as such
    assert len(page.finds("[data-role=occlusion] .piece.second")) == sum(why.token_types)
    assert "score" in page.find("[data-role=occlusion-legend]").text
    assert "pair=" in page.js("return location.hash")
    assert not [e for e in page.errors() if "favicon" not in e], "errors in the browser's console"


def test_the_readme_pictures_come_from_the_runs_they_name(checkpoints, classifier_run, tmp_path):
    """bench/screenshots.py (make screenshots) serves the runs it is given, photographs each view on its input,
    says in explorer.json which checkpoint each picture shows (and the translation it showed), and keeps the
    picture of a view whose run is missing."""
    from attnkit.checkpoint import resolve_checkpoint
    from attnkit.decode import translate

    out = tmp_path / "figures"
    out.mkdir()
    (out / "explorer_lm.png").write_bytes(b"an older picture")
    runs = {"transformer": checkpoints["dates"], "rnnsearch": checkpoints["rnnsearch"],
            "captioner": checkpoints["captioner"], "lm": tmp_path / "no_such_run", "sst2": classifier_run}
    argv = ["--out", str(out), "--src", SENTENCE, "--image", str(SAMPLES / "dog.png"), "--review", REVIEW,
            *(f"--run={name}={run}" for name, run in runs.items())]
    assert SHOTS.main(argv) == 0

    manifest = json.loads((out / "explorer.json").read_text())
    served = {"translate": "transformer", "model": "transformer", "interventions": "transformer",
              "rnnsearch": "rnnsearch", "caption": "captioner", "classify": "sst2"}
    assert sorted(manifest) == sorted(f"explorer_{view}.png" for view in served)
    for view, name in served.items():
        picture = (out / f"explorer_{view}.png").read_bytes()
        assert picture[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(picture[16:20], "big") > 1000  # its width
        assert manifest[f"explorer_{view}.png"]["checkpoint"] == str(resolve_checkpoint(runs[name]).resolve())
    assert manifest["explorer_caption.png"]["image"] == "dog.png"
    assert (out / "explorer_lm.png").read_bytes() == b"an older picture"
    model, cfg, toks, _ = load_checkpoint(checkpoints["dates"])
    expected = translate(model, toks, [SENTENCE], beam_size=5, len_penalty=cfg.decode.len_penalty)[0].text[0]
    assert manifest["explorer_translate.png"]["translation"] == expected
