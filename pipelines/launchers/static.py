"""`static`: one node of a multi-node job that meets at a fixed rendezvous endpoint.

For a matrix of self-hosted runners, one node each: every runner calls `submit` with the
same job; node 0 listens on `resource.rendezvous` (host:port), the others connect to it.
This process's node rank comes from `job.node_rank`, else env `NODE_RANK` (a matrix
index). Process handling, logs and cancel are the local launcher's.
"""

from __future__ import annotations

import os
import time

from basics.errors import LaunchError
from pipelines.launchers.commands import Rendezvous, parse_endpoint
from pipelines.launchers.interface import LaunchJob, LogSink
from pipelines.launchers.local import LocalLauncher, node_ranks, preflight
from trainer.runlock import describe_ranks, live_ranks


def earlier_peers(job: LaunchJob, rank: int, before: float) -> list[dict[str, object]]:
    """The other nodes' ranks (their locks in the shared run directory) alive since before `before`."""
    own = node_ranks(job, rank)
    return [r for r in live_ranks(job.run_dir) if r.get("rank") not in own
            and isinstance(r.get("started"), (int, float)) and float(r["started"]) < before]


def node_rank_of(job: LaunchJob) -> int:
    raw = job.node_rank if job.node_rank is not None else os.environ.get("NODE_RANK")
    if raw is None:
        raise LaunchError("static launcher: set NODE_RANK (this machine's rank, 0 = the rendezvous host)")
    rank = int(raw)
    if not 0 <= rank < job.nodes:
        raise LaunchError(f"static launcher: NODE_RANK {rank} outside 0..{job.nodes - 1}")
    return rank


class StaticLauncher(LocalLauncher):
    """This machine as node `NODE_RANK` of `job.nodes`, rendezvous at `job.rendezvous`."""

    name = "static"

    def _rendezvous(self, job: LaunchJob) -> Rendezvous:
        if not job.rendezvous:
            raise LaunchError("static launcher needs resource.rendezvous (host:port of node 0)")
        host, port = parse_endpoint(job.rendezvous)
        return Rendezvous(num_machines=job.nodes, machine_rank=node_rank_of(job), main_ip=host, main_port=port)

    def _log_name(self, job: LaunchJob) -> str:
        # One file per node: on a shared file system the nodes' run directories are one.
        return f"launcher-node{node_rank_of(job)}.log"

    def _own_ranks(self, job: LaunchJob) -> range:
        # Only this machine's ranks: the other nodes' locks in a shared run dir are theirs.
        return node_ranks(job, node_rank_of(job))

    def _await_peers(self, job: LaunchJob, say: LogSink) -> None:
        """A relaunched node joins the rendezvous only once the other nodes' previous attempt has
        ended: node 0's agent keeps the store up while its trainer lives, and a node restarted
        0.4 s after its trainer was killed met that still-running attempt at the same store: its
        new rank took the dead rank's place and both waited until the job's time limit (CI,
        tests/integration/test_launch_multinode_fsdp.py). Seen through the rank locks of the shared
        run directory (not shared: nothing to wait for); bounded by `wait_previous_s`."""
        if job.wait_previous_s <= 0 or job.previous_attempt_ended is None:
            return  # a first attempt: the nodes start together
        rank, ended = node_rank_of(job), job.previous_attempt_ended
        # Ranks started before this node's attempt ended are that attempt's; a peer's relaunch
        # started later is the next one, met at the rendezvous.
        if not earlier_peers(job, rank, ended):
            return
        say(f"[launcher] waiting up to {job.wait_previous_s:.0f}s for the other nodes' previous attempt to end: "
            f"{describe_ranks(earlier_peers(job, rank, ended))}")
        deadline = time.monotonic() + job.wait_previous_s
        while earlier_peers(job, rank, ended) and time.monotonic() < deadline:
            time.sleep(0.2)

    def _prelaunch(self, job: LaunchJob) -> None:
        node_rank_of(job)  # a wrong rank is refused before anything starts
        preflight(job)
