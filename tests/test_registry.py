"""The registry of families, data formats and tasks: every entry resolves, the table agrees with the classes it
names, and no source file outside it decides by comparing a family or data-format name."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from attnkit import registry
from attnkit.config import MODEL_CONFIGS, config_from_dict
from attnkit.errors import AttnkitError

SRC = Path(__file__).parents[1] / "src" / "attnkit"


@pytest.mark.parametrize("name", sorted(registry.FAMILIES))
def test_every_family_resolves_to_its_config_and_builder(name):
    f = registry.FAMILIES[name]
    config = registry.resolve(f.config)
    assert dataclasses.is_dataclass(config) and config.family == name and MODEL_CONFIGS[name] is config
    assert callable(registry.resolve(f.build))
    assert f.task in registry.TASKS and f.source in registry.SOURCES
    assert f.masks_source in ("", "tokens", "memory")


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


def _subject(node) -> str | None:
    """"family" or "format" for ``x.family``, ``x.format``, ``family``, ``format``; else None."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return name if name in ("family", "format") else None


def test_no_source_file_outside_the_registry_compares_a_family_or_a_data_format_name():
    known = set(registry.FAMILIES) | set(registry.FORMATS)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            subjects = [_subject(s) for s in sides]
            named = set().union(*(_names(s) for s in sides)) & known
            if any(subjects) and named:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
