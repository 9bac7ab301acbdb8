"""Run one benchmark's child mode in a fresh subprocess that imports the project from a given tree.

The before/after benchmarks (shared_prompt_kv.py, handoff_eval.py) compare a checkout of an earlier commit
(`git worktree add --detach /tmp/before <commit>`) with this one: each side is the same script's `--child` run
with PYTHONPATH and the working directory set to its tree, and reports one JSON line, to which the tree's
commit and whether it had uncommitted changes are added.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional


def git_state(tree: Path) -> dict:
    """The tree's commit and whether tracked files differ from it."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def run_side(script: str, tree: Path, child_args: list[str], threads: int) -> dict:
    """`python script --child --tree TREE child_args...` importing from `tree`; its last stdout line as JSON."""
    cmd = [sys.executable, script, "--child", "--tree", str(tree), *child_args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree, check=False)
    if proc.returncode:
        raise RuntimeError(f"{tree}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), **git_state(tree)}


def add_arguments(parser: argparse.ArgumentParser, root: Path) -> None:
    """The options every before/after benchmark takes: the other tree, threads, output folder, and the hidden
    child-mode flags."""
    parser.add_argument("--before", type=Path, help="a checkout of the commit to compare against")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=root, help=argparse.SUPPRESS)


def parse_or_run_child(parser: argparse.ArgumentParser, argv: Optional[list[str]],
                       child: Callable[[argparse.Namespace], dict]) -> Optional[argparse.Namespace]:
    """Parse; in child mode print `child(args)` as one JSON line and return None, else require --before."""
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return None
    if args.before is None:
        parser.error("--before is required")
    return args


def machine_and_date() -> dict:
    return {"machine": {"uname": " ".join(platform.uname()), "cpus": os.cpu_count()},
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
