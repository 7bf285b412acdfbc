"""What a run could leave on the local cluster's servers (scripts/local_cluster.py), for the
tests that build across them: each server's links and registry folder, read in one ssh, and the
processes here (the local servers share this kernel) whose command lines name the run."""

from __future__ import annotations

import time
from pathlib import Path

from testbed.emulation.servers import server_run


def server_state(server) -> tuple[list[str], str, list[str]]:
    """server's links (`ip -o link show`, a line each), its registry folder's listing and the
    run filters' chains in its firewall (testbed.emulation.underlayfilter)."""
    links, folders, chains = server_run(
        server, "ip -o link show; echo ---; ls /run/geotestbed-remote 2>&1 || true; echo ---; "
        "{ iptables -S; ip6tables -S; } 2>/dev/null | grep -- '-N GDVX-' || true").split("---\n")
    return links.splitlines(), folders, chains.splitlines()


def link_counts(servers) -> dict[str, int]:
    """How many links each server has (before a run, for assert_nothing_left)."""
    return {s.name: len(server_state(s)[0]) for s in servers}


def assert_nothing_left(servers, before: dict[str, int]) -> dict[str, list[str]]:
    """Each server has the links it had before (link_counts), no registry folder and no filter
    chain; its links, by server name."""
    out = {}
    for s in servers:
        links, folders, chains = server_state(s)
        assert len(links) == before[s.name], links
        assert "No such file" in folders, folders
        assert chains == [], chains
        out[s.name] = links
    return out


def processes_naming(*marks: str, wait_s: float = 5.0) -> list[str]:
    """Command lines (of any process here: the local servers share this kernel) holding a mark,
    after up to wait_s for them to go."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError):
                continue
            if entry.name.isdigit() and any(m in cmdline for m in marks):
                found.append(f"{entry.name}: {cmdline[:120]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
