"""The launch plan: what trusted code decided before any PR code runs, as data.

The trusted `plan` job (pipelines/trusted/registry.py, default-branch code) writes it; the GPU
job reads it (`PIPELINE_LAUNCH_PLAN`) to train on the plan's seeds and reuse only the runs it
names; the attest job reads the plan job's own output again, never a copy the training job
could have touched. This module holds only the data types, so the training side imports
nothing of the trusted package.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from basics.errors import UsageError

PLAN_ENV = "PIPELINE_LAUNCH_PLAN"
CONFIRMATORY, EXPLORATORY, PILOT = "confirmatory", "exploratory", "pilot"


# --------------------------------------------------------------------------- the plan (data)


@dataclass(frozen=True)
class ExperimentPlan:
    """What trusted code decided for one experiment of a launch."""

    experiment: str
    claim: str
    kind: str
    """confirmatory (decides the claim), exploratory (shown, decides nothing) or pilot."""
    seeds: tuple[int, ...]
    """The seeds the candidate (and its paired baseline) train on."""
    registration: dict[str, Any] | None
    """The claim's confirmatory registration: the one in force, or (new=True) the one this launch makes."""
    new_registration: bool = False
    reuse: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """role (baseline, candidate) -> attested MLflow training run ids the job may reuse."""
    reason: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    """What trusted code computed at the commit: `code_tree`, and per role its `code_version`
    and `spec_hash` (the attest job checks the trained runs' identities against them)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seeds": list(self.seeds), "reuse": {k: list(v) for k, v in self.reuse.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentPlan:
        return cls(experiment=str(data["experiment"]), claim=str(data["claim"]), kind=str(data["kind"]),
                   seeds=tuple(int(s) for s in data["seeds"]), registration=data.get("registration"),
                   new_registration=bool(data.get("new_registration")),
                   reuse={str(k): tuple(str(r) for r in v) for k, v in (data.get("reuse") or {}).items()},
                   reason=str(data.get("reason", "")), facts=dict(data.get("facts") or {}))


@dataclass(frozen=True)
class LaunchPlan:
    sha: str
    pr: int
    created_at_s: float
    experiments: tuple[ExperimentPlan, ...]

    def for_experiment(self, name: str) -> ExperimentPlan | None:
        return next((e for e in self.experiments if e.experiment == name), None)

    def reusable_runs(self) -> set[str]:
        """Every MLflow run id any experiment of the plan may reuse."""
        return {r for e in self.experiments for ids in e.reuse.values() for r in ids}

    def to_json(self) -> str:
        return json.dumps({"sha": self.sha, "pr": self.pr, "created_at_s": self.created_at_s,
                           "experiments": [e.to_dict() for e in self.experiments]}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LaunchPlan:
        data = json.loads(text)
        return cls(sha=str(data["sha"]), pr=int(data["pr"]), created_at_s=float(data["created_at_s"]),
                   experiments=tuple(ExperimentPlan.from_dict(e) for e in data["experiments"]))


def launch_plan(environ: Mapping[str, str] | None = None) -> LaunchPlan | None:
    """The plan the GPU job was given (`PIPELINE_LAUNCH_PLAN`), or None (a laptop: no plan)."""
    path = (os.environ if environ is None else environ).get(PLAN_ENV)
    if not path:
        return None
    try:
        return LaunchPlan.from_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not a launch plan ({PLAN_ENV}): {exc}") from None
