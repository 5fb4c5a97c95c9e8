"""`attnkit data fetch` against local mirrors (a real http.server on 127.0.0.1, and file://): no internet.

The mirrors are built from shared/data's copies, which are the upstream bytes for multi30k, tinyshakespeare and
wikitext2, laid out as ``<mirror>/HOST/PATH`` of each pinned upstream URL.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from attnkit.data import fetch as fetch_module
from attnkit.data import read_flickr8k, read_multi30k, read_tinyshakespeare, read_wikitext2
from attnkit.data.fetch import PINNED, mirror_path

SMALL = ("tinyshakespeare", "wikitext2", "multi30k")
REPO_SRC = Path(__file__).resolve().parents[1] / "src"


def _build_mirror(root: Path, data_dir: Path, names=SMALL) -> Path:
    for name in names:
        for f in PINNED[name]:
            original = data_dir / f.target
            if not original.is_file():
                pytest.skip(f"{original} missing")
            dest = root / mirror_path(f.url)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(original, dest)
    return root


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory, data_dir):
    """(base directory served, its http:// URL): ``good/`` mirrors upstream, ``bad/`` has one corrupted file."""
    root = tmp_path_factory.mktemp("mirror")
    _build_mirror(root / "good", data_dir)
    bad = root / "bad" / mirror_path(PINNED["tinyshakespeare"][0].url)
    bad.parent.mkdir(parents=True)
    text = bytearray((data_dir / PINNED["tinyshakespeare"][0].target).read_bytes())
    text[1000] ^= 1  # one flipped bit: same size, other hash
    bad.write_bytes(bytes(text))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def run_fetch(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNKIT_DATA", fetch_module.MIRROR_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_SRC), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "attnkit", "data", "fetch", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=120)


def run_main(capsys, *args) -> tuple[int, str, str]:
    """The same command in this process (no interpreter start): (exit status, stdout, stderr)."""
    from attnkit.cli import main

    capsys.readouterr()
    rc = main(["data", "fetch", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _no_mirror_env(monkeypatch):
    monkeypatch.delenv(fetch_module.MIRROR_ENV, raising=False)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def _error_line(proc: subprocess.CompletedProcess, alone: bool = True) -> str:
    """The one error line, last on stderr; ``alone``: nothing else on stderr (no download was started)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert [line for line in lines if line.startswith("attnkit: error: ")] == lines[-1:], proc.stderr
    assert "Traceback" not in proc.stderr
    if alone:
        assert len(lines) == 1, proc.stderr
    return lines[-1]


def test_fetch_over_http_is_byte_identical_and_readable_then_skips(tmp_path, served, data_dir, capsys):
    _, url = served
    target = tmp_path / "data"
    proc = run_fetch(*SMALL, "--data-dir", target, "--source", f"{url}/good")
    assert proc.returncode == 0, proc.stderr
    expected = [f.target for name in SMALL for f in PINNED[name]]
    assert sorted(str(p.relative_to(target)) for p in _files(target)) == sorted(expected)  # no temporary left
    for rel in expected:
        assert (target / rel).read_bytes() == (data_dir / rel).read_bytes(), rel
    assert "sha256 ok" in proc.stderr and "downloading" in proc.stderr
    assert len(proc.stdout.splitlines()) == 3 and "sha256-verified" in proc.stdout

    # the recipes' readers read what was fetched
    text = read_tinyshakespeare(target, "train") + read_tinyshakespeare(target, "valid")
    assert len(text) == 1_115_394
    assert len(read_wikitext2(target, "valid")) == 3760
    pairs = read_multi30k(target, "val", "en", "de")
    assert len(pairs.src) == len(pairs.tgt) == 1014
    assert read_multi30k(target, "test_2016_flickr", "fr", "cs").src[0]

    # (e) a second run downloads nothing: it succeeds with the server unreachable
    mtimes = {p: p.stat().st_mtime_ns for p in _files(target)}
    rc, _, err = run_main(capsys, *SMALL, "--data-dir", target, "--source", f"http://127.0.0.1:{_closed_port()}")
    assert rc == 0, err
    assert err.count("already present, checksum ok") == len(expected)
    assert {p: p.stat().st_mtime_ns for p in _files(target)} == mtimes


def test_fetch_from_file_url_and_directory(tmp_path, served, data_dir, capsys, monkeypatch):
    root, _ = served
    rel = PINNED["wikitext2"][1].target
    for i, source in enumerate(((root / "good").as_uri(), root / "good")):  # file:// and a plain directory
        target = tmp_path / f"data{i}"
        if i == 0:
            rc, _, err = run_main(capsys, "wikitext2", "tinyshakespeare", "--data-dir", target, "--source", source)
        else:  # the environment variable, and the data directory from $ATTNKIT_DATA
            monkeypatch.setenv(fetch_module.MIRROR_ENV, str(source))
            monkeypatch.setenv("ATTNKIT_DATA", str(target))
            rc, _, err = run_main(capsys, "wikitext2", "tinyshakespeare")
        assert rc == 0, err
        assert (target / rel).read_bytes() == (data_dir / rel).read_bytes()
        assert len(_files(target)) == 3


def test_corrupted_download_is_refused_and_leaves_nothing(tmp_path, served):
    _, url = served
    target = tmp_path / "data"
    proc = run_fetch("tinyshakespeare", "--data-dir", target, "--source", f"{url}/bad")
    line = _error_line(proc, alone=False)  # after the progress lines of the download
    pin = PINNED["tinyshakespeare"][0]
    assert "tinyshakespeare/input.txt" in line and "sha256 mismatch" in line and pin.sha256 in line
    assert "got " in line
    assert _files(target) == []


def test_existing_other_file_is_not_overwritten_without_overwrite(tmp_path, served, data_dir, capsys):
    _, url = served
    target = tmp_path / "data"
    existing = target / "tinyshakespeare" / "input.txt"
    existing.parent.mkdir(parents=True)
    existing.write_bytes(b"my own notes\n")
    proc = run_fetch("tinyshakespeare", "--data-dir", target, "--source", f"{url}/good")
    line = _error_line(proc)
    assert str(existing) in line and "--overwrite" in line
    assert existing.read_bytes() == b"my own notes\n"
    assert _files(target) == [existing]

    rc, _, err = run_main(capsys, "tinyshakespeare", "--data-dir", target, "--source", f"{url}/good", "--overwrite")
    assert rc == 0, err
    assert existing.read_bytes() == (data_dir / "tinyshakespeare" / "input.txt").read_bytes()


def test_unreachable_host_is_one_line(tmp_path):
    target = tmp_path / "data"
    proc = run_fetch("tinyshakespeare", "--data-dir", target, "--source", f"http://127.0.0.1:{_closed_port()}",
                     "--timeout", "5")
    line = _error_line(proc)
    assert "cannot download http://127.0.0.1:" in line and "--source" in line
    assert _files(target) == []


def test_list_names_every_download(capsys):
    rc, out, _ = run_main(capsys, "all", "--list")
    assert rc == 0
    rows = out.splitlines()
    assert len(rows) == sum(len(v) for v in PINNED.values()) + 2  # + Flickr8k's two archives
    assert all(r.startswith("https://") and ("\tsha256:" in r or "\tmd5:" in r) for r in rows)


# --- Flickr8k: the real archives are 1 GB and their bytes are not in shared/data, so this runs the same code on
# small archives made here, with the module's pins replaced by theirs


def _jpeg(color, size=(40, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="JPEG")
    return out.getvalue()


def test_flickr8k_layout_from_small_archives(tmp_path, monkeypatch, capsys):
    from attnkit.cli import main

    images = ["a_1.jpg", "b_2.jpg", "c_3.jpg"]  # a: train, b: dev, c: test
    token = b"".join(f"{n}#{k}\tcaption {k} of {n} .\n".encode() for n in images for k in range(5))
    token += b"".join(f"c_3.jpg.1#{k}\tno such image .\n".encode() for k in range(5))
    members = {"Flickr8k.token.txt": token, "Flickr_8k.trainImages.txt": b"a_1.jpg\n",
               "Flickr_8k.devImages.txt": b"b_2.jpg\n", "Flickr_8k.testImages.txt": b"c_3.jpg\n",
               "readme.txt": b"cite Hodosh et al. 2013\n"}
    mirror = tmp_path / "mirror"
    text_zip = mirror / mirror_path(fetch_module.FLICKR8K_TEXT_ZIP[0])
    image_zip = mirror / mirror_path(fetch_module.FLICKR8K_IMAGES_ZIP[0])
    text_zip.parent.mkdir(parents=True)
    with zipfile.ZipFile(text_zip, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr("__MACOSX/._readme.txt", b"junk")
    with zipfile.ZipFile(image_zip, "w") as z:
        for i, name in enumerate(images):
            z.writestr(f"Flicker8k_Dataset/{name}", _jpeg((80 * i, 100, 200)))
            z.writestr(f"__MACOSX/Flicker8k_Dataset/._{name}", b"junk")

    def md5(p):
        return hashlib.md5(p.read_bytes()).hexdigest()

    def sha(b):
        return hashlib.sha256(b).hexdigest()

    laid_out = b"".join(line for line in token.splitlines(keepends=True) if line.startswith((b"a_1", b"b_2")))
    monkeypatch.setattr(fetch_module, "FLICKR8K_TEXT_ZIP", (fetch_module.FLICKR8K_TEXT_ZIP[0], md5(text_zip)))
    monkeypatch.setattr(fetch_module, "FLICKR8K_IMAGES_ZIP", (fetch_module.FLICKR8K_IMAGES_ZIP[0], md5(image_zip)))
    monkeypatch.setattr(fetch_module, "FLICKR8K_TEXT_MEMBERS", {n: sha(b) for n, b in members.items()})
    monkeypatch.setattr(fetch_module, "FLICKR8K_TEXT_FILES", {
        "Flickr8k.token.txt": sha(laid_out), **{n: sha(members[n]) for n in
                                                ("Flickr_8k.trainImages.txt", "Flickr_8k.devImages.txt",
                                                 "readme.txt")}})
    monkeypatch.setattr(fetch_module, "FLICKR8K_IMAGE_COUNT", 3)
    monkeypatch.setattr(fetch_module, "FLICKR8K_IMAGE_NAMES_SHA256", sha("".join(n + "\n" for n in images).encode()))

    target = tmp_path / "data"
    assert main(["data", "fetch", "flickr8k", "--data-dir", str(target), "--source", str(mirror)]) == 0
    root = target / "flickr8k"
    assert (root / "Flickr8k.token.txt").read_bytes() == laid_out
    assert sorted(p.name for p in (root / "images_224").iterdir()) == images
    assert not (root / "Flickr8k_Dataset.zip").exists() and not list(root.glob(".*"))
    from PIL import Image

    with Image.open(root / "images_224" / "a_1.jpg") as im:
        assert im.size == (224, 224) and im.mode == "RGB"
    train = read_flickr8k(target, "train")
    assert [p.name for p in train.images] == ["a_1.jpg"] and len(train.captions[0]) == 5
    assert "md5 ok" in capsys.readouterr().err

    # again: everything is present, nothing is downloaded
    shutil.rmtree(mirror)
    assert main(["data", "fetch", "flickr8k", "--data-dir", str(target), "--source", str(mirror)]) == 0
    assert capsys.readouterr().err.count("already present") == 5
