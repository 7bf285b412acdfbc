"""Where the repository's files are: the checkout's root, the shipped scenarios and data.

One job: paths, so no module counts parent folders of its own file."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = REPO_ROOT / "topologies"
DATA = REPO_ROOT / "data"
GPU_PROFILES = DATA / "gpu-profiles"                 # measured H200 timings (PROVENANCE.md)
AZURE_TRACES = DATA / "azure-llm-inference-2023"     # request traces for BubbleTea's load
