"""A prepared data version on disk, opened only after its manifest verifies.

Layout of `data/cache/<version>/`:

    tokenizer/tokenizer.json            the tokenizer (part of the version)
    sources/<name>/train.tokens.bin     token ids, raw uint16/uint32 (np.memmap)
    sources/<name>/train.index.npy      int64 document offsets into the tokens, n_docs + 1
    sources/<name>/eval.tokens.bin      the held-out split, same format
    sources/<name>/eval.index.npy
    stats.json                          per-source statistics and profiles
    prep.json                           version, parameters, inputs, token dtype
    manifest.json                       sha256 and size of every file above, written last

A directory without a manifest, or whose files do not match it, does not exist as far
as any reader is concerned: `PreparedData.open` raises `DataError` and `prepare_data`
rebuilds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from validation.errors import DataError
from validation.files import atomic_write_json, sha256_file

MANIFEST = "manifest.json"
SPLITS = ("train", "eval")


def write_manifest(root: Path, version: str) -> dict[str, Any]:
    """Hash every file under `root` and write `manifest.json` (the marker, so: last)."""
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        rel = path.relative_to(root).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    manifest = {"version": version, "files": files}
    atomic_write_json(root / MANIFEST, manifest, indent=1)  # the marker: whole or absent
    return manifest


def verify_manifest(root: Path) -> dict[str, Any]:
    """Check every file against the manifest (sizes first, then sha256); return the manifest."""
    where = f"prepared data at {root}"
    try:
        manifest = json.loads((root / MANIFEST).read_text())
        files = manifest["files"]
        version = manifest["version"]
    except FileNotFoundError as exc:
        raise DataError(f"{where} has no {MANIFEST} (incomplete preparation)") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{where}: {MANIFEST} is unreadable ({exc})") from exc
    if version != root.name:
        raise DataError(f"{where}: manifest is for version {version}, directory is {root.name}")
    for rel, entry in files.items():
        path = root / rel
        if not path.is_file() or path.stat().st_size != entry["size"]:
            raise DataError(f"{where}: {rel} is missing or has the wrong size (corrupt cache)")
    for rel, entry in files.items():
        if sha256_file(root / rel) != entry["sha256"]:
            raise DataError(f"{where}: {rel} does not match its sha256 in {MANIFEST} (corrupt cache)")
    return manifest


@dataclass
class PreparedData:
    """Read access to one verified data version: token memmaps, document offsets, stats."""

    path: Path
    version: str
    sources: list[str]
    vocab_size: int
    tokenizer_path: Path
    stats: dict[str, dict[str, Any]]
    params: dict[str, Any]
    token_dtype: np.dtype
    cache_hit: bool = False
    _arrays: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: Path, verify: bool = True) -> PreparedData:
        """Open `data/cache/<version>/`; with `verify`, every file is checked against the manifest."""
        path = Path(path).resolve()
        if not path.is_dir():
            raise DataError(f"prepared data not found at {path}; run `pipeline data prepare` first")
        if verify:
            verify_manifest(path)
        elif not (path / MANIFEST).is_file():
            raise DataError(f"prepared data at {path} has no {MANIFEST} (incomplete preparation)")
        prep = json.loads((path / "prep.json").read_text())
        stats = json.loads((path / "stats.json").read_text())
        return cls(
            path=path,
            version=prep["version"],
            sources=list(prep["sources"]),
            vocab_size=int(prep["vocab_size"]),
            tokenizer_path=path / "tokenizer" / "tokenizer.json",
            stats=stats["sources"],
            params=prep,
            token_dtype=np.dtype(prep["token_dtype"]),
        )

    def _load(self, source: str, split: str) -> tuple[np.ndarray, np.ndarray]:
        if source not in self.sources:
            raise DataError(f"source '{source}' is not in prepared data {self.version} (has: {', '.join(self.sources)})")
        assert split in SPLITS, split
        key = (source, split)
        if key not in self._arrays:
            base = self.path / "sources" / source
            offsets = np.load(base / f"{split}.index.npy")
            tokens_path = base / f"{split}.tokens.bin"
            if tokens_path.stat().st_size == 0:
                tokens = np.zeros(0, dtype=self.token_dtype)
            else:
                tokens = np.memmap(tokens_path, dtype=self.token_dtype, mode="r")
            assert offsets[-1] == tokens.size, f"index and tokens disagree for {source}/{split}"
            self._arrays[key] = (tokens, offsets)
        return self._arrays[key]

    def tokens(self, source: str, split: str = "train") -> np.ndarray:
        """All token ids of one split of a source, documents back to back (a read-only memmap)."""
        return self._load(source, split)[0]

    def offsets(self, source: str, split: str = "train") -> np.ndarray:
        """Document boundaries: document i is `tokens[offsets[i]:offsets[i + 1]]`."""
        return self._load(source, split)[1]

    def documents(self, source: str, split: str = "train") -> int:
        return int(self.offsets(source, split).size - 1)

    def bytes_per_token(self, source: str) -> float:
        """UTF-8 bytes per token of the held-out split (train split if none is held out), for bits-per-byte."""
        return float(self.stats[source]["bytes_per_token"])

    @cached_property
    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))
