"""The `extends:` chain of an experiment file, merged into one document that keeps provenance.

Each file names at most one base by a relative path that stays in the experiments directory
(or the validated file's own); bases are read nearest first, checked for cycles and depth,
and deep-merged (mappings merge, lists replace). Every value keeps the file it came from,
so an error in a base is reported in the base.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from basics.paths import EXPERIMENTS_DIR
from validation.spec import ARCHITECTURES, OPTIMIZERS
from validation.yaml_source import CONTROL_CHARS, Loc, LocatedDoc, Report, display_path, parse_file, short

MAX_EXTENDS_DEPTH = 5
"""`extends:` hops from the file being validated to the root of its chain."""


def read_chain(top: Path, repo_root: Path, report: Report) -> LocatedDoc | None:
    """`top` merged over its bases, or None (after reporting why) when any file of the chain is unusable."""
    return _ChainReader(top, repo_root, report).read(top, [top.resolve()])


def deep_merge(base: Any, override: Any) -> Any:
    """Mappings merge key by key; anything else (lists, scalars, null) in `override` replaces.

    A plug-in section (`model`, `train.optimizer`) whose discriminator the override changes
    (`model_type: gpt2` over a llama base) keeps only the inherited keys both plug-ins read the
    same way, i.e. declared by the same class (`hidden_size`, declared by `Architecture`): the
    llama base's `intermediate_size: 384` (a SwiGLU width, declared by the Llama family) does
    not become GPT-2's MLP width (declared by gpt2's own Config), and `num_kv_heads` is not an
    error of a file that switched to an architecture without it. The plan's diff against the
    base shows each dropped key (`384 -> None`). Keys the override itself sets are always kept."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key in ("model_type", "name"):
            if key in override and key in base and override[key] != base[key]:
                shared = _shared_fields(key, base[key], override[key])
                if shared is not None:
                    merged = {k: v for k, v in base.items() if k in shared}
        for key, value in override.items():
            merged[key] = deep_merge(merged[key], value) if key in merged else value
        return merged
    return override


def _shared_fields(key: str, before: Any, after: Any) -> set[str] | None:
    """Fields of plug-in `after` that plug-in `before` declares in the very same class (so reads
    the same way), for an architecture (`model_type`) or optimizer (`name`). Only the new
    plug-in's own fields when the old one is unknown; None when the new one is unknown (its
    error is reported as it is)."""
    table: dict[str, Any] = ARCHITECTURES if key == "model_type" else OPTIMIZERS
    new = table.get(after) if isinstance(after, str) else None
    if new is None:
        return None
    old = table.get(before) if isinstance(before, str) else None
    if old is None:
        return set(new.model_fields)
    return {name for name in new.model_fields if name in old.model_fields
            and _declared_by(new, name) is _declared_by(old, name)}


def _declared_by(config: type, name: str) -> type | None:
    """The class of `config`'s hierarchy whose own annotations declare field `name` last."""
    return next((c for c in config.__mro__ if name in vars(c).get("__annotations__", {})), None)


class _ChainReader:
    """One chain read: the file being validated, its repository, where problems go."""

    def __init__(self, top: Path, repo_root: Path, report: Report):
        self.top = top
        self.repo_root = repo_root
        self.report = report
        self.top_extends_loc = Loc(display_path(top), 1, 1)

    def read(self, path: Path, stack: list[Path]) -> LocatedDoc | None:
        doc = parse_file(path, self.report)
        if doc is None:
            return None
        extends = doc.data.get("extends")
        if extends is None:
            return doc
        where = doc.locs[("extends",)]
        if not isinstance(extends, str) or not extends.strip():
            # Without its base the file cannot be checked further; one clear line beats a dozen.
            self.report(
                where.file, where.line, where.col, "extends", "must be one relative path to a .yaml file"
            )
            return None
        target = self.resolve_extends(extends, path, where)
        if target is None:
            return None
        if target in stack:
            names = " -> ".join(p.name for p in [*stack, target])
            self.add_chain_issue(f"extends cycle: {names}")
            return None
        if len(stack) > MAX_EXTENDS_DEPTH:
            names = " -> ".join(p.name for p in [*stack, target])
            self.add_chain_issue(f"extends chain deeper than {MAX_EXTENDS_DEPTH} files: {names}")
            return None
        base = self.read(target, [*stack, target])
        if base is None:
            return None
        # A base's own name and extends describe the base, never the file extending it.
        base_data = {k: v for k, v in base.data.items() if k not in ("extends", "name")}
        merged = deep_merge(base_data, doc.data)
        return LocatedDoc(
            data=merged,
            locs={**base.locs, **doc.locs},
            key_locs={**base.key_locs, **doc.key_locs},
            poisoned=base.poisoned | doc.poisoned,
            chain=[path, *base.chain],
        )

    def add_chain_issue(self, message: str) -> None:
        """Chain-shaped problems are reported on the extends line of the file being validated."""
        where = self.top_extends_loc
        self.report(where.file, where.line, where.col, "extends", message)

    def resolve_extends(self, value: str, path: Path, where: Loc) -> Path | None:
        if path.resolve() == self.top.resolve():
            self.top_extends_loc = where
        if CONTROL_CHARS.search(value):
            self.report(where.file, where.line, where.col, "extends", "contains control characters")
            return None
        if not value.endswith((".yaml", ".yml")):
            self.report(
                where.file, where.line, where.col, "extends", f"must name a .yaml file, got {short(value)}"
            )
            return None
        if os.path.isabs(value):
            self.report(where.file, where.line, where.col, "extends", "must be a path relative to this file")
            return None
        try:
            target = (path.parent / value).resolve()
        except (OSError, RuntimeError) as exc:
            self.report(where.file, where.line, where.col, "extends", f"cannot resolve {short(value)}: {exc}")
            return None
        allowed = [(self.repo_root / EXPERIMENTS_DIR).resolve(), self.top.resolve().parent]
        if not any(target.is_relative_to(root) for root in allowed):
            self.report(
                where.file,
                where.line,
                where.col,
                "extends",
                f"{short(value)} points outside the experiments directory",
            )
            return None
        if not target.is_file():
            self.report(
                where.file, where.line, where.col, "extends",
                f"base file {short(value)} does not exist{_closest_base(value, target)}",
            )
            return None
        return target


def _closest_base(value: str, target: Path) -> str:
    """"; did you mean 'base.yaml'?" for a YAML file in the folder `value` points into whose name
    is close to the one written (written the way `value` writes it, folder included)."""
    folder = target.parent
    if not folder.is_dir():
        return ""
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    close = difflib.get_close_matches(target.name, names, n=1, cutoff=0.6)
    if not close:
        return ""
    prefix = value[: len(value) - len(value.rsplit("/", 1)[-1])]
    return f"; did you mean '{prefix}{close[0]}'?"
