"""Compose YAML config files, apply `a.b.c=value` overrides, validate, and explain errors.

A config file may name what it builds on:

    extends: base.yaml            # or a list; paths are relative to this file
    include: [models/tiny-qwen3-moe.yaml, cluster/local.yaml]

Files are merged depth-first (extends, then includes, then the file's own keys; later wins; lists are
replaced, not concatenated). We remember which file (or command-line override) set every key so an
error can name the place the user must edit.

The merged `method` (after overrides; default grpo) picks the schema: the run-wide sections plus that method's
registry sections (`slime_ext.config.schema.config_model`). A section of another registered method is an error
that names the section, the methods it belongs to and the place that set it.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from slime_ext.config.schema import DEFAULT_METHOD, CoreConfig, config_model, section_owners
from slime_ext.methods import registry

KeyPath = tuple[str, ...]
COMPOSE_KEYS = ("extends", "include")


class ConfigError(ValueError):
    """A config could not be loaded; `problems` holds one message per bad key."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("invalid config:\n  " + "\n  ".join(self.problems))


@dataclass
class ResolvedConfig:
    config: CoreConfig  # the model of the run's method (slime_ext.config.schema.config_model)
    files: list[str]  # every file that contributed, in merge order
    overrides: list[str]
    sources: dict[KeyPath, str] = field(repr=False)

    def to_yaml(self) -> str:
        header = ["# resolved config", "# files: " + ", ".join(self.files)]
        if self.overrides:
            header.append("# overrides: " + " ".join(self.overrides))
        body = yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False)
        return "\n".join(header) + "\n" + body

    def describe(self) -> str:
        """One line for logs: the method and the files."""
        return f"method={self.config.method}, files: {', '.join(self.files)}"

    def write(self, run_dir: str | Path) -> Path:
        path = Path(run_dir) / "config.yaml"
        path.write_text(self.to_yaml())
        return path


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError([f"{path}: config file not found"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level must be a mapping of keys, got {type(data).__name__}"])
    return data


def _record_sources(data: Any, prefix: KeyPath, source: str, sources: dict[KeyPath, str]) -> None:
    if isinstance(data, dict):
        for key, value in data.items():
            path = prefix + (str(key),)
            sources[path] = source
            _record_sources(value, path, source, sources)


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _as_list(value: Any, path: Path, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError([f"{path}: '{key}' must be a file name or a list of file names"])


def _compose(path: Path, chain: tuple[Path, ...], files: list[str], sources: dict[KeyPath, str]) -> dict:
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(str(p) for p in chain + (path,))
        raise ConfigError([f"{path}: circular extends/include: {cycle}"])
    raw = _read_yaml(path)
    merged: dict = {}
    for key in COMPOSE_KEYS:
        for name in _as_list(raw.get(key), path, key):
            parent = (path.parent / name)
            merged = _deep_merge(merged, _compose(parent, chain + (path,), files, sources))
    own = {k: v for k, v in raw.items() if k not in COMPOSE_KEYS}
    _record_sources(own, (), _display(path), sources)
    files.append(_display(path))
    return _deep_merge(merged, own)


def _display(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """`a.b.c=value` -> (("a","b","c"), value); the value is parsed as YAML (numbers, lists, null)."""
    if "=" not in text:
        raise ConfigError([f"command line: override '{text}' must look like key.path=value"])
    key, raw = text.split("=", 1)
    parts = tuple(p for p in key.strip().split("."))
    if not parts or any(not p for p in parts):
        raise ConfigError([f"command line: override '{text}' has an empty key path"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def _set_path(data: dict, path: KeyPath, value: Any, where: str, sources: dict[KeyPath, str]) -> None:
    """Set `path` to `value`; a section the override creates is recorded as coming from it (so an unknown
    section in `foo.bar=1` names the override, not the file or the defaults)."""
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
            sources[path[: i + 1]] = where
        if not isinstance(child, dict):
            raise ConfigError([f"{where}: '{'.'.join(path[: i + 1])}' is a value, not a section"])
        node = child
    node[path[-1]] = value


def _unwrap_model(annotation: Any, index_step: bool) -> Any:
    """Find the pydantic model (or item type) behind Optional[...] / list[...] annotations."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                return _unwrap_model(arg, index_step)
    if index_step and origin in (list, tuple):
        args = typing.get_args(annotation)
        return args[0] if args else None
    return annotation


def _field_at(loc: Sequence[Any], schema: type[BaseModel]) -> tuple[type[BaseModel] | None, Any]:
    """Walk the run's schema along an error location; return (parent model, field info or None)."""
    model: Any = schema
    info = None
    for i, step in enumerate(loc):
        if isinstance(step, int):
            model = _unwrap_model(model, index_step=True)
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None, None
        info = model.model_fields.get(step)
        if i == len(loc) - 1:
            return model, info
        if info is None:
            return None, None
        model = _unwrap_model(info.annotation, index_step=False)
    return (model if isinstance(model, type) and issubclass(model, BaseModel) else None), info


def _expected_form(info: Any) -> str:
    ann = info.annotation
    text = getattr(ann, "__name__", None) if isinstance(ann, type) else None
    text = text or str(ann).replace("typing.", "")
    bounds = []
    for meta in info.metadata:
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(meta, attr, None) is not None:
                bounds.append(f"{sym} {getattr(meta, attr)}")
    return text + (" " + " and ".join(bounds) if bounds else "")


def _source_for(loc: KeyPath, sources: dict[KeyPath, str]) -> str:
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]]
    return "defaults"


def _check_sources(loc: KeyPath, err: dict, sources: dict[KeyPath, str]) -> str | None:
    """Where the keys a failed cross-field check names were set (a `ConfigCheckError`'s `keys`, relative
    to the model that raised it), so the message points at the override or file that must change."""
    exc = (err.get("ctx") or {}).get("error")
    keys = getattr(exc, "keys", None)
    if not keys:
        return None
    found: list[str] = []
    for key in keys:
        where = _source_for(loc + tuple(key.split(".")), sources)
        if where not in found:
            found.append(where)
    return ", ".join(found)


def _explain(err: dict, sources: dict[KeyPath, str], schema: type[BaseModel]) -> str:
    loc = tuple(err["loc"])
    dotted = ".".join(str(p) for p in loc)
    str_loc = tuple(str(p) for p in loc)
    where = _check_sources(str_loc, err, sources) or _source_for(str_loc, sources)
    if err["type"] == "extra_forbidden":
        parent, _ = _field_at(loc, schema)
        valid = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        prefix = ".".join(str(p) for p in loc[:-1])
        if close:
            hint = f"did you mean '{prefix + '.' if prefix else ''}{close[0]}'?"
        else:
            hint = f"valid keys here: {', '.join(valid)}"
        return f"{where}: unknown key '{dotted}'; {hint}"
    if err["type"] == "value_error":  # a cross-field check: its own message says what to change
        exc = (err.get("ctx") or {}).get("error")
        return f"{where}: {dotted + ': ' if dotted else ''}{exc if exc is not None else err['msg']}"
    _, info = _field_at(loc, schema)
    got = err.get("input")
    if info is not None and loc:
        return f"{where}: key '{dotted}' = {got!r}: expected {_expected_form(info)} ({err['msg']})"
    return f"{where}: {dotted or 'config'}: {err['msg']}"


def _places(prefix: KeyPath, sources: dict[KeyPath, str]) -> str:
    """Every file or override that set a key at or under `prefix` (in the order they were recorded)."""
    found: list[str] = []
    for path, where in sources.items():
        if path[: len(prefix)] == prefix and where not in found:
            found.append(where)
    return ", ".join(found) or "defaults"


def _run_method(data: dict, sources: dict[KeyPath, str]) -> str:
    """The run's method (the merged `method`, default grpo); an unregistered one is a ConfigError."""
    method = data.get("method", DEFAULT_METHOD)
    if not isinstance(method, str) or method not in registry.METHODS:
        raise ConfigError([f"{_source_for(('method',), sources)}: key 'method' = {method!r} is not a registered "
                           f"method; registered: {', '.join(registry.METHODS)}"])
    return method


def _foreign_sections(data: dict, method: str, schema: type[BaseModel], owners: dict[str, list[str]],
                      sources: dict[KeyPath, str]) -> list[str]:
    """A problem per top-level key that is another method's section (not part of this run's schema)."""
    return [f"{_places((str(key),), sources)}: section '{key}' belongs to method(s) {', '.join(owners[key])}; "
            f"this run's method is '{method}'" for key in data if key not in schema.model_fields and key in owners]


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> ResolvedConfig:
    """Compose `path` with everything it extends/includes, apply overrides, validate strictly against the
    schema of the run's method (the run-wide sections plus that method's own)."""
    files: list[str] = []
    sources: dict[KeyPath, str] = {}
    data = _compose(Path(path), (), files, sources)
    overrides = list(overrides)
    for text in overrides:
        key, value = parse_override(text)
        where = f"command line override '{text}'"
        _set_path(data, key, value, where, sources)
        sources[key] = where
        _record_sources(value, key, where, sources)
    method = _run_method(data, sources)
    schema = config_model(method)
    owners = section_owners()
    problems = _foreign_sections(data, method, schema, owners, sources)
    # the rest is validated too (its unknown keys, types and ranges named as well)
    own = {key: value for key, value in data.items() if key in schema.model_fields or key not in owners}
    try:
        config = schema.model_validate(own)
    except ValidationError as exc:
        problems += [_explain(e, sources, schema) for e in exc.errors()]
    if problems:
        raise ConfigError(problems)
    return ResolvedConfig(config=config, files=files, overrides=overrides, sources=sources)
