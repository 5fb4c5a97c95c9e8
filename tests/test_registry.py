"""The registry of families, data formats and tasks: every entry resolves, the table agrees with the classes it
names, and no source file outside it decides by comparing a family or data-format name."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from attnkit import registry
from attnkit.config import ModelConfig, config_from_dict
from attnkit.errors import AttnkitError
from attnkit.kinds import InputKind

SRC = Path(__file__).parents[1] / "src" / "attnkit"


@pytest.mark.parametrize("name", sorted(registry.FAMILIES))
def test_every_family_resolves_to_its_config_builder_and_kinds(name):
    f = registry.FAMILIES[name]
    config = registry.config_class(name)
    assert dataclasses.is_dataclass(config) and issubclass(config, ModelConfig) and config().family == name
    assert callable(registry.resolve(f.build))
    assert f.task in registry.TASKS and f.input in registry.KINDS and f.output in registry.OUTPUTS
    assert isinstance(registry.kind(f.input), InputKind) and registry.kind(f.input).name == f.input
    assert f.masks_source in ("", "tokens", "memory")
    fields = {g.name for g in dataclasses.fields(config)}
    assert set(f.legacy_names.values()) <= fields  # a 0.1 key is renamed to one of the family's own


@pytest.mark.parametrize("name", sorted(registry.TASKS))
def test_every_task_resolves_and_has_formats_and_families(name):
    t = registry.TASKS[name]
    for reference in (t.trainer, t.tokenizers, t.build):
        assert callable(registry.resolve(reference))
    assert registry.formats_of(name) and registry.families_of(name)
    for fmt in registry.formats_of(name):
        reader = registry.FORMATS[fmt].reader
        assert not reader or callable(registry.resolve(reader))


def test_a_family_and_a_format_of_different_tasks_are_refused_in_one_line():
    for family, f in registry.FAMILIES.items():
        for fmt, d in registry.FORMATS.items():
            if d.task == f.task or d.needs:
                continue
            with pytest.raises(AttnkitError) as e:
                config_from_dict({"model": {"family": family}, "data": {"format": fmt}})
            assert f"not {fmt!r}" in str(e.value) and "\n" not in str(e.value)


def test_unknown_names_are_one_line():
    with pytest.raises(AttnkitError, match="model.family = 'gru' is not one of"):
        registry.family("gru")
    with pytest.raises(AttnkitError, match="data.format = 'imdb' is not one of"):
        registry.data_format("imdb")


def _names(node) -> set[str]:
    """The string constants ``node`` is or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def _registered_names() -> set[str]:
    return set(registry.FAMILIES) | set(registry.FORMATS) | set(registry.TASKS) | set(registry.KINDS)


def _upload_names() -> set[str]:
    """What an input kind's upload endpoint names (:class:`attnkit.kinds.upload.Upload`): its path and the capability
    a model needs to answer it (a captioner's "caption"). The faces ask a model's kind for its upload; a comparison
    with one of these would be a branch for that kind."""
    uploads = [k.upload for k in registry.kinds() if k.upload is not None]
    assert len(uploads) >= 3  # an image to caption, an image to ask about, speech
    return {u.path for u in uploads} | {u.capability for u in uploads}


def _model_classes() -> set[str]:
    """The names of the classes a family's builder makes: what ``isinstance`` must not single out."""
    import torch

    names = set()
    for f in registry.FAMILIES.values():
        build = registry.resolve(f.build)
        module = __import__(build.__module__, fromlist=["_"])
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, torch.nn.Module) and value.__module__ == module.__name__ \
                    and hasattr(value, "capabilities") and value.__name__ not in ("EncoderDecoder",):
                names.add(value.__name__)
    return names


# subjects whose values are a namespace of their own that happens to share words with registered names: a
# classifier head's problem ("classification" or "regression")
OWN_NAMESPACES = {"problem"}
# the catalog of datasets that `attnkit fetch` downloads, named as the datasets are (attnkit fetch NAME), which a
# data format of the same name then reads
DATASET_CATALOGS = {"data/fetch.py"}


def _subject_name(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def decisions_on_names(source: str, known: set[str], classes: set[str], tables: set[str] | None = None
                       ) -> list[tuple[int, str]]:
    """Where ``source`` decides by a registered name or a model class: a comparison with a registered name
    (``known``), a table whose keys are all family or format names (``tables``), ``isinstance`` against a model
    class. -> [(line, what)]."""
    tables = known if tables is None else tables
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_subject_name(s) in OWN_NAMESPACES for s in sides):
                continue
            named = set().union(*(_names(s) for s in sides)) & known
            if named:
                found.append((node.lineno, f"compares {sorted(named)}"))
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if keys and len(keys) == len(node.keys) and keys <= tables:
                found.append((node.lineno, f"a table keyed by {sorted(keys)}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance" \
                and len(node.args) == 2:
            against = node.args[1]
            names = {_subject_name(e) for e in (against.elts if isinstance(against, ast.Tuple) else [against])}
            if names & classes:
                found.append((node.lineno, f"isinstance against {sorted(names & classes)}"))
    return found


def test_the_guard_catches_each_way_of_deciding_by_name():
    known, classes = _registered_names(), _model_classes()
    tables = set(registry.FAMILIES) | set(registry.FORMATS)
    assert {"Transformer", "RNNSearch", "TransformerLM", "SequenceClassifier", "GPTClassifier"} <= classes
    caught = [
        'if task == "stsb": pass',
        'EXAMPLES = {"dates": "July 20, 1969"}',
        'if model.source in ("image", "prompt"): pass',
        'ok = "transformer" != cfg.model.family',
        'if name == "translation": pass',
        "isinstance(model, Transformer)",
        "isinstance(m, (nn.Linear, models.SequenceClassifier))",
    ]
    for code in caught:
        assert decisions_on_names(code, known, classes, tables), code
    for code in ('if key == "valid_loss": pass', "isinstance(x, torch.Tensor)", 'answer = {"text": 1, "score": 2}',
                 'if problem == "classification": pass', 'args = {"parallel": "ddp", "device": "cpu"}'):
        assert not decisions_on_names(code, known, classes, tables), code
    uploads = _upload_names()
    for code in ('if "caption" in model.capabilities: pass', 'if endpoint == "/v1/transcribe": pass',
                 'if path in ("/v1/caption", "/v1/answer"): pass', 'if job.kind == "answer": pass'):
        assert decisions_on_names(code, known | uploads, classes, tables), code
    assert not decisions_on_names('model.require("caption")', known | uploads, classes, tables)


def test_no_source_file_outside_the_registry_and_the_kinds_decides_by_a_registered_name():
    """Families, data formats, tasks and input kinds are asked, not named: a comparison with a registered name or
    with what an input kind's upload endpoint names (its path, its capability), a table keyed by family or format
    names, or ``isinstance`` against a model class outside registry.py and attnkit/kinds/ would mean that adding an
    entry needs an edit there too."""
    known, classes = _registered_names() | _upload_names(), _model_classes()
    tables = set(registry.FAMILIES) | set(registry.FORMATS)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC)
        if path.name == "registry.py" or relative.parts[0] == "kinds" or relative.as_posix() in DATASET_CATALOGS:
            continue
        for line, what in decisions_on_names(path.read_text(encoding="utf-8"), known, classes, tables):
            found.append(f"{relative}:{line}: {what}")
    assert not found, found
