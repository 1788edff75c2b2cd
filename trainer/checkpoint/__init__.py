"""Checkpoints: one manager, two on-disk layouts behind one seam, one writer (docs/checkpoints.md).

  format     the on-disk format, torch-free: file names, MANIFEST.json (write, verify by sha256),
             train_state.json and layout records, listing and choosing checkpoints, retention;
             what pipelines read (tests/unit/test_spec_layers.py keeps torch out of it)
  writer     `CheckpointWriter`: the one background thread for asynchronous saves, and the publish
             protocol (manifest last, rename into place, retention, P1 events on failure)
  manager    `CheckpointManager`, held by the loop: save, wait, load, resume and rollback selection
             (one broadcast), the `Storage` protocol of a layout
  unsharded  one process / data parallelism: model.safetensors + optimizer.pt written by rank 0,
             validated by a reloaded forward pass
  sharded    FSDP / TP: torch.distributed.checkpoint shards (save, resharding load, bitwise
             round-trip validation, streamed safetensors export, loading an unsharded checkpoint)
  rng        every rank's RNG state (`rng_rank<N>.pt`)

Importing this package imports nothing: `trainer.checkpoint.format` loads without torch.
"""
