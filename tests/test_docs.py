"""The project documents itself: no file points at design notes users do not have, and the
links and section pointers into ``docs/`` resolve."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

#: names of the design notes the project was written from, which are not part of it
DESIGN_NOTES = re.compile(r"ARCHITECTURE\.md|ALGORITHMS\.md|DASK-NOTES|\bANCHORS\b|shared/design")
#: a pointer to a docs page, optionally with an anchor or a quoted section title after it:
#: ``docs/algorithms.md, "Independent sparsification"`` or ``docs/architecture.md#layers``
POINTER = re.compile(r"""docs/([\w.-]+\.md)(?:#([\w-]+))?(?:,\s*(?:section\s+)?["']([^"'\n]+)["'])?""")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def read_text(path: Path) -> str | None:
    """The file's text, or None for a binary (or missing) file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def prose_lines(text: str):
    """``(line number, line)`` of a Markdown text outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: formatting and punctuation dropped, lower case, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # a link keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> dict[str, str]:
    """``{anchor: heading text}`` of a Markdown file (repeated anchors get -1, -2, ...)."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[base if n == 0 else f"{base}-{n}"] = re.sub(r"`", "", m.group(2)).strip()
    return out


def without_code_and_math(line: str) -> str:
    """A line with its inline code and math spans removed (they may hold ``](``)."""
    return re.sub(r"\$[^$]*\$", "", re.sub(r"`[^`]*`", "", line))


def test_docs_pages_exist():
    for name in ("README.md", "architecture.md", "algorithms.md"):
        assert (DOCS / name).is_file(), f"docs/{name} is missing"


def test_no_file_refers_to_the_design_notes():
    """Users of dmp do not have the design notes: the project's files point to docs/."""
    found = []
    for rel in tracked_files():
        if rel == THIS:
            continue
        text = read_text(ROOT / rel)
        if text is None:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            m = DESIGN_NOTES.search(line)
            if m:
                found.append(f"{rel}:{i}: {m.group(0)}: {line.strip()[:100]}")
    assert not found, ("files refer to design notes that are not part of the project (point to "
                       "docs/ instead):\n" + "\n".join(found))


def test_docs_links_resolve():
    """Every relative link of a docs page names an existing file, and its anchor a heading."""
    broken = []
    for page in sorted(DOCS.glob("*.md")):
        for i, line in prose_lines(page.read_text(encoding="utf-8")):
            for target in LINK.findall(without_code_and_math(line)):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                where = f"docs/{page.name}:{i}: {target}"
                if not dest.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in headings(dest):
                    broken.append(f"{where}: no heading with that anchor in {dest.name}")
    assert not broken, "broken links in docs/:\n" + "\n".join(broken)


def test_pointers_into_docs_resolve():
    """A file that points to ``docs/<page>.md`` (with an anchor or a quoted section title)
    names a page and a section that exist."""
    broken = []
    for rel in tracked_files():
        if rel == THIS:
            continue
        text = read_text(ROOT / rel)
        if text is None:
            continue
        # a pointer may be wrapped over two lines of a comment or docstring
        flat = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)
        for page, anchor, title in POINTER.findall(flat):
            dest = DOCS / page
            if not dest.is_file():
                broken.append(f"{rel}: docs/{page} does not exist")
                continue
            heads = headings(dest)
            if anchor and anchor not in heads:
                broken.append(f"{rel}: docs/{page}#{anchor}: no such heading")
            if title and title.strip() not in heads.values():
                broken.append(f"{rel}: docs/{page}, {title!r}: no section of that title")
    assert not broken, "pointers into docs/ that do not resolve:\n" + "\n".join(broken)


def test_slug_follows_github():
    assert slug("How it works: schedule / push / pull") == "how-it-works-schedule--push--pull"
    assert slug("What `dmp run pipelines/lasso.yaml` does") == "what-dmp-run-pipelineslassoyaml-does"
    assert slug("ParMAC: what dmp does differently") == "parmac-what-dmp-does-differently"
