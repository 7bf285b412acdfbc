"""trainer.dp: gloo's threads run at the I/O priority asked for (set by thread id after they
are made; the thread that joins the group stays normal), the all-reduce averages the real
gradients and leaves the padding zero, as one ring or hierarchically (groups per DC, the
leaders' K groups). Real processes on loopback; SCHED_FIFO needs root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realtime_here import expected, refusal

REPO = Path(__file__).resolve().parent.parent

WORKER = """
import json, os, sys, torch
from trainer.dp import average_gradients, init_stage_group
rank, port, prio = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
status, _ = init_stage_group("127.0.0.1", "127.0.0.1", port, rank, 2, 30,
                             io_priority=None if prio == "none" else int(prio))
p = torch.nn.Parameter(torch.zeros(3))
p.grad = torch.full((3,), float(rank + 1))
n = average_gradients([p], 2, pad_bytes=4096)
threads, flags = {}, {}
for tid in os.listdir("/proc/self/task"):
    stat = open(f"/proc/self/task/{tid}/stat").read()
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    policy = int(stat[stat.rindex(")") + 2:].split()[38])
    threads.setdefault(comm, set()).add(policy)
    flags.setdefault(comm, set()).add(os.sched_getscheduler(int(tid)) & os.SCHED_RESET_ON_FORK)
print(json.dumps({"status": status, "grad": p.grad.tolist(), "bytes": n,
                  "main": os.sched_getscheduler(0),
                  "threads": {k: sorted(v) for k, v in threads.items()},
                  "reset_on_fork": {k: sorted(v) for k, v in flags.items()}}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: str, world: int, *args: str) -> list[dict]:
    """Every rank's report (script runs with argv rank, port, *args). Tried twice: the port
    free_port found can be taken before rank 0's store binds it (the second try's failure is
    reported with every rank's errors)."""
    for attempt in (1, 2):
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(port), *args],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for r in range(world)]
        try:
            results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if all(rc == 0 for _, _, rc in results) or attempt == 2:
            break
    assert all(rc == 0 for _, _, rc in results), [err[-2000:] for _, err, _ in results]
    return [json.loads(out.strip().splitlines()[-1]) for out, _, _ in results]


def run_pair(prio: str) -> list[dict]:
    """Both ranks' reports of WORKER at I/O priority prio ("none": normal)."""
    return run_ranks(WORKER, 2, prio)


@pytest.mark.network
@pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root (CAP_SYS_NICE)")
def test_gloo_threads_get_the_io_priority_and_the_caller_does_not():
    for doc in run_pair("10"):
        assert doc["status"] == expected(10), doc
        assert doc["main"] == os.SCHED_OTHER, doc          # the caller went back to normal
        gloo = {k: v for k, v in doc["threads"].items() if "gloo" in k}
        # the all-reduce's workers and gloo's transport loop, both real-time where the kernel
        # grants it (a container's cgroup without RT runtime refuses: all at normal priority)
        assert {"pt_gloo_runloop", "gloo_tcp_loop"} <= set(gloo), doc
        if refusal() is None:
            assert all(v == [os.SCHED_FIFO] for v in gloo.values()), doc
            # and what they fork or start is not real-time
            assert all(doc["reset_on_fork"][k] == [os.SCHED_RESET_ON_FORK] for k in gloo), doc
        else:
            assert all(v == [os.SCHED_OTHER] for v in doc["threads"].values()), doc
        assert doc["grad"] == [1.5, 1.5, 1.5] and doc["bytes"] == 4096, doc


@pytest.mark.loopback
def test_without_a_priority_nothing_is_real_time():
    for doc in run_pair("none"):
        assert doc["status"] == "off" and doc["main"] == os.SCHED_OTHER, doc
        assert all(v == [os.SCHED_OTHER] for v in doc["threads"].values()), doc
        assert doc["grad"] == [1.5, 1.5, 1.5], doc


HIERARCHICAL = """
import json, sys, torch
import torch.distributed as dist
from trainer.dp import average_gradients, init_stage_group
rank, port, world = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
groups, k = json.loads(sys.argv[4]), int(sys.argv[5])
_, hier = init_stage_group("127.0.0.1", "127.0.0.1", port, rank, world, 30, groups=groups,
                           connections=k)
p = torch.nn.Parameter(torch.zeros(5))
p.grad = torch.arange(5, dtype=torch.float32) * (rank + 1) + rank
n = average_gradients([p], world, pad_bytes=4 * 11, hier=hier)
print(json.dumps({"grad": p.grad.tolist(), "bytes": n, "local": hier.local is not None,
                  "leader": hier.leader, "across": len(hier.across)}))
"""


def run_group(world: int, groups: list[list[int]], k: int) -> list[dict]:
    """Every rank's report of one hierarchical all-reduce."""
    return run_ranks(HIERARCHICAL, world, str(world), json.dumps(groups), str(k))


@pytest.mark.loopback
@pytest.mark.parametrize("groups, k", [([[0, 1, 2], [3]], 3), ([[0, 2], [1, 3]], 2)])
def test_a_hierarchical_all_reduce_averages_as_one_ring_does(groups, k):
    world = sum(len(g) for g in groups)
    want = [sum(i * (r + 1) + r for r in range(world)) / world for i in range(5)]
    docs = run_group(world, groups, k)
    for rank, doc in enumerate(docs):
        assert doc["grad"] == pytest.approx(want), (rank, doc)
        assert doc["bytes"] == 44, doc                        # the padding went with it
        mine = next(g for g in groups if rank in g)
        assert doc["leader"] == mine[0] and doc["local"] == (len(mine) > 1), (rank, doc)
        assert doc["across"] == (k if rank == mine[0] else 0), (rank, doc)
