"""Preparation: versioning by content, cache hits, corruption, cleaning counts, splits."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from basics.errors import DataError
from pipelines.dataprep.clean import clean_text
from pipelines.dataprep.inputs import compute_version
from pipelines.dataprep.prepare import check_free_space, prepare_data
from tests.infra.data_helpers import build_small_demo, demo_sources, make_spec, prose, write_jsonl
from validation.data import PreparedData


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("repo")
    build_small_demo(repo)
    return repo


@pytest.fixture(scope="module")
def prepared(demo_repo: Path) -> PreparedData:
    return prepare_data(make_spec(demo_sources()).data, demo_repo, progress=False)


def test_clean_text_normalises_and_strips_controls() -> None:
    assert clean_text("  e\u0301t\u00e9\r\nline\x0cfeed\x07\t tab \u0085 ") == "\u00e9t\u00e9\nlinefeed\t tab"


def test_layout_stats_and_manifest(prepared: PreparedData) -> None:
    assert prepared.sources == ["code", "docs", "reference"]
    assert prepared.vocab_size == 400 and prepared.token_dtype == np.uint16
    manifest = json.loads((prepared.path / "manifest.json").read_text())
    assert manifest["version"] == prepared.version == prepared.path.name
    assert {"tokenizer/tokenizer.json", "stats.json", "prep.json", "sources/docs/train/00001.tokens.bin",
            "sources/docs/eval/00001.index.npy"} <= set(manifest["files"])
    for name in prepared.sources:
        st = prepared.stats[name]
        assert st["documents"] == st["train_documents"] + st["eval_documents"]
        assert st["train_documents"] > 0 and st["eval_documents"] > 0
        assert st["tokens"] == prepared.tokens(name, "train").size + prepared.tokens(name, "eval").size
        assert prepared.offsets(name, "train")[-1] == st["train_tokens"]
        assert 1.5 < prepared.bytes_per_token(name) < 8
        assert st["doc_tokens"]["p05"] <= st["doc_tokens"]["p50"] <= st["doc_tokens"]["p95"] <= st["doc_tokens"]["max"]
        assert abs(sum(st["token_profile"]["distribution"].values()) - 1.0) < 1e-5
        assert int(prepared.tokens(name).max()) < prepared.vocab_size
    # Token ids decode back to the cleaned text of each document.
    raw = [json.loads(line)["text"] for line in (prepared.path.parents[1] / "demo/docs.jsonl").open()]
    first = prepared.offsets("docs", "train")[:2]
    decoded = prepared.tokenizer.decode(prepared.tokens("docs")[first[0]:first[1]].tolist())
    assert decoded in {clean_text(t) for t in raw}


def test_splits_are_disjoint_and_decided_by_hash(prepared: PreparedData) -> None:
    for name in prepared.sources:
        docs = {}
        for split in ("train", "eval"):
            tokens, offsets = prepared.tokens(name, split), prepared.offsets(name, split)
            docs[split] = {tokens[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:], strict=True)}
        assert docs["train"] and docs["eval"] and not docs["train"] & docs["eval"]


def test_second_run_is_a_cache_hit_and_version_is_content_based(demo_repo: Path, prepared: PreparedData,
                                                                tmp_path: Path) -> None:
    spec = make_spec(demo_sources())
    again = prepare_data(spec.data, demo_repo, progress=False)
    assert again.cache_hit and again.version == prepared.version
    # Touching a file (new mtime, same bytes) keeps the version; weights and seq_len are not part of it.
    code = demo_repo / "data/demo/code.jsonl"
    os.utime(code, (1, 1))
    reweighted = make_spec(demo_sources({"code": 0.2, "docs": 0.4, "reference": 0.4}), seq_len=128)
    assert compute_version(reweighted.data, demo_repo, tmp_path).version == prepared.version
    # Different content, tokenizer or cleaning parameters give a different version.
    changed = make_spec(demo_sources(), tokenizer={"kind": "bpe", "vocab_size": 512})
    assert compute_version(changed.data, demo_repo, tmp_path).version != prepared.version
    assert compute_version(make_spec(demo_sources(), min_doc_chars=20).data, demo_repo, tmp_path).version != prepared.version
    copy = tmp_path / "data/demo"
    copy.mkdir(parents=True)
    for name in ("code", "docs", "reference"):
        (copy / f"{name}.jsonl").write_bytes((demo_repo / f"data/demo/{name}.jsonl").read_bytes())
    assert compute_version(spec.data, tmp_path, tmp_path / "cache").version == prepared.version
    with (copy / "docs.jsonl").open("a") as handle:
        handle.write(json.dumps({"text": prose(999)}) + "\n")
    assert compute_version(spec.data, tmp_path, tmp_path / "cache").version != prepared.version


def test_preparation_is_deterministic(demo_repo: Path, prepared: PreparedData, tmp_path: Path) -> None:
    other = prepare_data(make_spec(demo_sources()).data, demo_repo, cache_root=tmp_path / "cache", progress=False)
    assert not other.cache_hit and other.version == prepared.version
    ours = json.loads((prepared.path / "manifest.json").read_text())["files"]
    theirs = json.loads((other.path / "manifest.json").read_text())["files"]
    ours.pop("prep.json"), theirs.pop("prep.json")  # holds absolute input paths and timings
    assert ours == theirs


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "drop_manifest", "garbage_manifest"])
def test_corrupt_cache_is_detected_and_rebuilt(demo_repo: Path, tmp_path: Path, damage: str) -> None:
    spec = make_spec(demo_sources({"docs": 1.0}))
    first = prepare_data(spec.data, demo_repo, cache_root=tmp_path, progress=False)
    shard = first.path / "sources/docs/train/00000.tokens.bin"
    if damage == "flip_byte":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-2])
    elif damage == "drop_manifest":
        (first.path / "manifest.json").unlink()
    else:
        (first.path / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match="corrupt|manifest|incomplete"):
        PreparedData.open(first.path)
    rebuilt = prepare_data(spec.data, demo_repo, cache_root=tmp_path, progress=False)
    assert not rebuilt.cache_hit and rebuilt.version == first.version
    PreparedData.open(rebuilt.path)  # verifies
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".build-", ".corrupt-"))]


def test_cleaning_counts_empty_duplicate_and_non_ascii(tmp_path: Path) -> None:
    texts = [prose(i) for i in range(40)]
    texts += [texts[0], texts[1], "  " + texts[2] + "\r\n"]  # 3 duplicates (the last one after cleaning)
    texts += ["", "   ", "tiny", None]  # 4 empty or too short
    texts += ["Caf\u00e9 na\u00efve r\u00e9sum\u00e9 " + prose(100)]
    write_jsonl(tmp_path / "data/hand.jsonl", texts)
    spec = make_spec([{"name": "hand", "path": "data/hand.jsonl", "weight": 1.0}], eval_fraction=0.2)
    prepared = prepare_data(spec.data, tmp_path, progress=False)
    st = prepared.stats["hand"]
    assert st["documents_read"] == len(texts)
    assert st["empty_dropped"] == 4 and st["duplicates_dropped"] == 3
    assert st["documents"] == 41
    assert st["empty_rate"] == pytest.approx(4 / len(texts), abs=1e-6)
    assert st["duplicate_rate"] == pytest.approx(3 / (len(texts) - 4), abs=1e-6)
    assert 0 < st["non_ascii_ratio"] < 0.01


def test_empty_and_all_dropped_sources_are_errors(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data/empty.jsonl").write_text("")
    write_jsonl(tmp_path / "data/short.jsonl", ["a", "b", ""])
    with pytest.raises(DataError, match="'empty' is empty"):
        prepare_data(make_spec([{"name": "empty", "path": "data/empty.jsonl", "weight": 1.0}]).data, tmp_path,
                     progress=False)
    with pytest.raises(DataError, match="no documents left after cleaning .3 read, 3 empty"):
        prepare_data(make_spec([{"name": "short", "path": "data/short.jsonl", "weight": 1.0}]).data, tmp_path,
                     progress=False)
    assert not list((tmp_path / "data/cache").glob(".build-*"))


def test_huge_document_and_single_document_source(tmp_path: Path) -> None:
    huge = " ".join(prose(i) for i in range(3000))  # one ~0.5 MB line
    write_jsonl(tmp_path / "data/huge.jsonl", [huge])
    spec = make_spec([{"name": "huge", "path": "data/huge.jsonl", "weight": 1.0}])
    prepared = prepare_data(spec.data, tmp_path, progress=False)
    st = prepared.stats["huge"]
    assert st["documents"] == 1 and st["train_documents"] == 1 and st["eval_documents"] == 0
    assert prepared.tokenizer.decode(prepared.tokens("huge").tolist()) == huge


def test_local_tokenizer_is_part_of_the_version(demo_repo: Path, prepared: PreparedData, tmp_path: Path) -> None:
    local = demo_repo / "data/tok"
    local.mkdir(exist_ok=True)
    (local / "tokenizer.json").write_bytes(prepared.tokenizer_path.read_bytes())
    spec = make_spec(demo_sources(), tokenizer={"kind": "local", "path": "data/tok"})
    loaded = prepare_data(spec.data, demo_repo, cache_root=tmp_path, progress=False)
    assert loaded.version != prepared.version and loaded.vocab_size == prepared.vocab_size
    assert np.array_equal(loaded.tokens("docs"), prepared.tokens("docs"))
    missing = make_spec(demo_sources(), tokenizer={"kind": "local", "path": "data/none"})
    with pytest.raises(DataError, match="no tokenizer.json"):
        prepare_data(missing.data, demo_repo, cache_root=tmp_path, progress=False)


def test_disk_space_is_checked_before_writing(tmp_path: Path) -> None:
    check_free_space(tmp_path, needed=1)
    with pytest.raises(DataError, match="not enough disk space"):
        check_free_space(tmp_path, needed=1 << 62)


def test_parquet_and_text_sources_prepare_like_jsonl(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [prose(i) for i in range(30)]
    write_jsonl(tmp_path / "data/j/part.jsonl", texts)
    (tmp_path / "data/p").mkdir()
    pq.write_table(pa.table({"body": texts}), tmp_path / "data/p/part.parquet")
    (tmp_path / "data/t").mkdir(parents=True)
    (tmp_path / "data/t/a.txt").write_text("\n\n".join(texts[:15]) + "\n", encoding="utf-8")
    (tmp_path / "data/t/b.md").write_text("\n\n".join(texts[15:]) + "\n", encoding="utf-8")
    spec = make_spec([
        {"name": "j", "path": "data/j/*.jsonl", "weight": 0.4},
        {"name": "p", "path": "data/p/*.parquet", "weight": 0.3, "text_field": "body"},
        {"name": "t", "path": "data/t/*", "weight": 0.3, "format": "text"},
    ], eval_fraction=0.2)
    prepared = prepare_data(spec.data, tmp_path, progress=False)
    tokens = {s: np.sort(np.concatenate([prepared.tokens(s, "train"), prepared.tokens(s, "eval")])) for s in "jpt"}
    assert np.array_equal(tokens["j"], tokens["p"]) and np.array_equal(tokens["j"], tokens["t"])
    assert {prepared.stats[s]["documents"] for s in "jpt"} == {30}


def test_the_content_digest_names_the_bytes_not_where_they_were_made(demo_repo: Path, prepared: PreparedData,
                                                                    tmp_path: Path) -> None:
    """Issue 36: a data version names its inputs; the trusted side checks what was made from them."""
    other = prepare_data(make_spec(demo_sources()).data, demo_repo, cache_root=tmp_path / "cache", progress=False)
    assert other.path != prepared.path and len(other.content_digest) == 64
    assert other.content_digest == prepared.content_digest  # another place, another run: the same bytes


def test_a_cached_version_rewritten_on_shared_storage_is_refused_and_made_again(demo_repo: Path,
                                                                                 tmp_path: Path) -> None:
    """Issue 36 (MEDIUM): a training job rewrote a prepared version on PIPELINE_DATA_CACHE, its
    manifest included; later launches trained on it under the same version. Now a launch checks
    the cached copy against the digest the trusted side recorded, sets it aside and prepares again."""
    from validation.data.prepared import write_manifest

    spec = make_spec(demo_sources({"docs": 1.0}))
    honest = prepare_data(spec.data, demo_repo, cache_root=tmp_path, progress=False)
    attested = honest.content_digest
    shard = honest.path / "sources/docs/train/00000.tokens.bin"
    original = shard.read_bytes()
    data = bytearray(original)
    data[10:20] = bytes(10)  # the poison, with a manifest that matches it
    shard.write_bytes(bytes(data))
    write_manifest(honest.path, honest.version)
    poisoned = PreparedData.open(honest.path)  # the manifest verifies: the old check cannot see it
    assert poisoned.content_digest != attested
    again = prepare_data(spec.data, demo_repo, cache_root=tmp_path, progress=False,
                         expected_digests={honest.version: attested})
    assert not again.cache_hit and again.content_digest == attested
    assert again.path == honest.path and shard.read_bytes() == original
    # Preparation itself giving other bytes under the attested version is refused in one line.
    with pytest.raises(DataError, match="differs from the content attested"):
        prepare_data(spec.data, demo_repo, cache_root=tmp_path / "fresh", progress=False,
                     expected_digests={honest.version: "0" * 64})
