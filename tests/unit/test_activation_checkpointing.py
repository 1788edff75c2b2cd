"""`train.activation_checkpointing: none | selective | full`: the spec field and the blocks each
mode recomputes (the trainer's execution: tests/integration/test_activation_checkpointing_modes.py)."""

from __future__ import annotations

import pytest

from validation.plan import checkpointed_blocks
from validation.spec import TrainSpec


def test_old_booleans_still_mean_full_and_none_and_hash_as_before():
    assert TrainSpec(max_steps=1, activation_checkpointing=True).activation_checkpointing == "full"
    assert TrainSpec(max_steps=1, activation_checkpointing=False).activation_checkpointing == "none"
    assert TrainSpec(max_steps=1).activation_checkpointing == "none"
    with pytest.raises(ValueError, match="activation_checkpointing"):
        TrainSpec(max_steps=1, activation_checkpointing="some")


def test_selective_is_every_second_block():
    assert checkpointed_blocks(5, "selective") == [1, 3]
    assert checkpointed_blocks(3, "full") == [0, 1, 2] and checkpointed_blocks(3, "none") == []
