"""Archive SFT warm starts from the run cache as `<label>-<key>.tar.gz` and restore them, checked by SHA-256.

Why: a study's arms on one seed must start from one warm start, and a study often spans several machines (a fresh
machine has an empty `run.cache_dir`). Rebuilding a warm start costs up to an hour of SFT, so a study keeps the ones
it started from (13 MB each for the tiny model) and restores them into the cache: the job then finds
`warmstart/<key>/complete` and skips SFT, as on the machine that built it. The key is the job's content hash of the
settings (`TrainingJob.warm_start_key`), so a restored warm start is used only by a job whose settings match.

An archive is the cache folder as it is (`<key>/hf/`, `complete`, the SFT metrics), with a sidecar
`<archive>.sha256.json` of every file's SHA-256 (archives made by `tar` by hand, before this tool, have none: they
are restored with the folder layout checked, and the weights' SHA-256 printed to compare with the study's README).

    python -m slime_ext.tools.warm_start_archive pack .cache/slime_ext KEY --label seed0 --out results/STUDY/warm_starts
    python -m slime_ext.tools.warm_start_archive unpack results/STUDY/warm_starts/seed0-KEY.tar.gz .cache/slime_ext
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
import tempfile
from pathlib import Path

SUFFIX = ".tar.gz"


class ArchiveError(RuntimeError):
    """An archive or cache entry that cannot be used as it is (named in the message)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_of(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def sidecar(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sha256.json")


def pack(cache_dir: Path, key: str, out: Path, label: str) -> Path:
    """Archive the finished warm start `cache_dir/warmstart/key` as `out/<label>-<key>.tar.gz` with its sidecar."""
    src = cache_dir / "warmstart" / key
    if not (src / "complete").exists():
        raise ArchiveError(f"{src}: no 'complete' marker; only a finished warm start can be archived")
    archive = out / f"{label}-{key}{SUFFIX}"
    if archive.exists():
        raise ArchiveError(f"{archive} exists; remove it first to archive {key} again")
    out.mkdir(parents=True, exist_ok=True)
    hashes = file_hashes(src)
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=key)
    sidecar(archive).write_text(json.dumps({"key": key, "sha256": hashes}, indent=1, sort_keys=True) + "\n")
    return archive


def _expected(archive: Path) -> dict[str, str] | None:
    path = sidecar(archive)
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text())["sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(f"{path}: unreadable ({exc})") from exc


def _compare(found: dict[str, str], expected: dict[str, str], where: str) -> None:
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            raise ArchiveError(f"{where}: file {name} is missing")
        if name not in expected:
            raise ArchiveError(f"{where}: file {name} is not in the archive's SHA-256 list")
        if found[name] != expected[name]:
            raise ArchiveError(f"{where}: file {name} has SHA-256 {found[name][:12]}..., the archive says "
                               f"{expected[name][:12]}...")


def unpack(archive: Path, cache_dir: Path) -> tuple[str, str, dict[str, str]]:
    """Restore one archive into `cache_dir/warmstart/<key>`: returns (key, 'restored' or 'present', SHA-256 of the
    `hf/` files). The archive is extracted beside the cache entry and checked (one `<key>/` folder with `complete`
    and `hf/`, the sidecar's hashes when there is one) before it is moved in; an entry already in the cache is kept
    only when its files are the same, and refused (never overwritten) when they differ."""
    if not archive.name.endswith(SUFFIX) or not archive.is_file():
        raise ArchiveError(f"{archive}: not a {SUFFIX} file")
    warm = cache_dir / "warmstart"
    warm.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=warm, prefix=".restore-") as tmp:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(tmp, filter="data")  # refuses absolute paths, links out of the folder, devices
        except (tarfile.TarError, OSError) as exc:
            raise ArchiveError(f"{archive}: cannot extract ({exc})") from exc
        top = list(Path(tmp).iterdir())
        if len(top) != 1 or not (top[0] / "complete").is_file() or not (top[0] / "hf").is_dir():
            raise ArchiveError(f"{archive}: expected one <key>/ folder with 'complete' and hf/, found "
                               f"{sorted(p.name for p in top)}")
        staged, key = top[0], top[0].name
        hashes = file_hashes(staged)
        expected = _expected(archive)
        if expected is not None:
            _compare(hashes, expected, str(archive))
        target = warm / key
        weights = {name: h for name, h in hashes.items() if name.startswith("hf/")}
        if (target / "complete").exists():
            cached = {name: h for name, h in file_hashes(target).items() if name.startswith("hf/")}
            _compare(cached, weights, f"{target} (already in the cache, not overwritten)")
            return key, "present", weights
        if target.exists():
            raise ArchiveError(f"{target} holds an unfinished warm start (no 'complete' marker); remove it to "
                               "restore the archived one")
        staged.rename(target)
    return key, "restored", weights


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="archive a finished warm start from a run cache")
    p.add_argument("cache_dir", type=Path)
    p.add_argument("key")
    p.add_argument("--label", required=True, help="what the warm start is, e.g. seed0 or junior900")
    p.add_argument("--out", type=Path, required=True)
    u = sub.add_parser("unpack", help="restore archived warm starts into a run cache")
    u.add_argument("archives", type=Path, nargs="+")
    u.add_argument("cache_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.command == "pack":
            print(f"archived {args.key} -> {pack(args.cache_dir, args.key, args.out, args.label)}")
        else:
            for archive in args.archives:
                key, what, weights = unpack(archive, args.cache_dir)
                shown = ", ".join(f"{name} {h}" for name, h in weights.items() if name.endswith(".safetensors"))
                print(f"{key}: {what} from {archive.name} ({shown})")
    except ArchiveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
