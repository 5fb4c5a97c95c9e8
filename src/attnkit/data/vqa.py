"""Visual question answering data: image-question-answer triples, their images held as pixels, the question words'
vocabulary and the answer set.

Two sources:

* **easy-VQA** (Zhou 2020, the ``easy-vqa`` package: 4,000 training and 1,000 test images of one coloured shape
  each, 64 x 64 pixels, 38,575 and 9,673 questions, 13 answers), read through the package's own functions and file
  layout. The package has no validation split: ``valid`` is every tenth training image (id % 10 == 9) with its
  questions, ``train`` the rest, ``test`` the package's test split. A question's type is what its answer says:
  ``yes/no``, ``shape`` or ``color``.
* **your own file**: JSONL rows ``{"image": path, "question": text, "answer": text}`` (optionally ``"type"``), or a
  TSV with a header row naming those columns; an image's path is relative to ``image_dir`` (default: the file's
  directory). A bad row is one line naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from attnkit.data.corpus import read_text
from attnkit.data.vocab import WordVocab
from attnkit.errors import AttnkitError

FIELDS = ("image", "question", "answer")  # a row's required fields; "type" is optional
ANSWERS_FILE = "answers.json"  # a checkpoint's answer set: {"answers": [...]}
VOCAB_FILE = "vocab.txt"  # a checkpoint's question words
EASY_VQA_SHAPES = frozenset({"circle", "rectangle", "triangle"})
VALID_EVERY = 10  # easy-VQA: every tenth training image is held out for validation


@dataclass
class VQAExamples:
    """Questions about images: ``images[i]`` is the file ``questions[i]`` asks about, ``answers[i]`` its answer and
    ``types[i]`` its question type. ``origin``: where they were read (for messages); ``lines[i]``: the line of
    example i in its file (0: not from a file)."""

    images: list[Path]
    questions: list[str]
    answers: list[str]
    types: list[str]
    origin: str = ""
    lines: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.questions)

    def head(self, n: int) -> VQAExamples:
        """The first ``n`` examples (0: all)."""
        if not n:
            return self
        return VQAExamples(self.images[:n], self.questions[:n], self.answers[:n], self.types[:n], self.origin,
                           self.lines[:n])


def easy_vqa_type(answer: str) -> str:
    """easy-VQA's question types, by the answer: yes/no, shape, color."""
    if answer in ("yes", "no"):
        return "yes/no"
    return "shape" if answer in EASY_VQA_SHAPES else "color"


def read_easy_vqa(split: str) -> VQAExamples:
    """easy-VQA's ``train``, ``valid`` or ``test`` split from the installed ``easy-vqa`` package (the package is
    the data: no data directory)."""
    try:
        import easy_vqa
    except ImportError:
        raise AttnkitError("data.format = 'easy_vqa' reads the easy-vqa package: pip install 'attnkit[vqa]'") \
            from None
    if split not in ("train", "valid", "test"):
        raise AttnkitError(f"easy_vqa: split {split!r} is not one of train, valid, test")
    if split == "test":
        (texts, answers, ids), paths = easy_vqa.get_test_questions(), easy_vqa.get_test_image_paths()
    else:
        (texts, answers, ids), paths = easy_vqa.get_train_questions(), easy_vqa.get_train_image_paths()
    keep = [i for i, image in enumerate(ids)
            if split == "test" or (image % VALID_EVERY == VALID_EVERY - 1) == (split == "valid")]
    return VQAExamples([Path(paths[ids[i]]) for i in keep], [texts[i] for i in keep], [answers[i] for i in keep],
                       [easy_vqa_type(answers[i]) for i in keep], f"easy-vqa {split}")


def _rows(path: Path):
    """(line number, {field: value}) of a JSONL file, or of a TSV file with a header row."""
    text = read_text(path)
    if path.suffix.lower() == ".tsv":
        lines = text.splitlines()
        if not lines:
            raise AttnkitError(f"{path}: empty (expected a header row naming {', '.join(FIELDS)})")
        reader = csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [f for f in FIELDS if f not in (reader.fieldnames or [])]
        if missing:
            raise AttnkitError(f"{path}:1: the header row has no column {missing[0]!r} (it needs "
                               f"{', '.join(FIELDS)})")
        for n, row in enumerate(reader, start=2):
            yield n, row
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise AttnkitError(f"{path}:{n}: invalid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise AttnkitError(f"{path}:{n}: expected an object with {', '.join(FIELDS)}")
        yield n, row


def read_vqa_file(path: str | Path, image_dir: str | Path | None = None, answers: bool = True) -> VQAExamples:
    """Your own questions: a JSONL or TSV file (see the module's docstring). ``answers`` False: the answer field is
    optional (questions to answer, not to score). Images are checked to exist, not read."""
    path = Path(path)
    root = Path(image_dir) if image_dir else path.parent
    out = VQAExamples([], [], [], [], str(path))
    for n, row in _rows(path):
        needed = FIELDS if answers else FIELDS[:2]
        for name in needed:
            value = row.get(name)
            if value is None:
                raise AttnkitError(f"{path}:{n}: field {name!r} is missing")
            if not isinstance(value, str) or not value.strip():
                raise AttnkitError(f"{path}:{n}: field {name!r} must be a non-empty string, got {value!r}")
        image = root / row["image"]
        if not image.is_file():
            raise AttnkitError(f"{path}:{n}: field 'image': {image}: no such file")
        kind = row.get("type") or "all"
        if not isinstance(kind, str):
            raise AttnkitError(f"{path}:{n}: field 'type' must be a string, got {kind!r}")
        out.images.append(image)
        out.questions.append(row["question"])
        out.answers.append(str(row.get("answer") or ""))
        out.types.append(kind)
        out.lines.append(n)
    if not out.questions:
        raise AttnkitError(f"{path}: no questions")
    return out


def easy_vqa_split(cfg, split: str, data_dir: str | None = None) -> VQAExamples:
    """``data.format = "easy_vqa"``: a split of the easy-vqa package."""
    return read_easy_vqa(split)


def read_vqa_split(cfg, split: str, data_dir: str | None = None) -> VQAExamples:
    """``data.format = "vqa"``: ``data.train_file`` or ``data.valid_file``, images under ``data.image_dir``."""
    name = {"train": cfg.data.train_file, "valid": cfg.data.valid_file}.get(split)
    if not name:
        raise AttnkitError(f"data.format = 'vqa': no file for split {split!r} (data.train_file, data.valid_file)")
    return read_vqa_file(name, cfg.data.image_dir or None)


def load_pixels(paths: list[Path], size: int) -> tuple[Tensor, Tensor]:
    """(uint8 RGB pixels [M, 3, size, size] of the M different image files among ``paths``, each read once; the
    index [N] of each path's image among them)."""
    from attnkit.data.images import load_image

    where: dict[Path, int] = {}
    for p in paths:
        where.setdefault(p, len(where))
    pixels = torch.stack([load_image(p, size) for p in where]) if where else torch.zeros(0, 3, size, size,
                                                                                          dtype=torch.uint8)
    return pixels, torch.tensor([where[p] for p in paths], dtype=torch.long)


def questions_by_image(image_of: Tensor, images: int) -> list[list[int]]:
    """The questions about each image: ``image_of`` [N], question n's image among ``images`` (as :func:`load_pixels`
    gives it) -> for each image m, the positions n of its questions, in question order (empty: no question)."""
    asks: list[list[int]] = [[] for _ in range(images)]
    for n, m in enumerate(image_of.tolist()):
        asks[m].append(n)
    return asks


def image_batch(asks: list[list[int]], images: list[int]) -> tuple[list[int], Tensor]:
    """A batch of whole images, each with all its questions (``asks``: :func:`questions_by_image`), so that a model
    reads each image once however many questions ask about it -> (the questions' positions [B]: image by image in
    the order of ``images``, each image's in question order; ``image_index`` [B]: question b's image, as a position
    0..M-1 in ``images``)."""
    questions = [n for m in images for n in asks[m]]
    image_index = torch.tensor([k for k, m in enumerate(images) for _ in asks[m]], dtype=torch.long)
    return questions, image_index


@dataclass
class QuestionVocab:
    """What a VQA checkpoint reads and writes: the questions' words (a :class:`WordVocab`, unknown words -> UNK)
    and the answer set (the classifier's outputs, in order)."""

    words: WordVocab
    answers: list[str]

    @property
    def vocab_size(self) -> int:
        return self.words.vocab_size

    def encode(self, questions: list[str]) -> list[list[int]]:
        return self.words.encode(questions)

    def unknown(self, question: str) -> list[str]:
        """The words of ``question`` the vocabulary never saw (read as UNK)."""
        return [w for w in self.words.words(question) if w not in self.words.stoi]

    @classmethod
    def build(cls, examples: VQAExamples, directory: Path) -> QuestionVocab:
        """Every training question word, and every training answer (sorted), written into ``directory``."""
        words = WordVocab.build(examples.questions, Path(directory) / VOCAB_FILE, min_count=1)
        answers = sorted(set(examples.answers))
        tmp = Path(directory) / (ANSWERS_FILE + ".tmp")
        tmp.write_text(json.dumps({"answers": answers}, indent=1) + "\n", encoding="utf-8")
        tmp.replace(Path(directory) / ANSWERS_FILE)
        return cls(words, answers)

    @classmethod
    def read(cls, directory: str | Path) -> QuestionVocab:
        path = Path(directory) / ANSWERS_FILE
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AttnkitError(f"{path}: missing (a VQA checkpoint keeps its answers there)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise AttnkitError(f"{path}: invalid JSON ({getattr(e, 'msg', e)})") from None
        answers = record.get("answers") if isinstance(record, dict) else None
        if not isinstance(answers, list) or len(answers) < 2 or not all(isinstance(a, str) for a in answers):
            raise AttnkitError(f"{path}: expected {{\"answers\": [at least two names]}}")
        return cls(WordVocab(Path(directory) / VOCAB_FILE), answers)

    @property
    def paths(self) -> list[Path]:
        return [self.words.path, self.words.path.parent / ANSWERS_FILE]


def question_vocab(cfg, directory: Path) -> QuestionVocab:
    """A VQA checkpoint's tokenizers (:mod:`attnkit.registry`)."""
    return QuestionVocab.read(directory)
