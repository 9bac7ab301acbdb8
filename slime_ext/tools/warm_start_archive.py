"""Archive SFT warm starts from the run cache and restore them, checked by SHA-256.

Why: a study's arms on one seed must start from one warm start, and a study often spans several machines (a fresh
machine has an empty `run.cache_dir`). Rebuilding a warm start costs up to an hour of SFT and is bit-identical only
on the machine that built it, so a study keeps the ones it started from (a few MiB each for the tiny models) and
restores them into the cache: the job then finds `warmstart/<key>/complete` and skips SFT, exactly as on the
machine that built it. The key is the job's content hash of the settings (`TrainingJob.warm_start_key`), so a
restored warm start is only used by a job whose settings match.

    python -m slime_ext.tools.warm_start_archive pack .cache/slime_ext KEY [KEY ...] --out results/STUDY/warm_starts
    python -m slime_ext.tools.warm_start_archive unpack results/STUDY/warm_starts .cache/slime_ext
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

MANIFEST = "MANIFEST.json"


class ArchiveError(RuntimeError):
    """An archive or cache entry that cannot be used as it is (named in the message)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_hashes(hf_dir: Path) -> dict[str, str]:
    return {p.relative_to(hf_dir).as_posix(): sha256_of(p) for p in sorted(hf_dir.rglob("*")) if p.is_file()}


def pack(cache_dir: Path, key: str, out: Path) -> Path:
    """Copy the finished warm start `cache_dir/warmstart/key` to `out/key` with a manifest of its files' hashes."""
    src = cache_dir / "warmstart" / key
    if not (src / "complete").exists():
        raise ArchiveError(f"{src}: no 'complete' marker; only a finished warm start can be archived")
    dest = out / key
    if dest.exists():
        raise ArchiveError(f"{dest} exists; remove it first to archive {key} again")
    hashes = _file_hashes(src / "hf")
    shutil.copytree(src / "hf", dest / "hf")
    manifest = {"key": key, "complete": json.loads((src / "complete").read_text()), "sha256": hashes,
                "bytes": sum((dest / "hf" / name).stat().st_size for name in hashes)}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return dest


def _read_manifest(entry: Path) -> dict:
    try:
        manifest = json.loads((entry / MANIFEST).read_text())
        return {"key": str(manifest["key"]), "complete": manifest["complete"], "sha256": dict(manifest["sha256"])}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(f"{entry / MANIFEST}: unreadable manifest ({exc})") from exc


def _check_files(hf_dir: Path, expected: dict[str, str], where: str) -> None:
    found = _file_hashes(hf_dir) if hf_dir.is_dir() else {}
    for name in sorted(set(expected) | set(found)):
        if name not in found:
            raise ArchiveError(f"{where}: file {name} is missing")
        if name not in expected:
            raise ArchiveError(f"{where}: file {name} is not in the manifest")
        if found[name] != expected[name]:
            raise ArchiveError(f"{where}: file {name} has SHA-256 {found[name][:12]}..., the manifest says "
                               f"{expected[name][:12]}...")


def unpack_entry(entry: Path, cache_dir: Path) -> str:
    """Restore one archived warm start into `cache_dir/warmstart/<key>`; returns 'restored' or 'present'.

    The archive's files are checked against the manifest first; a cache entry already there is kept only when its
    files are the same, and refused (never overwritten) when they differ."""
    manifest = _read_manifest(entry)
    if manifest["key"] != entry.name:
        raise ArchiveError(f"{entry}: the manifest's key {manifest['key']} is not the folder's name")
    _check_files(entry / "hf", manifest["sha256"], str(entry))
    target = cache_dir / "warmstart" / manifest["key"]
    if (target / "complete").exists():
        _check_files(target / "hf", manifest["sha256"], f"{target} (already in the cache, not overwritten)")
        return "present"
    if target.exists():
        raise ArchiveError(f"{target} holds an unfinished warm start (no 'complete' marker); remove it to restore "
                           f"the archived one")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        staged = Path(tmp) / target.name
        shutil.copytree(entry / "hf", staged / "hf")
        (staged / "complete").write_text(json.dumps(manifest["complete"]) + "\n")  # written last, as the job does
        staged.rename(target)
    return "restored"


def unpack(archive: Path, cache_dir: Path) -> dict[str, str]:
    entries = sorted(p for p in archive.iterdir() if (p / MANIFEST).exists()) if archive.is_dir() else []
    if not entries:
        raise ArchiveError(f"{archive}: no archived warm start (no <key>/{MANIFEST})")
    return {entry.name: unpack_entry(entry, cache_dir) for entry in entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="archive finished warm starts from a run cache")
    p.add_argument("cache_dir", type=Path)
    p.add_argument("keys", nargs="+")
    p.add_argument("--out", type=Path, required=True)
    u = sub.add_parser("unpack", help="restore archived warm starts into a run cache")
    u.add_argument("archive", type=Path)
    u.add_argument("cache_dir", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.command == "pack":
            for key in args.keys:
                print(f"archived {key} -> {pack(args.cache_dir, key, args.out)}")
        else:
            for key, what in unpack(args.archive, args.cache_dir).items():
                print(f"{key}: {what}")
    except ArchiveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
