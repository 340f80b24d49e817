"""The benchmarks' figures about the agent describe the agent proper: the launcher's child,
which holds /dev/fuse and the pods' content, never `fusevol run`'s launcher."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import bench

if TYPE_CHECKING:
    from tests.agent import AgentProcess


def _holds_dev_fuse(pid: int) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(fds / fd) == "/dev/fuse" for fd in os.listdir(fds))


def test_bench_helpers_read_the_agent_not_the_launcher(agent: AgentProcess) -> None:
    assert agent.process is not None
    launcher = agent.process.pid
    pid = bench.agent_pid(agent)
    assert pid != launcher
    assert int(bench.proc_status(pid)["PPid"]) == launcher
    assert _holds_dev_fuse(pid)  # it serves the FUSE mount
    # The launcher holds a duplicate of the connection too (for a takeover, docs/fuse.md
    # fact 12) and has imported the agent's modules before forking (its RSS is no smaller), so what
    # tells them apart is the parentage above and the threads: only the agent runs trio's.
    assert int(bench.proc_status(pid)["Threads"]) > int(bench.proc_status(launcher)["Threads"])
    assert launcher not in bench.helper_pids(agent)
    assert all(int(bench.proc_status(h)["PPid"]) == pid for h in bench.helper_pids(agent))


def test_cold_throughput_counts_clients_that_ran_in_turn_as_serial() -> None:
    from bench.cold_throughput import keys_per_second

    # Four clients of 500 keys, 2 ms each: one after another on the CPUs, or all at once.
    in_turn = [(0.000, 0.002), (0.002, 0.004), (0.004, 0.006), (0.006, 0.008)]
    together = [(0.000, 0.002)] * 4
    assert keys_per_second(2000, in_turn) == 2000 / 0.008
    assert keys_per_second(2000, together) == 2000 / 0.002
