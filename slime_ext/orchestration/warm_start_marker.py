"""The `complete` marker of a cached SFT warm start, and the build id it carries.

The marker is written last, so its presence means the weights are whole. Its cache key is a hash of the config
and data, not of the weights: two machines (or an archive restored from another day's build) can hold different
weights under one key. A random build id written with the marker tells them apart; a run records the id of the
warm start it trained from, and whatever later loads that warm start for the run (a study's evaluation or
latency measurement) checks it for the price of one small file (hashing the weights would take minutes at 30B).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

MARKER = "complete"


class WarmStartMismatch(RuntimeError):
    """The cache holds other weights under the key than the ones a run trained from."""


def write_marker(folder: Path, steps: int) -> str:
    """Mark the warm start in `folder` (the key folder holding hf/) finished; returns its new build id."""
    build = uuid.uuid4().hex
    finished = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (Path(folder) / MARKER).write_text(json.dumps({"steps": steps, "build": build, "finished": finished}) + "\n")
    return build


def build_of(warm_start: Path | str) -> Optional[str]:
    """The build id of a cached warm start (its hf/ folder or the key folder above it); None where the folder has no
    marker or a marker written before build ids existed."""
    path = Path(warm_start)
    for folder in (path, path.parent):
        marker = folder / MARKER
        if marker.is_file():
            try:
                return json.loads(marker.read_text()).get("build")
            except (ValueError, AttributeError):  # not a marker of ours (a folder above a user's checkpoint)
                return None
    return None


def check_build(warm_start: Path | str, expected: Optional[str], what: str) -> None:
    """Refuse to use `warm_start` for `what` when both ids are known and differ. An id missing on either side (a run
    or a cache from before build ids) cannot be checked and passes."""
    found = build_of(warm_start)
    if expected is not None and found is not None and found != expected:
        raise WarmStartMismatch(
            f"{what}: the warm start {warm_start} in this machine's cache is build {found}, but the run trained from "
            f"build {expected} (same cache key, other weights: built again or restored from another archive). "
            "Restore the archive of the run's own warm start (results/*/warm_starts/, python -m "
            "slime_ext.tools.warm_start_archive unpack ...) after moving this one aside")
