"""The README's pictures of the attention explorer, taken from the recipes' own trained models.

``attnkit serve`` is started on a free loopback port with every recipe run that exists (the Multi30k Transformer
and RNNsearch, the Flickr8k captioner, the Tiny Shakespeare GPT, the SST-2 classifier), a headless Chromium
(Debian's ``chromium`` and ``chromium-driver``, ``make browser``) opens each view on a real input (a Multi30k
test2016 sentence, a Flickr8k dev photo, Tiny Shakespeare's "ROMEO:", an SST-2 dev sentence) through the URL
that reproduces it, and the page is photographed into ``--out``/explorer_<view>.png. A view whose run is missing
is skipped with one line and its old picture kept; ``--out``/explorer.json says which run, checkpoint and input
each picture shows.

    python bench/screenshots.py                    # make screenshots: into docs/figures
    python bench/screenshots.py --run lm=runs/X    # another run for a view's model

The explorer's browser tests (tests/test_explorer.py) keep their own tiny models and share this file's browser
set-up.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and os.path.exists(p)), None)
CHROMEDRIVER = next((p for p in ("/usr/bin/chromedriver", shutil.which("chromedriver") or "")
                     if p and os.path.exists(p)), None)
# the flags this machine's closed network needs (without the background-networking ones Chromium's own
# connections are refused and it stalls), and a fixed window so that pictures do not depend on the screen
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
                  "--window-size=1360,900"]

# the served name of each recipe's model and the run that trains it (make multi30k, ..., make sst2)
RUNS = {"transformer": "runs/multi30k_en_de", "rnnsearch": "runs/multi30k_en_de_rnnsearch",
        "captioner": "runs/flickr8k_sat", "lm": "runs/tinyshakespeare_char", "sst2": "runs/glue_sst2"}


def open_browser(profile: Path, downloads: Path | None = None):
    """A headless Chromium driven through Selenium, with a fresh profile (and downloads into ``downloads``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    if downloads is not None:
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    return driver


def capture(driver, path: Path, height: int | None = None) -> Path:
    """The page from the top, whole or ``height`` pixels of it (at most 2400), as a PNG at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0); document.activeElement && document.activeElement.blur()")
    width, full = driver.execute_script(
        "return [document.documentElement.clientWidth, document.documentElement.scrollHeight]")
    clip = {"x": 0, "y": 0, "width": width, "height": min(height or full, full, 2400), "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                             "clip": clip})
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(models: dict[str, Path], log: Path) -> tuple[subprocess.Popen, str]:
    """``attnkit serve name=run ...`` on a free loopback port, once /health answers ok; eager (``--no-compile``): a
    picture needs no speed, and the start no compiler's minute."""
    port = _free_port()
    cmd = [sys.executable, "-m", "attnkit", "serve", *(f"{name}={path}" for name, path in models.items()),
           "--port", str(port), "--timeout", "120", "--no-compile"]
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if json.load(r)["status"] == "ok":
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"screenshots: attnkit serve did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


def _wait(driver, condition: str, what: str, timeout: float = 120):
    """Poll the page's JavaScript ``condition`` until true, else stop with what the page says."""
    deadline = time.monotonic() + timeout
    while not driver.execute_script(f"return !!({condition})"):
        if time.monotonic() > deadline:
            status = driver.execute_script(
                "return [...document.querySelectorAll('[data-role=status]')].map(e => e.textContent)")
            raise SystemExit(f"screenshots: timed out waiting for {what}; the page says {status}")
        time.sleep(0.1)


def open_view(driver, url: str, view: str, params: dict) -> None:
    """Load the page at ``#view?params`` (the link that reproduces a view) and wait for its run to be over."""
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, quote_via=urllib.parse.quote)
    driver.get("about:blank")
    driver.get(f"{url}/#{view}{'?' + query if query else ''}")
    _wait(driver, f"window.attnkit && window.attnkit.ready && window.attnkit.viewId === {view!r} && "
                  "window.attnkit.settled === true", f"the {view} view's run")


def done(driver) -> int:
    return int(driver.execute_script("return +(document.getElementById('view').dataset.done || 0)"))


def _source(run: Path, args) -> str:
    """--src, else sentence --sentence of the test split of the data ``run`` was trained on."""
    from attnkit.checkpoint import read_config, resolve_checkpoint
    from attnkit.data import load_split

    if args.src:
        return args.src
    return load_split(read_config(resolve_checkpoint(run)).data, "test", args.data_dir).src[args.sentence]


def _image(args) -> Path:
    """--image, else the Flickr8k photo --photo of the data directory."""
    from attnkit.data import resolve_data_dir

    return args.image or resolve_data_dir(args.data_dir) / "flickr8k" / "images_224" / args.photo


def shots(models: dict[str, Path], args) -> list[dict]:
    """(view, model, input) of each picture the served ``models`` allow, in the order the README shows them."""
    from attnkit.checkpoint import read_config, resolve_checkpoint

    plan = []
    if "transformer" in models:
        src = _source(models["transformer"], args)
        last = read_config(resolve_checkpoint(models["transformer"])).model.n_decoder_layers - 1
        plan.append({"view": "translate", "model": "transformer", "params": {"model": "transformer", "src": src,
                                                                               "beam": 5}})
        plan.append({"view": "model", "model": "transformer", "params": {"model": "transformer", "src": src,
                                                                           "open": f"cross:{last}:avg"}})
        plan.append({"view": "interventions", "model": "transformer", "params": {"model": "transformer",
                                                                                   "src": src}})
    if "rnnsearch" in models:
        src = _source(models["rnnsearch"], args)
        plan.append({"view": "rnnsearch", "model": "rnnsearch", "params": {"model": "rnnsearch", "src": src}})
    if "captioner" in models:
        plan.append({"view": "caption", "model": "captioner", "params": {"model": "captioner"}, "upload": _image(args)})
    if "lm" in models:
        plan.append({"view": "lm", "model": "lm", "params": {"model": "lm", "prompt": args.prompt, "max": 120,
                                                             "temp": 0.8, "k": 40, "seed": 1}})
    if "sst2" in models:
        plan.append({"view": "classify", "model": "sst2", "params": {"model": "sst2", "text": args.review}})
    return plan


def take(driver, url: str, shot: dict, out: Path) -> tuple[Path, dict]:
    """Photograph one view into ``out``; -> the picture and what the page showed (the translation it made)."""
    open_view(driver, url, shot["view"], shot["params"])
    if "upload" in shot:  # a photo from disk: the file input, as a person uploads one
        n = done(driver)
        driver.find_element("css selector", "[data-role=upload]").send_keys(str(Path(shot["upload"]).resolve()))
        _wait(driver, f"+(document.getElementById('view').dataset.done || 0) >= {n + 1}", "the uploaded photo")
    shown = {}
    if shot["view"] == "translate":
        shown["translation"] = driver.execute_script("return window.attnkit.view.result.translation")
    return capture(driver, out / f"explorer_{shot['view']}.png", height=1400), shown


def _checkpoint(run: Path) -> str:
    """The checkpoint ``attnkit serve`` loads from ``run``, as a path relative to the repository when it can."""
    from attnkit.checkpoint import resolve_checkpoint

    path = Path(resolve_checkpoint(run)).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    ap.add_argument("--run", action="append", default=[], metavar="NAME=RUN",
                    help=f"the run behind one of the served names {sorted(RUNS)} (default: {RUNS})")
    ap.add_argument("--data-dir", help="where Multi30k and Flickr8k are (default: $ATTNKIT_DATA)")
    ap.add_argument("--src", help="the sentence to translate (default: one of the model's test split)")
    ap.add_argument("--sentence", type=int, default=1, help="which test sentence to translate (from 0)")
    ap.add_argument("--image", type=Path, help="the photo to caption (default: the Flickr8k photo --photo)")
    ap.add_argument("--photo", default="1679557684_50a206e4a9.jpg", help="a Flickr8k dev photo's file name")
    ap.add_argument("--prompt", default="ROMEO:")
    ap.add_argument("--review", default="it 's a charming and often affecting journey .")
    args = ap.parse_args(argv)
    if CHROMIUM is None or CHROMEDRIVER is None:
        print("screenshots: no Chromium: `make browser` installs Debian's chromium and chromium-driver",
              file=sys.stderr)
        return 2
    runs = {name: ROOT / path for name, path in RUNS.items()}
    for item in args.run:
        name, _, path = item.partition("=")
        if name not in RUNS or not path:
            print(f"screenshots: --run {item!r}: expected NAME=RUN with NAME one of {sorted(RUNS)}", file=sys.stderr)
            return 2
        runs[name] = Path(path)
    from attnkit.checkpoint import resolve_checkpoint
    from attnkit.errors import AttnkitError

    models = {}
    for name, run in runs.items():
        try:
            resolve_checkpoint(run)
            models[name] = run
        except AttnkitError as e:
            print(f"screenshots: {e}: its views keep their pictures", file=sys.stderr)
    if not models:
        print("screenshots: none of the recipe runs exists; nothing to photograph", file=sys.stderr)
        return 0
    work = Path(tempfile.mkdtemp(prefix="attnkit-screenshots-"))
    proc, url = start_server(models, work / "serve.log")
    manifest_path = args.out / "explorer.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    try:
        driver = open_browser(work / "profile")
        try:
            for shot in shots(models, args):
                path, shown = take(driver, url, shot, args.out)
                manifest[path.name] = {"view": shot["view"], "checkpoint": _checkpoint(models[shot["model"]]),
                                       "link": "#" + shot["view"] + "?" + urllib.parse.urlencode(shot["params"]),
                                       **({"image": shot["upload"].name} if "upload" in shot else {}), **shown}
                print(f"screenshots: {path} ({manifest[path.name]['checkpoint']})", file=sys.stderr)
        finally:
            driver.quit()
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
