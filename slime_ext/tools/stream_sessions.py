"""Which streamed timelines may be compared: only those streamed in one session (one machine, one boot).

Seconds depend on the machine: two 2-core VMs of the same kind differ 2-2.5x per token from one day to the next,
so a latency difference between two arms means something only when both were streamed on the same machine. A seed's
timelines live in one folder per session: the seed's folder for the first session (older folders record no session
and are taken as one session of an unknown machine), and a subfolder named after each later session, each with a
`session.json` saying which machine and boot streamed it. A comparison pairs two arms only inside one folder.
"""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Optional

SESSION_FILE = "session.json"
TIMELINES = "*.timing.jsonl"


def current_session() -> dict[str, str]:
    """This machine and boot (the kernel's boot id changes on every boot and differs between VMs)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return {"host": socket.gethostname(), "boot_id": boot.read_text().strip() if boot.exists() else "unknown",
            "date": time.strftime("%Y%m%d", time.gmtime())}


def session_name(session: dict[str, str]) -> str:
    return f"{session['date']}-{session['host']}-{session['boot_id'][:8]}"


def _recorded(folder: Path) -> Optional[dict[str, str]]:
    path = folder / SESSION_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _same(a: Optional[dict[str, str]], b: dict[str, str]) -> bool:
    return a is not None and (a["host"], a["boot_id"]) == (b["host"], b["boot_id"])


def folder_for_new_stream(seed_folder: Path, session: Optional[dict[str, str]] = None) -> Path:
    """Where this session writes a new timeline of the seed: the seed's folder when it is empty or holds this
    session's timelines, else this session's subfolder (created, with its `session.json`)."""
    session = session or current_session()
    mine = next((f for f in session_folders(seed_folder) if _same(_recorded(f), session)), None)
    if mine is not None:
        return mine
    folder = seed_folder if not any(seed_folder.glob(TIMELINES)) else seed_folder / session_name(session)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / SESSION_FILE).exists():
        (folder / SESSION_FILE).write_text(json.dumps(session, indent=2) + "\n")
    return folder


def session_folders(seed_folder: Path) -> list[Path]:
    """The seed's folder, then each later session's subfolder in name (date) order; other subfolders (such as
    superseded timelines) are not sessions."""
    later = sorted(p for p in seed_folder.glob("*") if p.is_dir() and (p / SESSION_FILE).is_file())
    return [seed_folder, *later]


def find_timeline(seed_folder: Path, name: str) -> Optional[Path]:
    """The first session's timeline file `name` of the seed (None when no session streamed it)."""
    return next((f / name for f in session_folders(seed_folder) if (f / name).is_file()), None)


def common_session(seed_folder: Path, *names: str) -> Optional[Path]:
    """The first session folder that streamed every one of `names` (None when none did)."""
    return next((f for f in session_folders(seed_folder) if all((f / n).is_file() for n in names)), None)
