"""A datatrove worker runs many tokenize tasks one after another: it must not grow with them.

Measured on the 6 GB bench (issue 18): with the tokenizer loaded per task, each worker's
anonymous memory grew about 4 MB per 64 MiB task (the whole preparation tree: 547 MiB after
scan and dedup, 709 MiB after 42 of 92 tokenize tasks). `tokenizers` keeps about 2 MB of every
`Tokenizer.from_file`; the worker now loads each tokenizer file once and trims the C heap
after a task. The flat figure is in bench/RESULTS.md (bench/bench_data_scale.py --mb 6144).
"""

from __future__ import annotations

import os
from pathlib import Path


def _tokenizer_file(path: Path, text: str) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([text] * 50, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    tok.save(str(path))
    return path


def test_a_worker_loads_each_tokenizer_file_once_and_a_new_version_again(tmp_path: Path) -> None:
    from pipelines.dataprep.tasks import load_tokenizer, release_free_heap

    path = _tokenizer_file(tmp_path / "tokenizer.json", "def f(x): return x + 1")
    first = load_tokenizer(str(path))
    assert load_tokenizer(str(path)) is first  # the next task of the same worker
    assert first.encode("return x").ids == load_tokenizer(str(path)).encode("return x").ids
    _tokenizer_file(path, "import sys; print(sys.argv[1:], sep=', ')")  # another data version's tokenizer at the same path
    os.utime(path, ns=(1, 1))
    second = load_tokenizer(str(path))
    assert second is not first and second.get_vocab_size() != first.get_vocab_size()
    release_free_heap()  # callable anywhere (glibc or not) and harmless
