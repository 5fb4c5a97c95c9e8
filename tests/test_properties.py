"""Issue 23's property-based tests: for any input, the TOML config loader, --set overrides and the corpus readers
either work or raise AttnkitError (the CLI's one line), never another exception."""

from __future__ import annotations

import dataclasses
import gzip
import io
import tempfile
import zipfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.config import DataConfig, DecodeConfig, ExperimentConfig, TrainConfig, load_config
from attnkit.data import read_lines, read_parallel, read_tatoeba
from attnkit.errors import AttnkitError
from attnkit.models.transformer import TransformerConfig

SETTINGS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = {section: [f.name for f in dataclasses.fields(cls)] + ["nonsense"]
        for section, cls in (("model", TransformerConfig), ("data", DataConfig), ("train", TrainConfig),
                             ("decode", DecodeConfig))}

scalars = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=12), st.lists(st.integers(-5, 5), max_size=3),
                    st.lists(st.floats(-2, 2), max_size=3))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@st.composite
def toml_documents(draw) -> str:
    lines = []
    if draw(st.booleans()):
        lines.append(f"name = {_toml_value(draw(st.text(max_size=8)))}")
    for section in draw(st.lists(st.sampled_from(list(KEYS)), unique=True, max_size=4)):
        lines.append(f"[{section}]")
        for key in draw(st.lists(st.sampled_from(KEYS[section]), unique=True, max_size=4)):
            lines.append(f"{key} = {_toml_value(draw(scalars))}")
    return "\n".join(lines) + "\n"


def _works_or_one_line(f, *args) -> None:
    try:
        result = f(*args)
    except AttnkitError as e:
        assert str(e).strip(), "an empty error message"
        return
    return result


@SETTINGS
@given(toml_documents())
def test_any_structured_config_loads_or_is_refused(text):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        path.write_text(text, encoding="utf-8")
        cfg = _works_or_one_line(load_config, path)
        assert cfg is None or isinstance(cfg, ExperimentConfig)


@SETTINGS
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_any_bytes_as_a_config_load_or_are_refused(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        path.write_bytes(data)
        _works_or_one_line(load_config, path)


@st.composite
def overrides(draw) -> str:
    if draw(st.booleans()):
        return draw(st.text(max_size=30))
    section = draw(st.sampled_from(list(KEYS) + ["", "nosuch", "model.x"]))
    key = draw(st.sampled_from(KEYS.get(section, ["x"])))
    value = draw(st.one_of(scalars.map(_toml_value), st.text(max_size=10)))
    return f"{section}.{key}={value}" if section else f"{key}={value}"


@SETTINGS
@given(st.lists(overrides(), max_size=4))
def test_any_set_overrides_apply_or_are_refused(texts):
    _works_or_one_line(load_config, None, texts)


gz_or_plain = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=300).map(gzip.compress),
    st.tuples(st.binary(max_size=300), st.integers(0, 60)).map(lambda p: gzip.compress(p[0])[:p[1]]),
)


@SETTINGS
@given(gz_or_plain, st.sampled_from(["a.txt", "a.gz"]))
def test_read_lines_of_any_bytes(data, name):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        lines = _works_or_one_line(read_lines, path)
        assert lines is None or all(isinstance(line, str) for line in lines)


@SETTINGS
@given(gz_or_plain, gz_or_plain)
def test_read_parallel_of_any_bytes(src, tgt):
    with tempfile.TemporaryDirectory() as d:
        a, b = Path(d) / "a.en", Path(d) / "a.de"
        a.write_bytes(src)
        b.write_bytes(tgt)
        pairs = _works_or_one_line(read_parallel, a, b)
        assert pairs is None or len(pairs.src) == len(pairs.tgt)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


tatoeba_bytes = st.one_of(
    st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=5).map(
        lambda rows: "".join(f"{a}\t{b}\n" for a, b in rows).encode("utf-8", "surrogatepass")),
)


@SETTINGS
@given(st.one_of(tatoeba_bytes.map(lambda b: ("p.txt", b)),
                 st.dictionaries(st.sampled_from(["deu.txt", "_about.txt", "x/y.txt", "readme"]), tatoeba_bytes,
                                 max_size=3).map(lambda m: ("p.zip", _zip(m))),
                 st.tuples(st.binary(max_size=200), st.integers(0, 80)).map(
                     lambda p: ("p.zip", _zip({"deu.txt": p[0]})[:p[1]]))),
       st.booleans())
def test_read_tatoeba_of_any_bytes(named, reverse):
    name, data = named
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        _works_or_one_line(read_tatoeba, path, reverse)
