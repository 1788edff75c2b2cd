"""Host allocator policy for CPU training: keep freed activation memory in the heap.

glibc serves allocations above its mmap threshold with a fresh `mmap` and returns them with
`munmap` when freed; it trims the heap top back to the OS above the trim threshold. A CPU
training step allocates and frees the same activation and gradient buffers every step (the
bench Llama: logits 16 MB, attention scores 8 MB), so with the defaults every step maps fresh
pages and touches each one for the first time: 13-14 thousand minor page faults per bf16 step
in a trainer process (6-7 thousand in a bare-loop process, whose heap happens to settle
differently), measured with `getrusage`. With the thresholds raised, steady steps take ~0
faults and 3 % (bare loop) to 8 % (trainer) less CPU time (bench/RESULTS.md, "host page
faults"; `bench/page_faults.py`).

Why not jemalloc/tcmalloc (the usual advice for CPU PyTorch): they have to be `LD_PRELOAD`ed
before the interpreter starts, i.e. by every launcher on every host; two `mallopt` calls do the
same job for this access pattern from inside the process. The price is that memory freed after
the peak step stays with the process until it exits (RSS ~ peak), which for a training process
is what it holds anyway.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 256 << 20
TRIM_THRESHOLD_BYTES = 1 << 30
OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory_in_heap() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True when applied.

    Does nothing where the operator chose an allocator policy (glibc's MALLOC_* / GLIBC_TUNABLES
    variables, or jemalloc/tcmalloc in LD_PRELOAD) or where libc is not glibc.
    """
    if any(os.environ.get(k) for k in OPERATOR_SETTINGS):
        return False
    if any(name in os.environ.get("LD_PRELOAD", "") for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols hold libc's (find_library runs ldconfig)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): leave the allocator alone
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if applied:
        log.debug("glibc mmap threshold %d MiB, trim threshold %d MiB", MMAP_THRESHOLD_BYTES >> 20,
                  TRIM_THRESHOLD_BYTES >> 20)
    return applied
