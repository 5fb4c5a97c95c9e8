"""``attnkit data fetch``: download the recipes' data sets from upstream, verify them, lay them out for the readers.

The layout is that of shared/data (see its README), under the data directory (``--data-dir``, then
``$ATTNKIT_DATA``, as :func:`attnkit.data.resolve_data_dir`)::

    multi30k/task1/raw/{train,val,test_2016_flickr}.{en,de,fr,cs}.gz   read_multi30k
    tatoeba/{deu,fra}-eng.zip                                          read_tatoeba (format = "tatoeba")
    tinyshakespeare/input.txt                                          read_tinyshakespeare
    wikitext-2/{train,valid}.txt                                       read_wikitext2
    flickr8k/images_224/*.jpg, Flickr8k.token.txt,                     read_flickr8k
             Flickr_8k.{train,dev}Images.txt, readme.txt

What is verified, and against what
----------------------------------
Every download goes to a temporary file in the target directory, is checked, and only then renamed into
place (``os.replace``): a failed check leaves nothing behind. An existing file is left alone unless it
already has the pinned checksum (then it is skipped) or ``--overwrite`` is given.

* multi30k (12 files), tinyshakespeare, wikitext2 (train, valid): SHA-256 of the exact upstream bytes.
  The pins were computed from the shared/data copies, whose git blob hashes equal the upstream blobs at the
  pinned commits (multi30k/dataset c40b37b, karpathy/char-rnn 6f9487a, pytorch/examples d5678bc).
* tatoeba: SHA-256 of the exact zips the recipes and their numbers (169,813 deu-eng pairs, 142,787 fra-eng)
  were measured on: the manythings.org Anki exports of 2018-05-13 (deu) and 2017-09-29 (fra). manythings.org
  (https://www.manythings.org/anki/) only serves its *current* export, which is newer, has a third
  (attribution) column and other pairs, so no pin could hold for it; the pinned snapshots are fetched from
  the GitHub repositories that keep those very bytes (rioyshky/translation, genimind/seq2seq, same git blob
  as shared/data's copies).
* flickr8k, from the mirror of the official archives everyone uses (jbrownlee/Datasets, release Flickr8k):
  no SHA-256 of the two zips is known offline, so they are checked against the MD5 sums that mlverse's
  torchvision (R/dataset-flickr.R) pins for these URLs -- MD5 catches a corrupt or different archive, it is
  no defence against a forged one. Inside Flickr8k_text.zip the files used are then checked by SHA-256
  (pins: the Git LFS ids of a verbatim extraction of that zip kept in Adityaakula03/Image-Caption-Generator,
  equal to shared/data's copies where shared/data keeps them verbatim); ``Flickr8k.token.txt`` is then laid
  out as shared/data has it -- without the 5 captions of
  "2258277193_586949ec62.jpg.1", an image that does not exist, and without the official test split's captions
  -- and the result is checked against shared/data's SHA-256. The 8,091 images are checked by name (the set
  of names is pinned), then resized here to 224x224 RGB (bicubic, aspect not kept, as ``load_image`` would)
  and saved as JPEG quality 85. Their pixels are *not* checksummed: shared/data's images_224 were resized
  elsewhere and re-encoded, so they cannot be reproduced bit for bit, and grids extracted from freshly
  fetched images differ slightly from ones extracted from shared/data's.

Mirrors
-------
``--source URL`` (or ``$ATTNKIT_DATA_MIRROR``) replaces the scheme of every URL: the file of
``https://HOST/PATH`` is fetched from ``URL/HOST/PATH``. That is the layout ``wget -x`` (or
``wget --mirror``) gives the URLs ``attnkit data fetch NAME --list`` prints; URL may be ``http(s)://``,
``file://``, or a plain directory.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from attnkit.data.corpus import resolve_data_dir
from attnkit.errors import AttnkitError

MIRROR_ENV = "ATTNKIT_DATA_MIRROR"
TIMEOUT_S = 60.0  # per connection attempt and per read
USER_AGENT = "attnkit-data-fetch/0.1 (+python urllib)"
CHUNK = 1 << 20

GH = "https://raw.githubusercontent.com"
MULTI30K = f"{GH}/multi30k/dataset/c40b37b23d6387214f8ab37335b5a8672b9745f2/data/task1/raw"
CHAR_RNN = f"{GH}/karpathy/char-rnn/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare"
WIKITEXT2 = f"{GH}/pytorch/examples/d5678bc8ac0cdd79dbd5e44d4130271018bcec4e/word_language_model/data/wikitext-2"
TATOEBA_DEU = f"{GH}/rioyshky/translation/de48b7027f7318d77010a6e08ed928c10748c23d/deu-eng.zip"
TATOEBA_FRA = f"{GH}/genimind/seq2seq/4f3f8eb0adde54fcc8b89394336b002e7961244c/fra-eng.zip"
FLICKR8K = "https://github.com/jbrownlee/Datasets/releases/download/Flickr8k"


@dataclass(frozen=True)
class Pinned:
    """One file of the data directory that is the upstream file byte for byte."""

    target: str  # relative to the data directory
    url: str
    sha256: str


_MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}

PINNED: dict[str, tuple[Pinned, ...]] = {
    "multi30k": tuple(Pinned(f"multi30k/task1/raw/{name}", f"{MULTI30K}/{name}", sha)
                      for name, sha in _MULTI30K_SHA256.items()),
    "tatoeba": (
        Pinned("tatoeba/deu-eng.zip", TATOEBA_DEU, "b7688f84f99fa33c17397c14d8bd9cef1fdeb2ee0bf50074767023aee8926e28"),
        Pinned("tatoeba/fra-eng.zip", TATOEBA_FRA, "16c4f7d0df9e7c5e6c54cdb0447f3f4a18a55052ff5e2e0b27dd4a06c0e49d04"),
    ),
    "tinyshakespeare": (
        Pinned("tinyshakespeare/input.txt", f"{CHAR_RNN}/input.txt",
               "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    ),
    "wikitext2": (
        Pinned("wikitext-2/train.txt", f"{WIKITEXT2}/train.txt",
               "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f"),
        Pinned("wikitext-2/valid.txt", f"{WIKITEXT2}/valid.txt",
               "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"),
    ),
}

# --- Flickr8k: two archives, checked by the MD5 sums mlverse/torchvision pins (no SHA-256 of them is known)
FLICKR8K_TEXT_ZIP = (f"{FLICKR8K}/Flickr8k_text.zip", "bf6c1abcb8e4a833b7f922104de18627")
FLICKR8K_IMAGES_ZIP = (f"{FLICKR8K}/Flickr8k_Dataset.zip", "f18a1e2920de5bd84dae7cf08ec78978")
# SHA-256 of the members of Flickr8k_text.zip that are used, as extracted verbatim
FLICKR8K_TEXT_MEMBERS = {
    "Flickr8k.token.txt": "1e1f3a371ba1a1bf742e6930521c037e046b2bf3fcc2390ba8405e0301ed7689",  # 40,460 captions
    "Flickr_8k.trainImages.txt": "e330ddd5156a4c2d2e2b67bc587e70e588f2d132bd8a10dc54dcb71e58115d8e",
    "Flickr_8k.devImages.txt": "18ba829f47f6df1cb830bf7f0506e2ddf333818925299babbd1bbcaf50fdc504",
    "Flickr_8k.testImages.txt": "c0924146c131458ceba45da59670fe9520eadce1e5cafffa16a817672a9b1f17",
    "readme.txt": "6152fc45ae9b629c4af9c8466e5ae608b80fbcb0f6316fef458dc160020a21a2",
}
# SHA-256 of the files written to flickr8k/ (= shared/data's): all verbatim but the token file (35,455 captions)
FLICKR8K_TEXT_FILES = {
    "Flickr8k.token.txt": "bd90b151511afa89f071dbc77b16d789c442f88e10eb997f2b25df3dc21cb7b8",
    "Flickr_8k.trainImages.txt": FLICKR8K_TEXT_MEMBERS["Flickr_8k.trainImages.txt"],
    "Flickr_8k.devImages.txt": FLICKR8K_TEXT_MEMBERS["Flickr_8k.devImages.txt"],
    "readme.txt": FLICKR8K_TEXT_MEMBERS["readme.txt"],
}
FLICKR8K_IMAGE_COUNT = 8091
# sha256 of the sorted image file names, one per line ("1000268201_693b08cb0e.jpg\n...")
FLICKR8K_IMAGE_NAMES_SHA256 = "b8809812431e6184a9a6373b15073a9f8f574c9b01fe9437ab055815211b4cde"
IMAGE_SIZE = 224  # attnkit.nn.vision.IMAGE_SIZE; not imported, to keep this module free of torch
JPEG_QUALITY = 85  # as shared/data's images_224

DATASETS = ("multi30k", "tatoeba", "flickr8k", "tinyshakespeare", "wikitext2")


# --- where to download from


def source_base(source: str | None = None) -> str | None:
    """The mirror base: ``--source``, then ``$ATTNKIT_DATA_MIRROR``; a plain directory becomes a file:// URL."""
    base = source or os.environ.get(MIRROR_ENV) or None
    if base and "://" not in base:
        base = Path(base).resolve().as_uri()
    return base.rstrip("/") if base else None


def mirror_path(url: str) -> str:
    """Where a mirror keeps the file of ``url``: ``HOST/PATH`` (the layout of ``wget -x``)."""
    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}"


def resolve_url(url: str, base: str | None) -> str:
    return f"{base}/{mirror_path(url)}" if base else url


# --- hashing, progress, atomic writes


def file_digest(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.0f} kB"


class _Progress:
    """Progress on stderr: a line redrawn in place on a terminal, start and end lines otherwise."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._last = 0.0

    def say(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)

    def update(self, label: str, done: int, total: int, unit: str = "bytes") -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self._last < 0.2 and done != total:
            return
        self._last = now
        if unit == "bytes":
            amount = f"{_mb(done)} / {_mb(total)}" if total else _mb(done)
        else:
            amount = f"{done} / {total} {unit}"
        pct = f" {100 * done / total:3.0f}%" if total else ""
        print(f"\r  {label}: {amount}{pct}\x1b[K", end="", file=sys.stderr, flush=True)

    def end_line(self) -> None:
        if self.tty:
            print("\r\x1b[K", end="", file=sys.stderr, flush=True)


def _tmp_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{os.getpid()}.part")


def _atomic_write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(dest)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, dest)
    except OSError as e:
        raise AttnkitError(f"{dest}: cannot write ({_one_line(e)})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _mismatch(what: str, algo: str, expected: str, got: str, url: str) -> AttnkitError:
    return AttnkitError(f"{what}: {algo} mismatch: expected {expected}, got {got} (from {url}); nothing was written")


def download(url: str, dest: Path, *, sha256: str | None = None, md5: str | None = None, label: str = "",
             timeout: float = TIMEOUT_S, progress: _Progress | None = None) -> None:
    """``url`` -> ``dest`` through a temporary file beside it; renamed into place only if the checksum holds."""
    progress = progress or _Progress(False)
    label = label or dest.name
    tmp = _tmp_path(dest)
    digest = hashlib.sha256() if sha256 else hashlib.md5() if md5 else hashlib.sha256()
    size = 0
    try:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        try:
            response = urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise AttnkitError(f"cannot download {url}: HTTP {e.code} {_one_line(e.reason)}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise AttnkitError(f"cannot download {url}: {_one_line(reason)} (no network? a mirror can be given "
                               f"with --source or ${MIRROR_ENV})") from None
        dest.parent.mkdir(parents=True, exist_ok=True)
        with response, open(tmp, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0)
            progress.say(f"{label}: downloading {url}" + (f" ({_mb(total)})" if total else ""))
            while True:
                try:
                    chunk = response.read(CHUNK)
                except (OSError, ValueError) as e:  # a timeout or a dropped connection mid-transfer
                    raise AttnkitError(f"cannot download {url}: {_one_line(e) or type(e).__name__} "
                                       f"after {_mb(size)}") from None
                if not chunk:
                    break
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                progress.update(label, size, total)
        progress.end_line()
        if total and size != total:
            raise AttnkitError(f"cannot download {url}: got {size} of {total} bytes; nothing was written")
        got = digest.hexdigest()
        expected, algo = (sha256, "sha256") if sha256 else (md5, "md5")
        if expected and got != expected:
            raise _mismatch(label, algo, expected, got, url)
        os.replace(tmp, dest)
    except OSError as e:
        raise AttnkitError(f"{dest}: cannot write ({_one_line(e)})") from None
    finally:
        progress.end_line()
        tmp.unlink(missing_ok=True)


# --- planning: what is there already


def _check_existing(path: Path, sha256: str, overwrite: bool) -> bool:
    """True if ``path`` already holds the pinned bytes; an existing other file is an error without --overwrite."""
    if not path.exists():
        return False
    if not path.is_file():
        raise AttnkitError(f"{path}: exists and is not a file")
    got = file_digest(path)
    if got == sha256:
        return True
    if not overwrite:
        raise AttnkitError(f"{path}: already exists with other contents (sha256 {got}, expected {sha256}); "
                           "not overwritten: pass --overwrite to replace it")
    return False


@dataclass
class _Plan:
    name: str
    todo: list  # Pinned entries (or flickr8k parts) still to fetch
    present: list


def _plan(name: str, data_dir: Path, overwrite: bool) -> _Plan:
    if name == "flickr8k":
        root = data_dir / "flickr8k"
        todo, present = [], []
        for fname, sha in FLICKR8K_TEXT_FILES.items():
            (present if _check_existing(root / fname, sha, overwrite) else todo).append(fname)
        images = root / "images_224"
        have = {p.name for p in images.glob("*.jpg")} if images.is_dir() else set()
        if overwrite or len(have) < FLICKR8K_IMAGE_COUNT:
            todo.append("images_224")
        else:
            present.append("images_224")
        return _Plan(name, todo, present)
    todo, present = [], []
    for f in PINNED[name]:
        (present if _check_existing(data_dir / f.target, f.sha256, overwrite) else todo).append(f)
    return _Plan(name, todo, present)


# --- Flickr8k


def _member(z: zipfile.ZipFile, name: str, archive: str) -> bytes:
    found = [n for n in z.namelist() if Path(n).name == name and not n.startswith("__MACOSX/")]
    if len(found) != 1:
        raise AttnkitError(f"{archive}: expected one {name} inside, found {len(found)}")
    return z.read(found[0])


def flickr8k_tokens_as_laid_out(token_txt: bytes, test_images: bytes) -> bytes:
    """Upstream Flickr8k.token.txt -> shared/data's: drop the lines of "2258277193_586949ec62.jpg.1" (no such image;
    their key is not ``image.jpg#k``) and the captions of the official test split's images."""
    test = {line.strip() for line in test_images.decode("ascii").splitlines() if line.strip()}
    kept = []
    for line in token_txt.splitlines(keepends=True):
        key = line.split(b"\t", 1)[0]
        image, _, k = key.partition(b"#")
        if not image.endswith(b".jpg") or not k.isdigit():
            continue
        if image.decode("utf-8") in test:
            continue
        kept.append(line)
    return b"".join(kept)


def _fetch_flickr8k_text(root: Path, todo: list[str], base: str | None, timeout: float, progress: _Progress) -> None:
    url, md5 = FLICKR8K_TEXT_ZIP
    source = resolve_url(url, base)
    archive = root / f".Flickr8k_text.zip.{os.getpid()}.download"
    try:
        download(source, archive, md5=md5, label="flickr8k/Flickr8k_text.zip", timeout=timeout, progress=progress)
        progress.say("flickr8k/Flickr8k_text.zip: md5 ok (no sha256 of the archive is known)")
        try:
            with zipfile.ZipFile(archive) as z:
                members = {name: _member(z, name, "Flickr8k_text.zip") for name in FLICKR8K_TEXT_MEMBERS}
        except zipfile.BadZipFile as e:
            raise AttnkitError(f"{source}: not a zip archive ({_one_line(e)})") from None
    finally:
        archive.unlink(missing_ok=True)
    for name, sha in FLICKR8K_TEXT_MEMBERS.items():
        got = hashlib.sha256(members[name]).hexdigest()
        if got != sha:
            raise _mismatch(f"Flickr8k_text.zip:{name}", "sha256", sha, got, source)
    out = dict(members)
    out["Flickr8k.token.txt"] = flickr8k_tokens_as_laid_out(members["Flickr8k.token.txt"],
                                                            members["Flickr_8k.testImages.txt"])
    for name in todo:
        got = hashlib.sha256(out[name]).hexdigest()
        if got != FLICKR8K_TEXT_FILES[name]:
            raise _mismatch(f"flickr8k/{name}", "sha256", FLICKR8K_TEXT_FILES[name], got, source)
        _atomic_write(root / name, out[name])
        progress.say(f"flickr8k/{name}: written, sha256 ok")


def _resize_jpeg(data: bytes, name: str) -> bytes:
    from PIL import Image  # only Flickr8k needs it

    try:
        with Image.open(io.BytesIO(data)) as image:
            image = image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise AttnkitError(f"Flickr8k_Dataset.zip:{name}: cannot read image ({_one_line(e)})") from None
    if image.size != (IMAGE_SIZE, IMAGE_SIZE):
        image = image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


def _fetch_flickr8k_images(root: Path, overwrite: bool, base: str | None, timeout: float,
                           progress: _Progress) -> int:
    url, md5 = FLICKR8K_IMAGES_ZIP
    source = resolve_url(url, base)
    # kept (verified) until every image is written, so an interrupted run does not download 1 GB again
    archive = root / "Flickr8k_Dataset.zip"
    if archive.exists() and file_digest(archive, "md5") == md5:
        progress.say(f"{archive}: already downloaded, md5 ok")
    else:
        if archive.exists() and not overwrite:
            raise AttnkitError(f"{archive}: already exists with other contents (md5 mismatch); not overwritten: "
                               "pass --overwrite to replace it")
        download(source, archive, md5=md5, label="flickr8k/Flickr8k_Dataset.zip", timeout=timeout,
                 progress=progress)
        progress.say("flickr8k/Flickr8k_Dataset.zip: md5 ok (no sha256 of the archive is known)")
    images = root / "images_224"
    images.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(archive) as z:
            members = {Path(n).name: n for n in z.namelist()
                       if n.lower().endswith(".jpg") and not n.startswith("__MACOSX/")
                       and not Path(n).name.startswith("._")}
            names = sorted(members)
            digest = hashlib.sha256("".join(n + "\n" for n in names).encode()).hexdigest()
            if len(names) != FLICKR8K_IMAGE_COUNT or digest != FLICKR8K_IMAGE_NAMES_SHA256:
                raise AttnkitError(f"{archive}: expected the {FLICKR8K_IMAGE_COUNT} Flickr8k images, found "
                                   f"{len(names)} .jpg files with other names (names sha256 {digest}, expected "
                                   f"{FLICKR8K_IMAGE_NAMES_SHA256})")
            written = 0
            progress.say(f"flickr8k/images_224: resizing {len(names)} images to {IMAGE_SIZE}x{IMAGE_SIZE}")
            for i, name in enumerate(names, 1):
                dest = images / name
                if overwrite or not dest.exists():
                    _atomic_write(dest, _resize_jpeg(z.read(members[name]), name))
                    written += 1
                progress.update("flickr8k/images_224", i, len(names), unit="images")
            progress.end_line()
    except zipfile.BadZipFile as e:
        raise AttnkitError(f"{archive}: not a zip archive ({_one_line(e)})") from None
    archive.unlink()
    return written


# --- the command


def _summary(name: str, data_dir: Path, plan: _Plan, fetched: int) -> str:
    if name == "flickr8k":
        return (f"flickr8k: {data_dir / 'flickr8k'}: text files sha256-verified; archives md5-verified "
                f"(no sha256 of them is known); {FLICKR8K_IMAGE_COUNT} images checked by name and resized here "
                "to 224x224 (their pixels are not checksummed)")
    n = len(PINNED[name])
    note = (" (manythings.org Anki exports of 2018-05-13 and 2017-09-29, the snapshots the recipes were measured on, "
            "from GitHub copies: manythings.org itself serves only its current export)") if name == "tatoeba" else ""
    return (f"{name}: {n} file{'s' * (n != 1)} in {data_dir}, sha256-verified "
            f"({fetched} downloaded, {len(plan.present)} already present){note}")


def fetch(names: list[str], data_dir: str | Path | None = None, source: str | None = None, overwrite: bool = False,
          timeout: float = TIMEOUT_S, progress: bool = True) -> list[str]:
    """Download the data sets ``names`` ("all" = every one) into the data directory; one summary line per set."""
    wanted = list(DATASETS) if "all" in names else list(dict.fromkeys(names))
    for name in wanted:
        if name not in DATASETS:
            raise AttnkitError(f"unknown data set {name!r}: choose from {', '.join(DATASETS)} or all")
    root = resolve_data_dir(str(data_dir) if data_dir else None)
    base = source_base(source)
    out = _Progress(progress)
    plans = [_plan(name, root, overwrite) for name in wanted]  # refuse before anything is downloaded
    summaries = []
    for plan in plans:
        if plan.name == "flickr8k":
            fetched = _fetch_flickr8k(root, plan, overwrite, base, timeout, out)
        else:
            for f in plan.present:
                out.say(f"{f.target}: already present, checksum ok")
            for f in plan.todo:
                download(resolve_url(f.url, base), root / f.target, sha256=f.sha256, label=f.target,
                         timeout=timeout, progress=out)
                out.say(f"{f.target}: sha256 ok")
            fetched = len(plan.todo)
        summaries.append(_summary(plan.name, root, plan, fetched))
    return summaries


def _fetch_flickr8k(root: Path, plan: _Plan, overwrite: bool, base: str | None, timeout: float,
                    progress: _Progress) -> int:
    flickr = root / "flickr8k"
    for part in plan.present:
        note = "checksum ok" if part != "images_224" else f"{FLICKR8K_IMAGE_COUNT} images, not checksummed"
        progress.say(f"flickr8k/{part}: already present, {note}")
    text = [p for p in plan.todo if p != "images_224"]
    if text:
        _fetch_flickr8k_text(flickr, text, base, timeout, progress)
    written = 0
    if "images_224" in plan.todo:
        written = _fetch_flickr8k_images(flickr, overwrite, base, timeout, progress)
    return len(text) + written


def sources(names: list[str]) -> list[str]:
    """``URL<TAB>checksum<TAB>what it becomes`` for each download of ``names``: what ``--list`` prints."""
    wanted = list(DATASETS) if "all" in names else list(dict.fromkeys(names))
    rows = []
    for name in wanted:
        if name == "flickr8k":
            rows.append(f"{FLICKR8K_TEXT_ZIP[0]}\tmd5:{FLICKR8K_TEXT_ZIP[1]}\tflickr8k/{{Flickr8k.token.txt,"
                        "Flickr_8k.trainImages.txt,Flickr_8k.devImages.txt,readme.txt}")
            rows.append(f"{FLICKR8K_IMAGES_ZIP[0]}\tmd5:{FLICKR8K_IMAGES_ZIP[1]}\tflickr8k/images_224/")
        else:
            rows += [f"{f.url}\tsha256:{f.sha256}\t{f.target}" for f in PINNED[name]]
    return rows
