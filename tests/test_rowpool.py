"""The what-if's rows in worker processes (geodc.predict.rowpool): the same table as one by
one, a worker's error raised in the caller, and no worker left after the block."""

from __future__ import annotations

import multiprocessing

import pytest

from geodc.predict.rowpool import rows_pool
from geodc.predict.whatif import whatif
from geodc.spec.scenario import parse_scenario
from tests.test_whatif import small_bubbletea_doc

pytestmark = pytest.mark.loopback


def _strip(doc):
    """A table's document without its timings (the only figures that may differ)."""
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_strip(x) for x in doc]
    return doc


def test_rows_in_two_processes_are_the_rows_one_by_one():
    sc = parse_scenario(small_bubbletea_doc(), path="small.yaml")
    told: list[str] = []
    one = whatif(sc)
    two = whatif(sc, progress=told.append, workers=2)
    assert _strip(two.to_dict()) == _strip(one.to_dict())
    assert [r.key for r in two.rows][-1] == "request_rate"
    assert len(told) == len(two.rows) and told[-1].startswith(f"{len(two.rows)} of ")
    assert multiprocessing.active_children() == []


def _fails(x: int) -> int:
    raise ValueError(f"row {x} failed")


def test_a_workers_error_is_raised_in_the_caller_and_no_worker_is_left():
    with pytest.raises(ValueError, match="row 3 failed"):
        with rows_pool(2) as pool:
            pool.submit(_fails, 3).get()
    assert multiprocessing.active_children() == []
