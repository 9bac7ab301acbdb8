"""Payload validation against sglang's own request definitions, before a payload is sent to a server.

`sampling_params` is built into sglang's own `SamplingParams` (unknown keys raise, `verify` checks ranges,
and a msgpack round trip checks that `custom_params` survives SGLang's typed IPC) and the top-level keys
are checked against the fields of the io_struct request class (by `ast` from sglang's source when
`io_struct` cannot be imported, e.g. on CPU). Needs the sglang package installed (not running).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)
# importing sglang's request definitions registers its model configs, each with an INFO line
logging.getLogger("sglang.srt.configs").setLevel(logging.WARNING)


def _sglang_file(relative: str) -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sglang is not installed; cannot read its request definitions")
    return Path(list(spec.submodule_search_locations)[0]) / relative


@lru_cache(maxsize=None)
def _io_struct_ast_fields() -> dict[str, tuple[list[str], list[str]]]:
    """class name -> (annotated field names, base class names) for every class in io_struct.py."""
    tree = ast.parse(_sglang_file("srt/managers/io_struct.py").read_text())
    out: dict[str, tuple[list[str], list[str]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names = [s.target.id for s in node.body
                     if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                     and "ClassVar" not in ast.unparse(s.annotation)]
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            out[node.name] = (names, bases)
    return out


@lru_cache(maxsize=1)
def _io_struct_module() -> Any:
    """The real io_struct module when it imports (GPU installs); None otherwise (CPU: needs torchvision)."""
    try:
        import sglang.srt.managers.io_struct as io_struct  # noqa: PLC0415
    except Exception as exc:  # noqa: BLE001 - any import failure means: fall back to ast
        logger.debug("sglang io_struct does not import (%s); reading its fields with ast", exc)
        return None
    return io_struct


@lru_cache(maxsize=None)
def io_struct_fields(class_name: str) -> frozenset[str]:
    """Field names of an sglang io_struct request class (dataclass or msgspec Struct, bases included)."""
    module = _io_struct_module()
    if module is not None and hasattr(module, class_name):
        cls = getattr(module, class_name)
        if dataclasses.is_dataclass(cls):
            return frozenset(f.name for f in dataclasses.fields(cls))
        import msgspec

        return frozenset(f.name for f in msgspec.structs.fields(cls))
    classes = _io_struct_ast_fields()
    if class_name not in classes:
        raise KeyError(f"sglang io_struct has no class {class_name!r}")
    names: set[str] = set()
    todo = [class_name]
    while todo:
        fields, bases = classes[todo.pop()]
        names.update(fields)
        todo.extend(b for b in bases if b in classes)
    return frozenset(names)


class PayloadError(ValueError):
    """A payload that sglang would reject (or silently misread)."""


def validate_payload(payload: dict[str, Any], class_name: str) -> None:
    """Raise PayloadError naming the top-level keys of `payload` that are not fields of io_struct's `class_name`."""
    unknown = sorted(set(payload) - io_struct_fields(class_name))
    if unknown:
        raise PayloadError(f"keys {unknown} are not fields of sglang's {class_name}")


def validate_sampling_params(params: dict[str, Any], vocab_size: Optional[int] = None) -> None:
    """Build `params` into sglang's SamplingParams and verify it, as the tokenizer manager does."""
    import msgspec
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangSamplingParams

    try:
        sp = SGLangSamplingParams(**params)
        sp.verify(vocab_size if vocab_size is not None else 1 << 31)
        # the scheduler IPC may be msgpack with typed decoding: custom_params must survive it
        msgspec.msgpack.decode(msgspec.msgpack.encode(sp), type=SGLangSamplingParams)
    except (TypeError, ValueError, msgspec.ValidationError) as exc:
        raise PayloadError(f"sampling_params rejected by sglang's SamplingParams: {exc}") from exc


def validate_generate_payload(payload: dict[str, Any], vocab_size: Optional[int] = None) -> None:
    """A `/generate` payload: its keys against GenerateReqInput, its sampling_params against SamplingParams."""
    validate_payload(payload, "GenerateReqInput")
    validate_sampling_params(payload.get("sampling_params") or {}, vocab_size)


__all__ = [
    "PayloadError", "io_struct_fields", "validate_payload", "validate_sampling_params", "validate_generate_payload",
]
