"""`static`: one node of a multi-node job that meets at a fixed rendezvous endpoint.

For a matrix of self-hosted runners, one node each: every runner calls `submit` with the
same job; node 0 listens on `resource.rendezvous` (host:port), the others connect to it.
This process's node rank comes from `job.node_rank`, else env `NODE_RANK` (a matrix
index). Process handling, logs and cancel are the local launcher's.
"""

from __future__ import annotations

import os

from basics.errors import LaunchError
from pipelines.launchers.commands import Rendezvous, parse_endpoint
from pipelines.launchers.interface import LaunchJob
from pipelines.launchers.local import LocalLauncher, node_ranks, preflight


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

    def _prelaunch(self, job: LaunchJob) -> None:
        node_rank_of(job)  # a wrong rank is refused before anything starts
        preflight(job)
