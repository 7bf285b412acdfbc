"""Prefill request load from the shipped Azure traces: replay, Poisson, the context rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.features.bubbletea.load import fit_context, load_trace, poisson, replay

pytestmark = pytest.mark.unit


def test_shipped_traces_load_whole_and_in_order():
    conv, code = load_trace("conv"), load_trace("code")
    # data rows of the shipped CSVs (the dataset README says 19,365 and 8,818: one fewer each)
    assert len(conv) == 19366 and len(code) == 8819
    for trace in (conv, code):
        assert trace[0].arrival_s == 0.0
        assert all(a.arrival_s <= b.arrival_s for a, b in zip(trace, trace[1:]))
        assert all(r.prompt_tokens >= 1 and r.output_tokens >= 0 for r in trace)
    # the conversation trace's first rows, as in the CSV
    assert (conv[0].prompt_tokens, conv[0].output_tokens) == (374, 44)
    assert conv[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)


def test_replay_window_and_rate_multiplier():
    trace = load_trace("conv")
    window = replay(trace, start_s=60, window_s=30)
    assert window and all(0 <= r.arrival_s < 30 for r in window)
    fast = replay(trace, start_s=60, window_s=30, rate_multiplier=2.0)
    assert [r.index for r in fast] == [r.index for r in window]       # same requests, same order
    assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 2 for r in window])
    with pytest.raises(ValueError, match="rate_multiplier"):
        replay(trace, rate_multiplier=0)


def test_poisson_rate_seed_and_real_lengths():
    trace = load_trace("code")
    a = poisson(rate_per_s=20, duration_s=100, lengths=trace, seed=1)
    assert a == poisson(rate_per_s=20, duration_s=100, lengths=trace, seed=1)
    assert 2000 * 0.9 < len(a) < 2000 * 1.1                       # about rate x duration
    sizes = {(r.prompt_tokens, r.output_tokens) for r in trace}
    assert all((r.prompt_tokens, r.output_tokens) in sizes for r in a)
    assert a != poisson(rate_per_s=20, duration_s=100, lengths=trace, seed=2)


def test_context_rule_truncates_or_refuses_never_crashes():
    trace = load_trace("code")
    long = [r for r in trace if r.prompt_tokens + r.output_tokens > 2048]
    assert long
    kept, refused = fit_context(trace, max_context_tokens=2048, rule="refuse")
    assert len(refused) == len(long) and len(kept) + len(refused) == len(trace)
    kept, refused = fit_context(trace, max_context_tokens=2048, rule="truncate")
    assert not refused and len(kept) == len(trace)
    assert all(r.prompt_tokens + r.output_tokens <= 2048 and r.prompt_tokens >= 1 for r in kept)
    cut = [r for r in kept if r.truncated_from is not None]
    assert len(cut) == len(long) and all(r.truncated_from > r.prompt_tokens for r in cut)
    with pytest.raises(ValueError, match="context rule"):
        fit_context(trace, max_context_tokens=2048, rule="drop")


def test_bad_trace_file_names_the_line(tmp_path: Path):
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,3\n"
                   "2023-11-16 18:15:47.2,x,3\n")
    with pytest.raises(ValueError, match=r"bad.csv:3"):
        load_trace("custom", path=bad)
    with pytest.raises(ValueError, match="unknown trace"):
        load_trace("chat")
