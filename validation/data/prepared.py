"""A prepared data version on disk, opened only after its manifest verifies.

Layout of `data/cache/<version>/`:

    tokenizer/tokenizer.json                    the tokenizer (part of the version)
    sources/<name>/train/<task>.tokens.bin      token ids of one input task, raw uint16/uint32 (np.memmap)
    sources/<name>/train/<task>.index.npy       int64 document offsets into that shard, n_docs + 1
    sources/<name>/eval/<task>.{tokens.bin,index.npy}   the held-out split, same format
    stats.json                                  per-source statistics and profiles
    prep.json                                   version, parameters, inputs, token dtype, shard list
    manifest.json                               sha256 and size of every file above, written last

A split is its shards in task order (= input order), documents back to back: readers
see one logical token array per split (`ShardedTokens`, slices memory-mapped shard by
shard, never concatenated) and one offsets array (built from the small shard indexes).

A directory without a manifest, or whose files do not match it, does not exist as far
as any reader is concerned: `PreparedData.open` raises `DataError` and `prepare_data`
rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from basics.errors import DataError
from basics.files import atomic_write_json, sha256_file

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


PREP_VOLATILE = ("inputs", "tasks")
"""Fields of prep.json that depend on where and how a version was made (absolute input paths,
the number of tasks), not on its bytes: left out of the content digest."""


def content_digest(manifest: dict[str, Any], prep: dict[str, Any]) -> str:
    """The digest of a version's content: sha256 over every file's path, size and sha256 (the
    manifest's `files`) and prep.json's fields that describe the bytes (dtype, vocabulary, shard
    list, version payload). A data version names its inputs; this names what was made from
    them, so a copy rewritten on shared storage (data and manifest together) gets another
    digest, and two preparations of the same inputs on different machines get the same one."""
    files = {rel: {"size": int(e["size"]), "sha256": str(e["sha256"])}
             for rel, e in manifest["files"].items() if rel != "prep.json"}
    described = {k: v for k, v in prep.items() if k not in PREP_VOLATILE}
    body = json.dumps({"files": files, "prep": described}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def verify_manifest(root: Path) -> dict[str, Any]:
    """Check every file against the manifest (sizes first, then sha256); return the manifest."""
    where = f"prepared data at {root}"
    try:
        manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text())
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


class ShardedTokens:
    """The token shards of one split as one read-only array: `size`, `dtype`, slicing with a
    step of 1 (a slice inside one shard is a view of its memmap; across shards, a small copy)."""

    def __init__(self, shards: list[np.ndarray], dtype: np.dtype):
        self.shards = shards
        self.dtype = dtype
        self.starts = np.concatenate([[0], np.cumsum([s.size for s in shards])]).astype(np.int64)
        self.size = int(self.starts[-1])

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice) -> np.ndarray:
        assert isinstance(key, slice) and key.step in (None, 1), key
        lo, hi, _ = key.indices(self.size)
        if hi <= lo:
            return np.zeros(0, dtype=self.dtype)
        first = int(np.searchsorted(self.starts, lo, side="right")) - 1
        last = int(np.searchsorted(self.starts, hi, side="left")) - 1
        if first == last:
            base = int(self.starts[first])
            return self.shards[first][lo - base : hi - base]
        pieces = [self.shards[i][max(lo, int(self.starts[i])) - int(self.starts[i]):
                                 min(hi, int(self.starts[i + 1])) - int(self.starts[i])] for i in range(first, last + 1)]
        return np.concatenate(pieces)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.concatenate(self.shards) if self.shards else np.zeros(0, dtype=self.dtype)
        return whole.astype(dtype) if dtype is not None else whole

    def max(self) -> Any:
        return max(int(s.max()) for s in self.shards if s.size)


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
    content_digest: str = ""
    """sha256 of the version's files as its manifest lists them (`content_digest`)."""
    cache_hit: bool = False
    _arrays: dict[tuple[str, str], tuple[Any, np.ndarray]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, path: Path, verify: bool = True) -> PreparedData:
        """Open `data/cache/<version>/`; with `verify`, every file is checked against the manifest."""
        path = Path(path).resolve()
        if not path.is_dir():
            raise DataError(f"prepared data not found at {path}; run `pipeline data prepare` first")
        if verify:
            manifest = verify_manifest(path)
        elif not (path / MANIFEST).is_file():
            raise DataError(f"prepared data at {path} has no {MANIFEST} (incomplete preparation)")
        else:
            manifest = json.loads((path / MANIFEST).read_text())
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
            content_digest=content_digest(manifest, prep),
        )

    def _shard_list(self, source: str, split: str) -> list[list[Any]]:
        return list(self.params["shards"][source][split])

    def token_shards(self, source: str, split: str = "train") -> list[np.ndarray]:
        """The split's shards in order, each a read-only memmap."""
        base = self.path / "sources" / source / split
        return [np.memmap(base / f"{stem}.tokens.bin", dtype=self.token_dtype, mode="r")
                for stem, _tokens, _docs in self._shard_list(source, split)]

    def _load(self, source: str, split: str) -> tuple[Any, np.ndarray]:
        if source not in self.sources:
            raise DataError(f"source '{source}' is not in prepared data {self.version} (has: {', '.join(self.sources)})")
        assert split in SPLITS, split
        key = (source, split)
        if key not in self._arrays:
            base = self.path / "sources" / source / split
            shards = self.token_shards(source, split)
            parts, at = [np.zeros(1, dtype=np.int64)], 0
            for (stem, _tokens, _docs), shard in zip(self._shard_list(source, split), shards, strict=True):
                index = np.load(base / f"{stem}.index.npy")
                assert index[-1] == shard.size, f"index and tokens disagree for {source}/{split}/{stem}"
                parts.append(index[1:] + at)
                at += shard.size
            offsets = np.concatenate(parts)
            tokens: Any
            if not shards:
                tokens = np.zeros(0, dtype=self.token_dtype)
            elif len(shards) == 1:
                tokens = shards[0]
            else:
                tokens = ShardedTokens(shards, self.token_dtype)
            self._arrays[key] = (tokens, offsets)
        return self._arrays[key]

    def tokens(self, source: str, split: str = "train") -> Any:
        """All token ids of one split of a source, documents back to back: a read-only memmap, or a
        `ShardedTokens` over several (slice it; `np.asarray` of the whole copies it)."""
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
        return Tokenizer.from_file(str(self.tokenizer_path))
