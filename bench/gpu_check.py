"""GPU acceptance in one command: everything the GPU runners will do, checked in one short run.

    make gpu-check-prepare      # here (CPU): data, specs, dry runs, wheels -> data/gpu-check/ (carry it)
    make gpu-check              # there (one CUDA device, its own python3): <= 8 minutes -> JSON + RESULTS.md section

    python bench/gpu_check.py prepare [--profile gpu|rehearsal] [--carry DIR] [--wheels-python 3.12]
    python bench/gpu_check.py run [--carry DIR] [--out DIR] [--append] [--isolation fork|spawn] [--budget-s S]
    python bench/gpu_check.py record OUT_DIR     # back here: the section into bench/RESULTS.md, the JSON into bench/results/

Two phases, because the GPU machine comes rarely, for minutes, bare, with only its own python3
(torch, transformers, accelerate, numpy, pyyaml, tokenizers, safetensors: no pydantic, MLflow,
datatrove, great-expectations, no package registry):

`prepare` (the CPU machine, about two minutes on 2 cores) writes one folder, well under the
64 MiB that may travel: the demo corpus prepared (tokenizer + packed token shards: the trainer
opens it as its --data-dir), every part's spec validated (the memory layouts as the planner
resolves them, the resume run's `spec.resolved.json`), the dry run of each ~1.3B memory layout
(fake tensors: the tracked peak per category beside the analytic plan), and pydantic with its
four dependencies as manylinux wheels for the device's Python, unpacked (the trainer's spec types
need pydantic; nothing else is missing there). `plan.json` lists the parts, their limits and numbers.

`run` (the device) runs every part in its own process with its own time limit, so one failure or
hang leaves the others' figures; a part records its figures as it goes, so one killed at its limit
keeps what it measured. The parts (bench/gpu_check_parts.py): the device and a matmul ceiling;
plan vs a real step for three layouts of a ~1.3B model; kill -9 and a bitwise resume; an export
loaded by transformers with the same logits; throughput and MFU of the trainer (one process, and
FSDP2 over a one-rank NCCL group) beside a bare loop, hand-written FSDP2 and the HF Trainer at ~350M
and ~1.3B (bench/gpu_bench.py); train.compile against eager. The processes are forked from one
interpreter that imported torch and transformers once (the parent never touches CUDA, and checks
that it did not); if the first part cannot use the device from a forked process, the rest start as
fresh interpreters (`--isolation spawn` forces that). The whole run stays inside `--budget-s`
(480 s): each part's limit is cut to what is left after the minimum the later parts need. Goals
(trainer >= 0.97x the bare loop and >= 1.0x HF, MFU >= 40 % at ~1.3B bf16, the plan within 10 % of
the real peak) are recorded beside the figures, never asserted.

The rehearsal (`--profile rehearsal`: tiny models, the CPU, gloo) is the same script and the same
parts; tests/integration/test_gpu_check_rehearsal.py runs it in the suite so it cannot rot
between lendings. bench/README.md says how to run it on the device tool.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpu_check_parts import PARTS, PartContext, clean, run_forked, tail, wait_or_kill, write_json  # noqa: E402

DEFAULT_CARRY = REPO / "data" / "gpu-check"
PLAN_FILE = "plan.json"
FORMAT = 1
BUDGET_S = 480.0
"""The device run's whole budget: 8 minutes (the device tool allows 10 per command, 15 per session)."""
CARRY_LIMIT_BYTES = 48 * 2**20
"""What the prepared folder may weigh: the device takes 64 MiB with the working tree."""
ABSENT_ON_DEVICE = ("mlflow", "datatrove", "great_expectations", "lm_eval")
"""Packages the GPU machine does not have: made unimportable in every run, so the rehearsal fails
where the device would."""
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
"""Carried for the device (manylinux wheels, unpacked); typing-extensions because pydantic needs a
newer one than torch's."""
GOALS = {"trainer/bare": 0.97, "trainer/hf": 1.0, "mfu_large": 0.40, "plan_within": 0.10}
"""Recorded beside the figures (issue 41), not asserted."""

LLAMA = {"model_type": "llama", "attn_implementation": "sdpa"}
DEMO_WEIGHTS = (("code", 0.4), ("docs", 0.4), ("reference", 0.2))
MEMORY_LAYOUTS = {"none": ({"dp": 1}, "none"), "fsdp-selective": ({"dp": 1, "fsdp": True}, "selective"),
                  "fsdp-full": ({"dp": 1, "fsdp": True}, "full")}
"""The three ~1.3B layouts whose memory the plan predicts: no sharding; FSDP with selective
activation checkpointing; FSDP with full. (On one device the trainer does not shard: the FSDP
layouts differ by their checkpointing, which the plan, the dry run and the real step all see.)"""

PROFILES: dict[str, dict[str, Any]] = {
    "gpu": {
        "device": "cuda", "precision": "bf16", "budget_s": BUDGET_S, "corpus_bytes": None, "tokenizer_vocab": 8192,
        "resource": {"gpus_per_node": 1, "gpu_type": "h200", "gpu_memory_gb": 139},
        "models": {
            "mid": {"hidden_size": 1024, "num_layers": 24, "num_heads": 16, "intermediate_size": 2816,
                    "vocab_size": 32000, "seq": 2048, "micro": 8},
            "large": {"hidden_size": 2048, "num_layers": 24, "num_heads": 16, "intermediate_size": 5632,
                      "vocab_size": 32000, "seq": 2048, "micro": 8},
            "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 688,
                      "vocab_size": 8192, "seq": 512, "micro": 8},
        },
        "throughput": {"mid": {"steps": 24, "every": 4, "repeats": 3}, "large": {"steps": 16, "every": 4, "repeats": 2}},
        "memory_steps": 3, "compile": {"steps": 24, "every": 4, "backend": "inductor"},
        "resume": {"steps": 12, "checkpoint_interval": 4, "kill_at": 6}, "export_steps": 4, "matmul_n": 8192,
        # part: (limit s, minimum s); limits add up past the budget: the run cuts them to what is left
        "limits": {"device": (60, 10), "memory": (50, 20), "resume": (60, 20), "export": (50, 15),
                   "throughput-mid": (110, 40), "throughput-large": (160, 50), "compile": (110, 40)},
        "wheels_python": "3.12",  # the GPU machine's python3 (3.12.3 when last seen)
    },
    "rehearsal": {
        "device": "cpu", "precision": "bf16", "budget_s": 150.0, "corpus_bytes": 60_000, "tokenizer_vocab": 512,
        "resource": {"cpu_processes": 1, "gpu_memory_gb": 16},
        "models": {
            "mid": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128,
                    "vocab_size": 512, "seq": 64, "micro": 4},
            "large": {"hidden_size": 96, "num_layers": 2, "num_heads": 4, "intermediate_size": 192,
                      "vocab_size": 512, "seq": 64, "micro": 4},
            "small": {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64,
                      "vocab_size": 512, "seq": 32, "micro": 4},
        },
        "throughput": {"mid": {"steps": 6, "every": 2, "repeats": 2}, "large": {"steps": 4, "every": 2, "repeats": 1}},
        "memory_steps": 2, "compile": {"steps": 4, "every": 2, "backend": "aot_eager"},
        "resume": {"steps": 6, "checkpoint_interval": 2, "kill_at": 3}, "export_steps": 2, "matmul_n": 256,
        "limits": {"device": (60, 5), "memory": (60, 5), "resume": (60, 5), "export": (60, 5),
                   "throughput-mid": (60, 5), "throughput-large": (60, 5), "compile": (60, 5)},
        "wheels_python": None,
    },
}
"""`gpu`: the acceptance run on one CUDA device. `rehearsal`: the same parts with tiny models on a
CPU (gloo), in the test suite: only the device and the numbers differ."""

COMPILE_TOLERANCE = {"first": 0.01, "any": 0.05}
"""train.compile vs eager in bf16: the first step's loss (same weights, same rows: only the
kernels differ) within 0.01, every step's within 0.05 (the runs drift apart as they train)."""
EXPORT_TOLERANCE = {"fp32": 1e-4, "as_trained": 0.05}
"""Logits of the export loaded by transformers: in fp32 against the trainer's weights in the
architecture's own class, within 1e-4; against the trainer's model as it runs (its autocast) under
the same autocast, within 0.05 (bf16 rounding of a logit of magnitude ~10)."""


# ----------------------------------------------------------------------------- prepare


def experiment(name: str, model: dict[str, Any], profile: dict[str, Any], **train: Any) -> dict[str, Any]:
    """A part's spec as data: the demo mixture, the profile's device and precision."""
    fields = {k: v for k, v in model.items() if k not in ("seq", "micro")}
    return {
        "name": name, "owner": "ml-platform",
        "hypothesis": {"statement": "The trainer does on one GPU what the CPU processes proved it does.",
                       "metric": "perf/tokens_per_s", "direction": "increase", "min_effect": 0.01,
                       "baseline": "champion"},
        "model": LLAMA | fields | {"max_position_embeddings": model["seq"]},
        "data": {"sources": [{"name": n, "path": f"data/demo/{n}.jsonl", "weight": w} for n, w in DEMO_WEIGHTS],
                 "seq_len": model["seq"], "tokenizer": {"vocab_size": profile["tokenizer_vocab"]}},
        "train": {"micro_batch_size": model["micro"], "precision": profile["precision"], "lr": 3e-4,
                  "warmup_steps": 2, "eval_interval": 10**6, "checkpoint_interval": 10**6, "eval_batches": 1} | train,
        "resource": dict(profile["resource"]),
    }


def part_specs(profile: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every part's spec (data, validated later), by key."""
    m = profile["models"]
    specs: dict[str, dict[str, Any]] = {}
    for role, t in profile["throughput"].items():
        specs[f"throughput-{role}"] = experiment(f"gpu-check-{role}", m[role], profile, max_steps=t["steps"],
                                                 log_interval=t["every"], deterministic=False)
    for layout, (parallel, checkpointing) in MEMORY_LAYOUTS.items():
        specs[f"memory-{layout}"] = experiment("gpu-check-memory", m["large"], profile, max_steps=profile["memory_steps"],
                                               log_interval=1, activation_checkpointing=checkpointing) | {
            "parallel": parallel}
    c = profile["compile"]
    specs["compile"] = experiment("gpu-check-compile", m["mid"], profile, max_steps=c["steps"], log_interval=c["every"],
                                  deterministic=False)
    r = profile["resume"]
    specs["resume"] = experiment("gpu-check-resume", m["small"], profile, max_steps=r["steps"], log_interval=1,
                                 checkpoint_interval=r["checkpoint_interval"], keep_last=3)
    specs["export"] = experiment("gpu-check-export", m["small"], profile, max_steps=profile["export_steps"],
                                 log_interval=1)
    return specs


def part_list(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts in running order: the device first (it is the fork check), the cheap correctness
    parts next, throughput, compile (whose compile time is the least known) last."""
    lim = profile["limits"]

    def part(name: str, kind: str, limit: str, **args: Any) -> dict[str, Any]:
        return {"name": name, "kind": kind, "limit_s": lim[limit][0], "min_s": lim[limit][1], "args": args}

    parts = [part("device", "device", "device", matmul_n=profile["matmul_n"])]
    parts += [part(f"memory-{layout}", "memory", "memory", layout=layout) for layout in MEMORY_LAYOUTS]
    parts.append(part("resume", "resume", "resume", kill_at=profile["resume"]["kill_at"]))
    parts.append(part("export", "export", "export", tolerance=EXPORT_TOLERANCE))
    for role in profile["throughput"]:
        parts.append(part(f"throughput-{role}", "throughput", f"throughput-{role}", role=role,
                          systems=["bare", "fsdp2", "trainer", "trainer_fsdp", "hf"],
                          repeats=profile["throughput"][role]["repeats"]))
    parts.append(part("compile", "compile", "compile", backend=profile["compile"]["backend"],
                      tolerance=COMPILE_TOLERANCE))
    return parts


def prepare(profile_name: str, carry: Path, wheels_python: str | None = None, log: Any = print) -> dict[str, Any]:
    """Write the folder the device run needs (module doc). Returns the plan. `wheels_python`: the
    Python the carried wheels are for (default: the profile's, 3.12 for the GPU machine; the
    rehearsal carries none unless told)."""
    from basics.environment import apply_offline_env

    apply_offline_env()
    profile = PROFILES[profile_name]
    carry = carry.resolve()
    shutil.rmtree(carry, ignore_errors=True)
    carry.mkdir(parents=True)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    specs = part_specs(profile)
    data_dir = _prepare_data(profile, specs["throughput-mid"]["data"], carry / "data")
    timings["data_s"] = time.perf_counter() - t0
    log(f"prepare: data version {data_dir.name} in {timings['data_s']:.1f} s")

    from trainer.dry_run import dry_run, planned_spec
    from validation.resolved import resolve_spec
    from validation.spec import ExperimentSpec

    validated = {key: ExperimentSpec.model_validate(spec) for key, spec in specs.items()}
    dry_runs: dict[str, Any] = {}
    for layout in MEMORY_LAYOUTS:
        key = f"memory-{layout}"
        planned, _ = planned_spec(validated[key])  # the layout, micro batch and checkpointing the trainer runs
        specs[key] = planned.model_dump(mode="json")
        t1 = time.perf_counter()
        result = dry_run(validated[key])
        dry_runs[layout] = result.to_dict()
        timings[f"dry_run_{layout}_s"] = time.perf_counter() - t1
        log(f"prepare: dry run {layout}: tracked {result.tracked_bytes / 1e9:.2f} GB, analytic "
            f"{result.analytic_bytes / 1e9:.2f} GB in {timings[f'dry_run_{layout}_s']:.1f} s")
    seed = validated["resume"].train.seed
    resolved = {"resume": json.loads(resolve_spec(validated["resume"], REPO, seeds=[seed]).for_seed(seed).to_json())}

    site = None
    wheels_python = wheels_python or profile["wheels_python"]
    if wheels_python:
        t1 = time.perf_counter()
        site = _carry_wheels(carry / "site", wheels_python)
        timings["wheels_s"] = time.perf_counter() - t1
        log(f"prepare: {len(site['packages'])} wheels for Python {wheels_python} in {timings['wheels_s']:.1f} s")
    plan = {
        "format": FORMAT, "profile": profile_name, "device": profile["device"], "precision": profile["precision"],
        "budget_s": profile["budget_s"], "data_dir": _relative_to(data_dir, carry), "site": site, "specs": specs, "resolved": resolved,
        "dry_runs": dry_runs, "parts": part_list(profile), "goals": GOALS,
        "prepared": {"when": _stamp(), "commit": _commit(), "machine": _machine(), "seconds": timings},
    }
    write_json(carry / PLAN_FILE, plan)
    size = sum(p.stat().st_size for p in carry.rglob("*") if p.is_file())
    plan["prepared"]["bytes"] = size
    write_json(carry / PLAN_FILE, plan)
    if size > CARRY_LIMIT_BYTES:
        raise SystemExit(f"prepare: {carry} holds {size / 2**20:.1f} MiB, over {CARRY_LIMIT_BYTES / 2**20:.0f} MiB")
    log(f"prepare: {carry} ({size / 2**20:.1f} MiB) in {time.perf_counter() - t0:.0f} s; "
        f"on the device: make gpu-check (carry {_relative(carry)})")
    return plan


def _prepare_data(profile: dict[str, Any], data: dict[str, Any], dest: Path) -> Path:
    """The demo corpus prepared with the profile's tokenizer, copied to `dest`/<version> (the
    trainer checks that a prepared folder is named by its version)."""
    from basics.environment import scoped_environ
    from pipelines.dataprep.prepare import prepare_data
    from validation.spec import DataSpec

    spec = DataSpec.model_validate(data)
    if profile["corpus_bytes"] is None:  # the whole demo corpus, through the repository's cache
        from scaffold import prepare_demo

        prepared = prepare_demo(spec)
        shutil.copytree(prepared.path, dest / prepared.path.name)
        return dest / prepared.path.name
    from pipelines.dataprep.demo_corpus import build_demo_corpus

    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-data-"))  # a small corpus of its own
    try:
        build_demo_corpus(scratch / "demo", profile["corpus_bytes"])
        spec = spec.model_copy(update={"sources": [
            s.model_copy(update={"path": str(scratch / "demo" / f"{s.name}.jsonl")}) for s in spec.sources]})
        with scoped_environ(PIPELINE_DATA_ROOTS=str(scratch)):
            prepared = prepare_data(spec, REPO, scratch / "cache", progress=False, workers=1)
        shutil.copytree(prepared.path, dest / prepared.path.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest / prepared.path.name


def _carry_wheels(site: Path, python: str) -> dict[str, Any]:
    """WHEELS at this environment's versions, as manylinux x86-64 wheels for CPython `python`,
    unpacked into `site` (a wheel is a zip of its installed files)."""
    from importlib import metadata

    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    with tempfile.TemporaryDirectory(prefix="gpu-check-wheels-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               python, "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
               "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", tmp, *pins]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise SystemExit(f"prepare: pip download failed:\n{proc.stderr[-3000:]}")
        names = sorted(p.name for p in Path(tmp).glob("*.whl"))
        for wheel in names:
            with zipfile.ZipFile(Path(tmp) / wheel) as zf:
                zf.extractall(site)
    return {"path": "site", "python": python, "packages": pins, "wheels": names}


def _relative_to(path: Path, root: Path) -> str:
    return str(path.resolve().relative_to(root.resolve()))


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _machine() -> dict[str, Any]:
    import platform

    return {"python": platform.python_version(), "cpus": os.cpu_count(), "host": platform.node()}


# ----------------------------------------------------------------------------- run


def setup_interpreter(plan: dict[str, Any], carry: Path) -> str | None:
    """This interpreter as every part needs it: offline, the packages the device lacks made
    unimportable, the carried site first on the path where pydantic is missing and the wheels
    match this Python (and in PYTHONPATH for the processes it starts). Returns the site used."""
    from basics.environment import apply_offline_env

    apply_offline_env()
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() without a CUDA context
    for name in ABSENT_ON_DEVICE:
        if sys.modules.get(name) is not None:
            raise SystemExit(f"gpu_check: {name} was imported, and the GPU machine does not have it")
        sys.modules[name] = None  # type: ignore[assignment]  # `import` fails, find_spec answers None
    site = plan.get("site")
    used = None
    if site and importlib.util.find_spec("pydantic") is None:
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if here != site["python"]:
            raise SystemExit(f"gpu_check: pydantic is missing and the carried wheels are for Python {site['python']}, "
                             f"this is {here}: prepare with --wheels-python {here}")
        used = str(carry / site["path"])
        sys.path.insert(0, used)
    paths = [p for p in (used, str(REPO), os.environ.get("PYTHONPATH")) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    return used


def preimport() -> bool:
    """What every part imports, imported once here so that forked parts start warm. False when an
    import initialised CUDA (a process forked after that cannot use the device)."""
    import accelerate  # noqa: F401
    import gpu_bench  # noqa: F401
    import tokenizers  # noqa: F401
    import torch
    import torch.distributed.fsdp  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401
    from transformers import Trainer as HFTrainer  # noqa: F401

    import trainer.entry  # noqa: F401
    import trainer.loop  # noqa: F401
    import validation.resolved  # noqa: F401

    return not torch.cuda.is_initialized()


def part_main(part: dict[str, Any], plan: dict[str, Any], carry: Path, work: Path, deadline: float) -> int:
    """Body of one part's process: its own process group, output to its log, its figures to its
    result file (an exception is recorded there too). Returns the exit code."""
    if os.getpgid(0) != os.getpid():  # a fresh interpreter is already its session's leader
        os.setpgid(0, 0)
    name = part["name"]
    log = os.open(work / "logs" / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    scratch = work / "parts" / name
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = PartContext(name=name, args=part["args"], plan=plan, carry=carry, work=scratch,
                      result_path=work / "results" / f"{name}.json", deadline=deadline)
    print(f"== {name} ({part['kind']}) pid {os.getpid()}, {deadline - time.monotonic():.0f} s", flush=True)
    try:
        PARTS[part["kind"]](ctx)
        code = 0
    except BaseException as exc:  # noqa: BLE001 - recorded, then the process ends
        traceback.print_exc()
        text = str(exc).strip()
        ctx.record(error=f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def part_timeout(parts: list[dict[str, Any]], index: int, left_s: float) -> float | None:
    """The limit part `index` runs under with `left_s` of the budget left: its own limit, cut to
    what remains after the minimum each later part needs; None (skipped) when that is below its own
    minimum. Pure."""
    part = parts[index]
    timeout = min(float(part["limit_s"]), left_s - sum(float(p["min_s"]) for p in parts[index + 1:]))
    return timeout if timeout >= float(part["min_s"]) else None


def launch(part: dict[str, Any], plan: dict[str, Any], carry: Path, work: Path, timeout: float,
           isolation: str) -> dict[str, Any]:
    """Run one part in its own process (forked, or a fresh interpreter), killed with its process
    group at `timeout`; its status, time and figures."""
    deadline = time.monotonic() + timeout
    result_path = work / "results" / f"{part['name']}.json"
    result_path.unlink(missing_ok=True)
    t0 = time.monotonic()
    if isolation == "fork":
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                code = part_main(part, plan, carry, work, deadline)
            finally:
                os._exit(code)
        code = wait_or_kill(pid, timeout + 2)
    else:
        log = (work / "logs" / f"{part['name']}.log").open("a")
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "part", part["name"], "--carry", str(carry),
             "--work", str(work), "--deadline", repr(deadline)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        try:
            code = proc.wait(timeout + 2)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        log.close()
    seconds = time.monotonic() - t0
    figures = json.loads(result_path.read_text()) if result_path.is_file() else {}
    timed_out = seconds >= timeout and code != 0
    if code == 0 and "error" not in figures:
        status = "ok"
    elif timed_out:
        status = "timeout"
    elif code < 0:
        status = f"killed by signal {-code}"
    else:
        status = "error"
    return {"status": status, "exit": code, "seconds": round(seconds, 1), "limit_s": round(timeout, 1),
            "figures": figures, "log_tail": tail(work / "logs" / f"{part['name']}.log", 400 if status == "ok" else 3000)}


def run(carry: Path, out: Path, isolation: str = "fork", budget_s: float | None = None, append: bool = False,
        only: list[str] | None = None, prepare_profile: str | None = None) -> dict[str, Any]:
    """Every part of the prepared plan, each in its own process; the report written to `out`
    (gpu_check.json, gpu_check.md, gpu_check-logs.tar.gz) and, with `append`, to bench/RESULTS.md.
    `prepare_profile`: prepare `carry` first, in a process forked from this one once it has
    imported what both need (the rehearsal: one interpreter start instead of two)."""
    started = time.monotonic()
    carry = carry.resolve()
    if prepare_profile:
        from basics.environment import apply_offline_env

        apply_offline_env()
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        preimport()
        code = run_forked(lambda: int(prepare(prepare_profile, carry) is None), timeout=900, log=None)
        if code:
            raise SystemExit(f"gpu_check: prepare --profile {prepare_profile} failed (exit {code})")
    plan = json.loads((carry / PLAN_FILE).read_text())
    if plan.get("format") != FORMAT:
        raise SystemExit(f"gpu_check: {carry / PLAN_FILE} is format {plan.get('format')}, this script reads {FORMAT}: "
                         "prepare again")
    site = setup_interpreter(plan, carry)
    notes: list[str] = []
    if not preimport() and isolation == "fork":
        isolation = "spawn"
        notes.append("importing torch and transformers initialised CUDA: every part started as a fresh interpreter")
    import torch

    if plan["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: the plan is for a CUDA device and none is visible "
                         "(the CPU rehearsal: prepare --profile rehearsal)")
    budget = float(budget_s or plan["budget_s"])
    deadline = started + budget
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    for sub in ("logs", "results", "parts"):
        (work / sub).mkdir()
    parts = [p for p in plan["parts"] if not only or p["name"] in only or p["kind"] in only]
    results: dict[str, Any] = {}
    try:
        for i, part in enumerate(parts):
            timeout = part_timeout(parts, i, deadline - time.monotonic())
            if timeout is None:
                results[part["name"]] = {"status": "skipped", "seconds": 0, "limit_s": 0, "figures": {},
                                         "log_tail": "no time left in the budget"}
                continue
            print(f"gpu_check: {part['name']} (limit {timeout:.0f} s, {isolation})", flush=True)
            result = launch(part, plan, carry, work, timeout, isolation)
            if part["kind"] == "device" and isolation == "fork" and result["status"] != "ok":
                notes.append(f"the device part failed in a forked process ({result['status']}): every part then "
                             "started as a fresh interpreter")
                isolation = "spawn"
                timeout = part_timeout(parts, i, deadline - time.monotonic()) or float(part["min_s"])
                result = launch(part, plan, carry, work, timeout, isolation) | {"first_try": result}
            results[part["name"]] = result
            print(f"gpu_check: {part['name']} {result['status']} in {result['seconds']:.0f} s", flush=True)
    finally:
        report = build_report(plan, results, isolation, time.monotonic() - started, budget, site, notes)
        write_json(out / "gpu_check.json", report)
        markdown = render_markdown(report)
        (out / "gpu_check.md").write_text(markdown)
        with tarfile.open(out / "gpu_check-logs.tar.gz", "w:gz") as tar:
            tar.add(work / "logs", arcname="logs")
            for log in sorted((work / "parts").rglob("*.log")):  # the runs a part started itself
                tar.add(log, arcname=f"logs/{log.relative_to(work / 'parts')}")
        shutil.rmtree(work, ignore_errors=True)
    if append:
        append_results(markdown)
    print(markdown)
    return report


# ----------------------------------------------------------------------------- the report


def build_report(plan: dict[str, Any], results: dict[str, Any], isolation: str, seconds: float, budget: float,
                 site: str | None, notes: list[str]) -> dict[str, Any]:
    device = results.get("device", {}).get("figures", {})
    return clean({
        "format": FORMAT, "when": _stamp(), "profile": plan["profile"], "device": device, "isolation": isolation,
        "seconds": round(seconds, 1), "budget_s": budget, "carried_site": site, "notes": notes,
        "prepared": plan.get("prepared"), "parts": results, "goals": goals(plan, results),
    })


def goals(plan: dict[str, Any], results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal of issue 41 with the figure it is judged on and whether it was met (None: not measured)."""
    out: list[dict[str, Any]] = []

    def add(goal: str, value: float | None, met: bool | None) -> None:
        out.append({"goal": goal, "value": value, "met": met if value is not None else None})

    for role in ("mid", "large"):
        figures = results.get(f"throughput-{role}", {}).get("figures", {})
        ratios, systems = figures.get("ratios", {}), figures.get("systems", {})
        size = _size(figures["params"]) if figures.get("params") else role
        for key, floor in (("trainer/bare", GOALS["trainer/bare"]), ("trainer/hf", GOALS["trainer/hf"])):
            value = ratios.get(key)
            add(f"{key} >= {floor:g} ({size})", value, value is not None and value >= floor)
        if role == "large":
            mfu = systems.get("trainer", {}).get("mfu")
            add(f"trainer MFU >= {GOALS['mfu_large']:.0%} ({size}, {plan['precision']})", mfu,
                mfu is not None and mfu >= GOALS["mfu_large"])
    for layout in MEMORY_LAYOUTS:
        comparison = results.get(f"memory-{layout}", {}).get("figures", {}).get("comparison") or {}
        for key in ("analytic/allocated", "analytic_total/device_used"):
            value = comparison.get(key)
            add(f"plan within {GOALS['plan_within']:.0%} of the real peak: {key} ({layout})", value,
                value is not None and abs(value - 1) <= GOALS["plan_within"])
    return out


def _size(params: Any) -> str:
    """A parameter count as people say it: 1.36B, 374M, 115K."""
    if not isinstance(params, int | float) or not params:
        return "?"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"{params / scale:.3g}{unit}"
    return str(params)


def _gb(value: Any) -> str:
    return f"{value / 1e9:.2f}" if isinstance(value, int | float) and value else "-"


def _num(value: Any, fmt: str = ".2f") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def render_markdown(report: dict[str, Any]) -> str:
    """The bench/RESULTS.md section of one run (pure: a function of the JSON report)."""
    parts, device = report["parts"], report.get("device") or {}
    prepared = report.get("prepared") or {}
    lines = ["", f"## GPU acceptance (bench/gpu_check.py, profile {report['profile']}) — {report['when']}", ""]
    memory_total = device.get("memory_total")
    matmul = device.get("matmul") or {}
    lines.append(
        f"{device.get('name', 'device unknown')}"
        + (f", {memory_total / 2**30:.1f} GiB" if memory_total else "")
        + f"; torch {device.get('torch', '?')} (CUDA {device.get('cuda')}), transformers {device.get('transformers', '?')}, "
        f"accelerate {device.get('accelerate', '?')}, Python {device.get('python', '?')}; matmul ceiling "
        f"{_num(matmul.get('tflops'), '.3g')} TFLOPS ({matmul.get('dtype', '?')}, n={matmul.get('n', '?')}); MFU against "
        f"{device.get('peak_source', '?')}. Prepared {prepared.get('when', '?')} at {prepared.get('commit', '?')} "
        f"(`make gpu-check-prepare`); run by `make gpu-check`: {report['seconds']:.0f} s of {report['budget_s']:.0f} s, "
        f"parts {report['isolation']}ed" + (", pydantic from the carried wheels" if report.get("carried_site") else "")
        + ".")
    lines += ["", "| part | status | s | limit s |", "|---|---|---|---|"]
    for name, r in parts.items():
        error = r.get("figures", {}).get("error")
        lines.append(f"| {name} | {r['status']}{f': {error}' if error else ''} | {_num(r.get('seconds'), '.0f')} | "
                     f"{_num(r.get('limit_s'), '.0f')} |")
    lines += [f"Note: {n}" for n in report.get("notes", [])]

    lines += ["", "Goals (recorded, not asserted):", "", "| goal | measured | met |", "|---|---|---|"]
    for g in report["goals"]:
        met = {True: "yes", False: "no", None: "not measured"}[g["met"]]
        lines.append(f"| {g['goal']} | {_num(g['value'], '.3f')} | {met} |")

    throughput = [(n, r["figures"]) for n, r in parts.items() if n.startswith("throughput-") and r.get("figures")]
    if throughput:
        lines += ["", "Throughput: the same packed rows, tokens/s windowed after the warm-up between synchronised "
                  "stamps, medians of interleaved repeats (bench/gpu_bench.py).", "",
                  "| model | system | tokens/s | MFU | runs | spread | init s | loss first -> last |",
                  "|---|---|---|---|---|---|---|---|"]
        for _, f in throughput:
            size = f"{_size(f.get('params'))}, seq {f.get('seq_len')} x {f.get('micro_batch_size')}"
            for system, s in f.get("systems", {}).items():
                runs = s.get("runs") or [{}]
                init = [r.get("init_s") for r in runs if r.get("init_s") is not None]
                value = f"{_num(s.get('tokens_per_s'), ',.0f')}" + (f" (error: {s['error']})" if s.get("error") else "")
                lines.append(f"| {size} | {system} | {value} | {_num(100 * s['mfu'], '.1f') + ' %' if s.get('mfu') else '-'}"
                             f" | {s.get('repeats', 0)} | {_num(s.get('spread'), '.1%')} | {_num(max(init) if init else None, '.1f')}"
                             f" | {_num(runs[-1].get('loss_first'), '.3f')} -> {_num(runs[-1].get('loss_last'), '.3f')} |")
            ratios = ", ".join(f"{k} {_num(v, '.3f')}" for k, v in f.get("ratios", {}).items())
            lines.append(f"| {size} | ratios | {ratios} | | | | | |")

    memory = [(n, r["figures"]) for n, r in parts.items() if n.startswith("memory-") and r.get("figures")]
    if memory:
        lines += ["", "Memory of a real step against the plan (GB = 1e9 bytes; dry run and analytic computed on the CPU "
                  "machine beforehand; *used* = device total - free after the steps, context included):", "",
                  "| layout | micro x seq | dry run tracked | analytic w/o overhead | max allocated | tracked/alloc | "
                  "analytic/alloc | max reserved | device used | dry peak/used | analytic total/used |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, f in memory:
            d, real, c = f.get("dry_run") or {}, f.get("real") or {}, f.get("comparison") or {}
            lines.append(
                f"| {f.get('layout')} | {f.get('micro_batch_size', '?')} x {f.get('seq_len', '?')} | "
                f"{_gb(d.get('tracked_bytes'))} | {_gb(d.get('analytic_tracked_bytes'))} | {_gb(real.get('max_allocated'))} | "
                f"{_num(c.get('tracked/allocated'))} | {_num(c.get('analytic/allocated'))} | {_gb(real.get('max_reserved'))} | "
                f"{_gb(real.get('device_used'))} | {_num(c.get('dry_peak/device_used'))} | "
                f"{_num(c.get('analytic_total/device_used'))} |")

    compiled = parts.get("compile", {}).get("figures") or {}
    if compiled.get("eager"):
        lines += ["", f"train.compile ({compiled.get('backend')}) against eager, the trainer on the same spec "
                  f"({_size(compiled.get('params'))}, {compiled.get('steps')} steps):", "",
                  "| mode | tokens/s | MFU | first step s |", "|---|---|---|---|"]
        for mode in ("eager", "compiled"):
            m = compiled.get(mode) or {}
            lines.append(f"| {mode} | {_num(m.get('tokens_per_s'), ',.0f')} | "
                         f"{_num(100 * m['mfu'], '.1f') + ' %' if m.get('mfu') else '-'} | {_num(m.get('first_step_s'), '.1f')} |")
        lines.append(f"\nSpeed-up {_num(compiled.get('speedup'), '.3f')}; loss difference first step "
                     f"{_num(compiled.get('first_step_loss_diff'), '.2e')}, largest {_num(compiled.get('max_loss_diff'), '.2e')} "
                     f"(tolerance {compiled.get('tolerance')}): {'within' if compiled.get('losses_within') else 'NOT within'}.")

    resume = parts.get("resume", {}).get("figures") or {}
    if "losses_bitwise_equal" in resume:
        lines.append(f"\nkill -9 after step {resume.get('kill_at')} (SIGKILL seen: {resume.get('killed_by_sigkill')}), "
                     f"resumed from {Path(str(resume.get('resumed_from'))).name}: {resume.get('losses_compared')} later "
                     f"losses bitwise equal to the uninterrupted run: {resume.get('losses_bitwise_equal')} (largest "
                     f"difference {_num(resume.get('max_loss_diff'), '.2e')}); parameters bitwise equal: "
                     f"{resume.get('params_bitwise_equal')}; the steps before the kill equal to the reference's (the "
                     f"device repeats itself): {resume.get('before_kill_bitwise_equal')}.")
    export = parts.get("export", {}).get("figures") or {}
    if "max_abs_diff_fp32" in export:
        lines.append(f"\nExport loaded by transformers on {export.get('loaded_device')}: largest logit difference "
                     f"{_num(export.get('max_abs_diff_fp32'), '.2e')} in fp32 (tolerance {EXPORT_TOLERANCE['fp32']:g}), "
                     f"{_num(export.get('max_abs_diff_as_trained'), '.2e')} against the trainer's model as it runs "
                     f"(tolerance {EXPORT_TOLERANCE['as_trained']:g}); argmax agreement "
                     f"{_num(export.get('argmax_agreement'), '.3f')}; tokenizer ids equal: {export.get('tokenizer_same_ids')}.")
    lines.append("")
    return "\n".join(lines)


def append_results(markdown: str) -> Path:
    from scaffold import append_results_md

    return append_results_md(markdown)


def record(out: Path) -> None:
    """A device run's files back here: its section appended to bench/RESULTS.md, its JSON kept as
    bench/results/gpu_check.json."""
    report = json.loads((out / "gpu_check.json").read_text())
    append_results(render_markdown(report))
    dest = HERE / "results" / "gpu_check.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "gpu_check.json", dest)
    print(f"appended to bench/RESULTS.md; {_relative(dest)}")


# ----------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="the folder to carry (the CPU machine)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    p.add_argument("--carry", type=Path, default=DEFAULT_CARRY)
    p.add_argument("--wheels-python", default=None,
                   help="the Python the carried wheels are for (default: the profile's; gpu: 3.12)")
    r = sub.add_parser("run", help="every part (the device)")
    r.add_argument("--carry", type=Path, default=DEFAULT_CARRY)
    r.add_argument("--out", type=Path, default=DEFAULT_CARRY / "out")
    r.add_argument("--isolation", choices=("fork", "spawn"), default="fork")
    r.add_argument("--budget-s", type=float, default=None)
    r.add_argument("--append", action="store_true", help="append the section to bench/RESULTS.md")
    r.add_argument("--only", action="append", help="a part's name or kind (repeatable)")
    r.add_argument("--prepare", metavar="PROFILE", choices=sorted(PROFILES),
                   help="prepare --carry with this profile first, in a forked process (the rehearsal)")
    c = sub.add_parser("record", help="a device run's files into bench/RESULTS.md and bench/results/")
    c.add_argument("out", type=Path)
    q = sub.add_parser("part", help=argparse.SUPPRESS)  # one part in a fresh interpreter (--isolation spawn)
    q.add_argument("name")
    q.add_argument("--carry", type=Path, required=True)
    q.add_argument("--work", type=Path, required=True)
    q.add_argument("--deadline", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.profile, args.carry, args.wheels_python)
        return 0
    if args.command == "run":
        report = run(args.carry, args.out, args.isolation, args.budget_s, args.append, args.only, args.prepare)
        failed = [n for n, r in report["parts"].items() if r["status"] != "ok"]
        print(f"gpu_check: {len(report['parts']) - len(failed)} of {len(report['parts'])} parts ok"
              + (f"; not ok: {', '.join(failed)}" if failed else "") + f"; {args.out / 'gpu_check.json'}")
        return 1 if failed else 0
    if args.command == "record":
        record(args.out)
        return 0
    plan = json.loads((args.carry / PLAN_FILE).read_text())
    setup_interpreter(plan, args.carry.resolve())
    part = next(p for p in plan["parts"] if p["name"] == args.name)
    return part_main(part, plan, args.carry.resolve(), args.work, args.deadline)


if __name__ == "__main__":
    sys.exit(main())
