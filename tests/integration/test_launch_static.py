"""The `static` launcher: two "nodes" (two local launches) meet at a fixed rendezvous endpoint.

On a runner matrix each node is its own machine calling `submit` with NODE_RANK set;
here both run on this host, exactly as two self-hosted runners would.
"""

from __future__ import annotations

from dataclasses import replace

from pipelines.launchers import Phase, get_launcher
from pipelines.launchers.commands import free_port
from tests.infra.launch_helpers import USE_TRAINER, result, training_job


def test_two_static_nodes_train_together(tmp_path):
    rendezvous = f"127.0.0.1:{free_port()}"
    job = training_job(tmp_path, nodes=2, procs=1, launcher="static", rendezvous=rendezvous)
    nodes = [get_launcher("static") for _ in range(2)]
    handles = [launcher.submit(replace(job, node_rank=rank)) for rank, launcher in enumerate(nodes)]
    states = [launcher.wait(handle) for launcher, handle in zip(nodes, handles, strict=True)]
    logs = [(job.run_dir / "logs" / f"launcher-node{rank}.log").read_text() for rank in (0, 1)]
    assert all(s.phase is Phase.SUCCEEDED for s in states), (states, logs[0][-2000:], logs[1][-2000:])
    for rank in (0, 1):
        assert f"--num_machines 2 --mixed_precision no --dynamo_backend no --main_process_ip 127.0.0.1 " \
               f"--main_process_port {rendezvous.split(':')[1]} --machine_rank {rank}" in logs[rank]
    done = result(job.run_dir)
    assert done["status"] == "finished"
    if USE_TRAINER:
        assert done["world_size"] == 2
