"""Checkpoint directories on disk: HF safetensors directories and per-rank Megatron directories.

Laziness: every conversion returns a `LazyStateDict` (`megatron_glue.weight_names`: a read-only
Mapping whose values are computed from the source on each access; `dict(x)` materialises it), and
sources may be any Mapping, e.g. `SafetensorsSource`, which reads one tensor from disk per access.
Sharding a 30B checkpoint for one rank therefore reads only the tensors (and experts) that rank
holds. Key sets and every tensor's shape are checked against the config up front (shapes from
safetensors headers, without reading data); a missing, extra or mis-shaped tensor raises ValueError
naming it.

An HF directory holds config.json and canonical per-expert `*.safetensors` files (with
`model.safetensors.index.json` when there are several). The Megatron directory holds one
`torch.save` file per rank, `mp_rank_{tp:02d}_{ep:03d}_{pp:03d}.pt`, and `megatron_meta.json`
(format, sizes, HF config dict).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import torch

from megatron_glue.sharding import check_parallel_sizes, own_storage
from megatron_glue.weight_names import LazyStateDict, canonical_hf_state_dict, natural_key, tensor_shape

META_FILE = "megatron_meta.json"
META_FORMAT = "megatron_glue.convert/v1"  # written into every Megatron directory: kept as it was
SAFETENSORS_INDEX = "model.safetensors.index.json"

__all__ = [
    "META_FILE",
    "META_FORMAT",
    "SafetensorsSource",
    "hf_config_from_dict",
    "load_hf_checkpoint",
    "save_hf_checkpoint",
    "megatron_shard_file",
    "save_megatron_checkpoint",
    "write_megatron_meta",
    "load_megatron_checkpoint",
    "cast_state_dict",
]


# --------------------------------------------------------------------------------------------------
# Lazy safetensors reading


class SafetensorsSource(Mapping):
    """All tensors of the `*.safetensors` files of a directory (or an explicit file list), read lazily.

    Uses `model.safetensors.index.json` when present (every file it names must exist), else every
    `*.safetensors` file in the directory. A name found in two files is an error.
    """

    def __init__(self, path: str | os.PathLike | Sequence[str | os.PathLike]):
        from safetensors import safe_open

        self._safe_open = safe_open
        if isinstance(path, (str, os.PathLike)):
            root = Path(path)
            index = root / SAFETENSORS_INDEX
            if index.is_file():
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted({root / f for f in weight_map.values()})
                for f in files:
                    if not f.is_file():
                        raise FileNotFoundError(f"{index} names {f.name}, which does not exist")
            else:
                files = sorted(root.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors files in {root}")
        else:
            files = [Path(p) for p in path]
        self._handles: dict[Path, Any] = {}
        self._where: dict[str, Path] = {}
        for f in files:
            h = self._open(f)
            for k in h.keys():
                if k in self._where:
                    raise ValueError(f"tensor {k!r} appears in both {self._where[k]} and {f}")
                self._where[k] = f
        self._keys = sorted(self._where, key=natural_key)

    def _open(self, f: Path) -> Any:
        h = self._handles.get(f)
        if h is None:
            h = self._handles[f] = self._safe_open(str(f), framework="pt", device="cpu")
        return h

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._open(self._where[key]).get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def shape_of(self, key: str) -> tuple:
        return tuple(self._open(self._where[key]).get_slice(key).get_shape())

    def file_of(self, key: str) -> Path:
        return self._where[key]


# --------------------------------------------------------------------------------------------------
# Checkpoint directories


def hf_config_from_dict(cfg: Mapping[str, Any]) -> Any:
    from transformers import AutoConfig

    cfg = dict(cfg)
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise ValueError("HF config dict has no model_type")
    return AutoConfig.for_model(model_type, **cfg)


def load_hf_checkpoint(path: str | os.PathLike) -> tuple[Any, SafetensorsSource]:
    """(HF config, lazy tensor Mapping) of an HF checkpoint directory (config.json + *.safetensors)."""
    from transformers import AutoConfig

    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"HF checkpoint directory {root} does not exist")
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"HF checkpoint {root} has no config.json ({root / 'config.json'})")
    hf_config = AutoConfig.from_pretrained(str(root), local_files_only=True)
    return hf_config, SafetensorsSource(root)


def save_hf_checkpoint(
    path: str | os.PathLike,
    hf_config: Any,
    state_dict: Mapping[str, torch.Tensor],
    shard_size_mb: float = 4096,
    dtype: Optional[torch.dtype] = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[Path]:
    """Write canonical per-expert safetensors (+ index when more than one file) and config.json.

    Reads `state_dict` (canonical or fused names; may be lazy, even over the files being replaced)
    one output file at a time; files are written to a temporary sibling directory and then moved in,
    replacing earlier `*.safetensors` / index files of `path`. Tensors keep their dtype unless `dtype`
    is given; config.json's `dtype` is that of the embedding. Returns the written safetensors paths.
    """
    import shutil

    from safetensors.torch import save_file

    can = canonical_hf_state_dict(state_dict, hf_config)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    emb_dtype = dtype or can["model.embed_tokens.weight"].dtype
    limit = int(shard_size_mb * 2**20)
    itemsize = torch.empty((), dtype=emb_dtype).element_size()  # for grouping only
    groups: list[list[str]] = [[]]
    size = 0
    for k in can:
        n = 1
        for s in can.shape_of(k):
            n *= s
        b = n * itemsize
        if groups[-1] and size + b > limit:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += b
    names = (
        ["model.safetensors"]
        if len(groups) == 1
        else [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    )
    tmp = root.parent / f".{root.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        weight_map = {}
        total = 0
        for fname, keys in zip(names, groups):
            tensors = {}
            for k in keys:
                t = can[k]
                tensors[k] = own_storage(t if dtype is None else t.to(dtype))
                total += tensors[k].numel() * tensors[k].element_size()
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in keys})
            log(f"wrote {root / fname} ({len(keys)} tensors)")
            del tensors
        if len(groups) > 1:
            (tmp / SAFETENSORS_INDEX).write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
            )
        cfg = copy.deepcopy(hf_config)
        if hasattr(cfg, "dtype"):
            cfg.dtype = emb_dtype
        cfg.save_pretrained(str(tmp))
        for stale in list(root.glob("*.safetensors")) + [root / SAFETENSORS_INDEX]:
            if stale.exists():
                stale.unlink()
        for f in tmp.iterdir():
            os.replace(f, root / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [root / n for n in names]


def megatron_shard_file(tp: int, ep: int, pp: int) -> str:
    """File name of rank (tp, ep, pp) in a Megatron checkpoint directory."""
    return f"mp_rank_{tp:02d}_{ep:03d}_{pp:03d}.pt"


def save_megatron_checkpoint(
    path: str | os.PathLike,
    shards: Mapping[tuple[int, int, int], Mapping[str, Any]],
    meta: Mapping[str, Any],
) -> None:
    """One `torch.save` file per (tp, ep, pp) rank plus `megatron_meta.json`.

    meta: `tp`, `ep`, `pp` sizes and `hf_config` (a PretrainedConfig or its dict); other keys are kept.
    The shards must be exactly the ranks of those sizes.
    """
    meta = dict(meta)
    for k in ("tp", "ep", "pp", "hf_config"):
        if k not in meta:
            raise ValueError(f"Megatron checkpoint meta needs {k!r}")
    tp, ep, pp = int(meta["tp"]), int(meta["ep"]), int(meta["pp"])
    cfg = meta["hf_config"]
    cfg_obj = cfg if not isinstance(cfg, Mapping) else hf_config_from_dict(cfg)
    check_parallel_sizes(cfg_obj, tp, ep, pp)
    want = {(t, e, p) for t in range(tp) for e in range(ep) for p in range(pp)}
    if set(shards) != want:
        raise ValueError(f"shards {sorted(shards)} are not the ranks of tp={tp}, ep={ep}, pp={pp}")
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for (t, e, p), sd in shards.items():
        torch.save({k: (None if v is None else own_storage(v)) for k, v in sd.items()}, root / megatron_shard_file(t, e, p))
    write_megatron_meta(root, meta, cfg_obj)


def write_megatron_meta(root: Path, meta: Mapping[str, Any], cfg_obj: Any) -> None:
    """Write `megatron_meta.json` of a Megatron directory: `meta` (with `tp`, `ep`, `pp`) plus format,
    the HF config `cfg_obj` as a dict, and the rank file names."""
    meta = dict(meta)
    meta["format"] = META_FORMAT
    meta["hf_config"] = cfg_obj.to_dict()
    meta["files"] = {
        f"{t},{e},{p}": megatron_shard_file(t, e, p)
        for t in range(int(meta["tp"]))
        for e in range(int(meta["ep"]))
        for p in range(int(meta["pp"]))
    }
    (root / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")


def load_megatron_checkpoint(
    path: str | os.PathLike, mmap: bool = True
) -> tuple[Any, dict[tuple[int, int, int], dict[str, Any]], dict[str, Any]]:
    """(hf_config, shards keyed (tp, ep, pp), meta) of a directory written by `save_megatron_checkpoint`.

    With `mmap` the tensors stay on disk until used."""
    root = Path(path)
    meta_path = root / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"Megatron checkpoint {root} has no {META_FILE} ({meta_path})")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != META_FORMAT:
        raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {META_FORMAT!r}")
    hf_config = hf_config_from_dict(meta["hf_config"])
    tp, ep, pp = int(meta["tp"]), int(meta["ep"]), int(meta["pp"])
    shards = {}
    for t in range(tp):
        for e in range(ep):
            for p in range(pp):
                f = root / megatron_shard_file(t, e, p)
                if not f.is_file():
                    raise FileNotFoundError(f"Megatron checkpoint {root}: missing rank file {f.name} (tp={t}, ep={e}, pp={p})")
                shards[t, e, p] = torch.load(f, map_location="cpu", weights_only=True, mmap=mmap)
    return hf_config, shards, meta


def cast_state_dict(sd: Mapping[str, torch.Tensor], dtype: Optional[torch.dtype]) -> Mapping[str, torch.Tensor]:
    """`sd` with every tensor cast to `dtype` on access (lazily); `sd` itself when `dtype` is None."""
    if dtype is None:
        return sd
    shapes = {k: tensor_shape(sd, k) for k in sd}
    return LazyStateDict(list(sd), lambda k: sd[k].to(dtype), shapes)
