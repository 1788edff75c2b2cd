"""How `make test` spreads modules over its xdist workers (tests/infra/scheduling.py).

Reproduced before: with pytest 9.2 and xdist 3.8 the `xdist_group` markers never reached the
scheduler, so `--dist loadgroup` scheduled every test alone and a module fixture (a sharded
training) was built once per worker that got one of its tests."""

from __future__ import annotations

from dataclasses import dataclass

from tests.infra import scheduling


@dataclass
class FakeItem:
    nodeid: str


def test_a_module_is_one_scope_and_every_slurm_module_shares_one():
    assert scheduling.scope_of("tests/unit/test_spec_cli.py::test_x[a]") == "tests/unit/test_spec_cli.py"
    assert scheduling.scope_of("tests/unit/test_spec_cli.py::test_x[a]@tests/unit/test_spec_cli.py") == \
        "tests/unit/test_spec_cli.py"
    slurm = [scheduling.scope_of(f"tests/integration/{m}.py::t") for m in
             ("test_launch_slurm", "test_sweep_slurm", "test_data_slurm", "test_launch_multinode_fsdp")]
    assert slurm == ["slurm"] * 4
    assert scheduling.ledger_key("tests/e2e/test_continue_layout.py::test_a[x-y]") == \
        "tests.e2e.test_continue_layout::test_a[x-y]"


def test_the_heaviest_scope_goes_first_and_a_module_keeps_its_order(monkeypatch):
    ledger = {"tests.unit.test_a::one": 1.0, "tests.unit.test_a::two": 1.0,
              "tests.e2e.test_b::heavy": 50.0, "tests.integration.test_launch_slurm::s": 30.0,
              "tests.integration.test_data_slurm::d": 30.0}
    monkeypatch.setattr(scheduling, "_ledger", lambda: ledger)
    items = [FakeItem(n) for n in ("tests/e2e/test_b.py::heavy", "tests/integration/test_data_slurm.py::d",
                                   "tests/integration/test_launch_slurm.py::s", "tests/unit/test_a.py::one",
                                   "tests/unit/test_a.py::two", "tests/unit/test_new.py::unknown")]
    scheduling.order_items(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/integration/test_data_slurm.py::d", "tests/integration/test_launch_slurm.py::s",  # 60 s together
        "tests/e2e/test_b.py::heavy", "tests/unit/test_a.py::one", "tests/unit/test_a.py::two",
        "tests/unit/test_new.py::unknown"]
