"""The training corpus: the Python standard library's own sources, split by a hash of each path.

Every machine that runs glmlab has the corpus: the ``Lib/`` directory of the running interpreter
(PSF licence). A file belongs to a split by the SHA-256 of its POSIX path relative to ``Lib/``
(``json/decoder.py``), so the same path lands in the same split on every Python version: a
module edited between 3.11 and 3.12 can never be trained on in one and evaluated in the other.
Buckets 0..9 of 1000 are validation, 10..19 test, the rest train.

Interpreters differ (the GPU machine runs 3.12, CI 3.11), so the evaluation text is committed:
``data/corpus/{val,test}/<path>.txt`` hold the validation and test files of the interpreter that
built the corpus, and ``data/corpus/manifest.json`` lists every file of every split with its
SHA-256 and size. Evaluation reads the committed text (the same bytes everywhere); training reads
the train split of whatever interpreter it runs on and records the files it used (path, hash) in
its run directory. Files that are not UTF-8, or larger than ``MAX_FILE_BYTES`` (generated data
such as ``pydoc_data/topics.py``), are left out.

This module knows files and bytes only; tokens belong to ``glmlab.train.tokens``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "val", "test")
MAX_FILE_BYTES = 200_000
VAL_BUCKETS, TEST_BUCKETS = 10, 10  # of 1000
REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = REPO_ROOT / "data" / "corpus"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class SourceFile:
    path: str  # POSIX path relative to the stdlib root
    split: str
    sha256: str
    num_bytes: int


def stdlib_root() -> Path:
    """``Lib/`` of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(path: str) -> str:
    """train / val / test for a relative POSIX path (depends on the path only)."""
    bucket = int.from_bytes(hashlib.sha256(path.encode()).digest()[:8], "big") % 1000
    if bucket < VAL_BUCKETS:
        return "val"
    return "test" if bucket < VAL_BUCKETS + TEST_BUCKETS else "train"


def scan(root: Path | None = None) -> list[SourceFile]:
    """Every usable ``*.py`` under ``root`` (default: the stdlib), sorted by path."""
    root = root or stdlib_root()
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if {"site-packages", "__pycache__"} & set(rel.parts):
            continue
        data = p.read_bytes()
        if len(data) > MAX_FILE_BYTES or not _is_utf8(data):
            continue
        path = rel.as_posix()
        out.append(SourceFile(path, split_of(path), hashlib.sha256(data).hexdigest(), len(data)))
    return out


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def write_corpus(out: Path = CORPUS_DIR, root: Path | None = None) -> dict:
    """Write the manifest and the committed validation/test text; returns the manifest."""
    root = root or stdlib_root()
    files = scan(root)
    for split in ("val", "test"):
        for f in files:
            if f.split == split:
                dest = out / split / (f.path + ".txt")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes((root / f.path).read_bytes())
    manifest = {
        "source": "Lib/ of CPython (PSF licence), *.py, UTF-8, at most "
                  f"{MAX_FILE_BYTES} bytes",
        "python": sys.version.split()[0],
        "split_rule": f"sha256(relative POSIX path)[:8] big-endian % 1000: < {VAL_BUCKETS} val, "
                      f"< {VAL_BUCKETS + TEST_BUCKETS} test, else train",
        "files": [vars(f) for f in files],
    }
    out.mkdir(parents=True, exist_ok=True)
    head = json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=1)[:-2]
    rows = ",\n".join("  " + json.dumps(f) for f in manifest["files"])
    (out / MANIFEST).write_text(f'{head},\n "files": [\n{rows}\n ]\n}}\n')  # a file a line
    return manifest


def read_manifest(corpus: Path = CORPUS_DIR) -> list[SourceFile]:
    path = corpus / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no corpus manifest at {path} (glmlab train corpus writes it)")
    return [SourceFile(**f) for f in json.loads(path.read_text())["files"]]


def split_files(split: str, corpus: Path = CORPUS_DIR) -> list[Path]:
    """The committed text files of the ``val`` or ``test`` split, checked against the manifest."""
    if split not in ("val", "test"):
        raise ValueError(f"only val and test text is committed, not {split!r}")
    out = []
    for f in read_manifest(corpus):
        if f.split != split:
            continue
        path = corpus / split / (f.path + ".txt")
        if not path.is_file():
            raise FileNotFoundError(f"{path} is listed in the manifest but missing")
        if hashlib.sha256(path.read_bytes()).hexdigest() != f.sha256:
            raise ValueError(f"{path} differs from the manifest's sha256 {f.sha256[:12]}")
        out.append(path)
    return out


def train_texts(root: Path | None = None) -> tuple[list[str], list[SourceFile]]:
    """Texts of the train split of this interpreter's stdlib, and what was read (path, hash)."""
    root = root or stdlib_root()
    files = [f for f in scan(root) if f.split == "train"]
    return [read_text(root / f.path) for f in files], files


def read_text(path: Path) -> str:
    """The file's exact text (no newline translation: bits per byte count the real bytes)."""
    return path.read_bytes().decode("utf-8")
