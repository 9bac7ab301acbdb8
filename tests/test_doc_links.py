"""Every relative link in the committed markdown (README, docs/, results/) points at a committed file or folder.

Why: results are claims, and a claim's source must travel with the repository. A file that exists on the author's
disk but is ignored by git (a study's `runs/` once was) passes any check that reads the disk and is missing from
every clone."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing says which files are committed")
    return subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")


def broken_links(tracked: list[str], read) -> list[tuple[str, str]]:
    """(markdown file, link) for each relative link whose target is neither a tracked file nor a folder of one."""
    files = set(tracked)
    folders = {str(parent) for f in files for parent in Path(f).parents}
    out = []
    for md in sorted(f for f in files if f.endswith(".md")):
        for link in LINK.findall(read(md)):
            if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", link):  # https:, mailto:, ...
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(md), link))
            if target not in files and target not in folders:
                out.append((md, link))
    return out


def test_the_checker_finds_a_link_to_an_uncommitted_file():
    pages = {"results/x/README.md": "[table](table.md) [run](runs/a/report.json) [site](https://example.org) "
                                    "[up](../../docs/) [anchor](table.md#rows)",
             "results/x/table.md": "", "docs/page.md": "[back](../results/x/missing.png)"}
    assert broken_links(list(pages), pages.__getitem__) == [("docs/page.md", "../results/x/missing.png"),
                                                           ("results/x/README.md", "runs/a/report.json")]


def test_every_relative_link_in_the_committed_markdown_is_committed():
    tracked = [f for f in _tracked() if f]
    bad = broken_links(tracked, lambda f: (REPO / f).read_text(errors="replace") if (REPO / f).is_file() else "")
    assert not bad, "links to files that are not committed:\n" + "\n".join(f"{md}: {link}" for md, link in bad)
