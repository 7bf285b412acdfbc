"""Trainer parts in one process: stage split, data, transport over real loopback TCP, metrics on
hand-made spans, the plot and the profile script's CPU smoke run."""

import json
import os
import socket
import threading
import time

import pytest
import torch

from testbed.spec.training import TrainConfig
from trainer.data import MarkovTokens
from testbed.rules.figures import in_real_time, metrics_from_records
from testbed.host.gpt import GPTConfig
from testbed.rules.stages import plan_stages, split_layers
from trainer.stage import build_full_model, build_stage
from trainer.transport import KIND_ACT, KIND_GRAD, Listener, connect


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- stage split ------------------------------------------------------------------------------

@pytest.mark.unit
def test_split_layers_is_contiguous_and_even():
    assert split_layers(5, 2) == [(0, 1, 2), (3, 4)]
    assert split_layers(4, 4) == [(0,), (1,), (2,), (3,)]
    for n in range(1, 9):
        for p in range(1, n + 1):
            parts = split_layers(n, p)
            assert [i for part in parts for i in part] == list(range(n))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(ValueError):
        split_layers(2, 3)
    plans = plan_stages(4, 2)
    assert plans[0].module_names() == ["wte", "wpe", "h.0", "h.1"]
    assert plans[1].module_names() == ["h.2", "h.3", "ln_f", "lm_head"]


@pytest.mark.unit
def test_chained_stages_equal_the_whole_model():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    x, y = MarkovTokens(64, 0).micro_batch(0, 0, 2, 16)
    full = build_full_model(cfg, seed=3)
    stages = [build_stage(cfg, plan, seed=3) for plan in plan_stages(3, 3)]
    h = x
    for st in stages[:-1]:
        h = st(h)
    assert torch.allclose(stages[-1](h, y), full(x, y))
    n_stage_params = sum(sum(p.numel() for p in st.parameters()) for st in stages)
    assert n_stage_params == full.num_params()   # every parameter on exactly one stage


@pytest.mark.unit
def test_data_is_deterministic_and_learnable():
    a, b = MarkovTokens(64, 7), MarkovTokens(64, 7)
    xa, ya = a.micro_batch(3, 5, 4, 32)
    xb, yb = b.micro_batch(3, 5, 4, 32)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(xa[:, 1:], ya[:, :-1])
    assert not torch.equal(a.micro_batch(3, 6, 4, 32)[0], xa)
    # each token has at most 4 successors: the structure the model learns
    seq = a.sequences(0, 0, 64, 64)
    succ = {}
    for row in seq:
        for u, v in zip(row[:-1], row[1:]):
            succ.setdefault(int(u), set()).add(int(v))
    assert max(len(s) for s in succ.values()) <= 4


# -- transport --------------------------------------------------------------------------------

@pytest.mark.loopback
def test_transport_round_trip_padding_and_late_listener():
    port = free_port()
    sent = []
    result = {}

    def server():
        time.sleep(0.3)          # the listener starts late: connect() must retry
        lst = Listener("127.0.0.1", port)
        ch = lst.accept("s0r0", timeout_s=10)
        got = ch.recv(KIND_ACT, 0, 1, timeout_s=10)   # arrives second, asked first
        got0 = ch.recv(KIND_ACT, 0, 0, timeout_s=10)
        result["act1"], result["act0"] = got, got0
        ch.send(KIND_GRAD, 0, 1, got.tensor * 2)
        ch.close()
        lst.close()

    t = threading.Thread(target=server)
    t.start()
    ch = connect("127.0.0.1", port, hello="s0r0", peer="s1r0", timeout_s=10,
                 bind_ip="127.0.0.1", on_sent=sent.append)
    a0 = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2)
    a1 = torch.randn(2, 3, 2).to(torch.bfloat16)
    ch.send(KIND_ACT, 0, 0, a0, pad_to_bytes=100_000)
    ch.send(KIND_ACT, 0, 1, a1)
    grad = ch.recv(KIND_GRAD, 0, 1, timeout_s=10)
    ch.close()
    t.join(10)
    assert torch.equal(result["act0"].tensor, a0)
    assert result["act1"].tensor.dtype == torch.bfloat16
    assert torch.equal(result["act1"].tensor, a1)
    assert result["act0"].payload_bytes + result["act0"].pad_bytes == 100_000
    assert torch.equal(grad.tensor, a1 * 2)
    assert [r.payload_bytes + r.pad_bytes for r in sent] == [100_000, 12 * 2]
    assert all(r.t_enqueue_ns <= r.t_start_ns <= r.t_end_ns for r in sent)


@pytest.mark.loopback
def test_transport_deadlines_name_the_peer():
    port = free_port()
    with pytest.raises(TimeoutError, match="s1r0"):
        connect("127.0.0.1", port, hello="s0r0", peer="s1r0", timeout_s=0.3)
    lst = Listener("127.0.0.1", port)
    with pytest.raises(TimeoutError, match="s0r0"):
        lst.accept("s0r0", timeout_s=0.2)
    done = threading.Event()

    def late():
        ch = connect("127.0.0.1", port, hello="s0r0", peer="s1r0", timeout_s=5)
        done.wait(5)
        ch.close(timeout_s=1)

    t = threading.Thread(target=late)
    t.start()
    ch = lst.accept("s0r0", timeout_s=5)
    with pytest.raises(TimeoutError, match="B3 of iteration 7"):
        ch.recv(KIND_GRAD, 7, 3, timeout_s=0.2)
    done.set()
    t.join(5)
    with pytest.raises(ConnectionError, match="closed"):
        ch.recv(KIND_GRAD, 7, 3, timeout_s=5)
    ch.close(timeout_s=1)
    lst.close()


def _raw_hello(port: int, hello: str) -> socket.socket:
    from trainer.transport import hello_frame
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(hello_frame(hello, 0, 1))
    return sock


@pytest.mark.loopback
def test_unknown_dtype_in_a_header_reaches_recv():
    from trainer.transport import HEADER, MAGIC
    port = free_port()
    lst = Listener("127.0.0.1", port)
    sock = _raw_hello(port, "s0r0")
    ch = lst.accept("s0r0", timeout_s=5)
    try:
        # a well-formed frame first, then one with dtype code 99
        # (... shape, stripe offset, length, index, count): one stripe of 8 bytes
        sock.sendall(HEADER.pack(MAGIC, KIND_ACT, 0, 1, 0, 0, 0, 8, 0, 2, 0, 0, 0, 0, 8, 0, 1)
                     + torch.tensor([1.0, 2.0]).numpy().tobytes())
        assert torch.equal(ch.recv(KIND_ACT, 0, 0, timeout_s=5).tensor, torch.tensor([1.0, 2.0]))
        sock.sendall(HEADER.pack(MAGIC, KIND_ACT, 99, 1, 0, 0, 1, 8, 0, 2, 0, 0, 0, 0, 8, 0, 1)
                     + bytes(8))
        with pytest.raises(ConnectionError, match="unknown dtype code 99.*iteration=0 mb=1"):
            ch.recv(KIND_ACT, 0, 1, timeout_s=5)
        with pytest.raises(ConnectionError, match="dtype code 99"):   # and stays so
            ch.recv(KIND_ACT, 0, 2, timeout_s=5)
    finally:
        sock.close()
        ch.close(timeout_s=1)
        lst.close()


@pytest.mark.loopback
def test_listener_skips_stray_connections_until_its_peer_comes():
    port = free_port()
    lst = Listener("127.0.0.1", port)
    strays = [_raw_hello(port, "intruder"), socket.create_connection(("127.0.0.1", port))]
    strays[1].sendall(b"GET / HTTP/1.0\r\n\r\n")       # not even a hello
    result = {}

    def peer():
        time.sleep(0.3)
        result["ch"] = connect("127.0.0.1", port, hello="s0r0", peer="s1r0", timeout_s=5)

    t = threading.Thread(target=peer)
    t.start()
    ch = lst.accept("s0r0", timeout_s=5)
    t.join(5)
    result["ch"].send(KIND_ACT, 0, 0, torch.ones(3))
    assert torch.equal(ch.recv(KIND_ACT, 0, 0, timeout_s=5).tensor, torch.ones(3))
    for s in strays:     # the listener closed them (reset: it left bytes unread)
        s.settimeout(5)
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass
        s.close()
    result["ch"].close(timeout_s=1)
    ch.close(timeout_s=1)
    # with no right peer at all: a timeout that names the rejected connection
    stray = _raw_hello(port, "intruder")
    with pytest.raises(TimeoutError, match="s0r0 did not connect.*rejected.*'intruder'"):
        lst.accept("s0r0", timeout_s=0.5)
    stray.close()
    lst.close()


# -- metrics, plot ----------------------------------------------------------------------------

def fake_run(f_ms=10, b_ms=20, P=2, M=4, iterations=3):
    """Spans of a perfect GPipe run (from the simulator), as workers would write them, with
    5 ms between one iteration's last compute end and the next one's first compute start."""
    from testbed.rules.pipeline import compute_only as simulate
    from testbed.rules.schedule import schedule_table
    sim = simulate(schedule_table("gpipe", P, M), f_ms, b_ms)
    spans, period_ns = [], int(sim.window_ms * 1e6) + 5_000_000
    for it in range(iterations):
        for op in sim.ops:
            spans.append({"name": op.action[0], "stage": op.stage, "replica": 0,
                          "host": f"h{op.stage}", "dc": "dc0", "iteration": it,
                          "microbatch": int(op.action[1:]),
                          "t_start_ns": it * period_ns + int(op.start_ms * 1e6),
                          "t_end_ns": it * period_ns + int(op.end_ms * 1e6)})
    plan = {"config": {"stages": P, "replicas": 1, "micro_batches": M, "micro_batch_size": 2,
                       "model": {"seq_len": 16}, "compute": "profile", "schedule": "gpipe",
                       "profile": {"file": "h200-transformer.json", "width": 4096, "seq": 2048,
                                   "micro_batch": 1, "n_layer": 32}},
            "workers": [{"stage": s, "replica": 0, "host": f"h{s}", "dc": "dc0"}
                        for s in range(P)]}
    losses = [{"iteration": it, "replica": 0, "loss": 5.0 - it} for it in range(iterations)]
    return spans, losses, plan


@pytest.mark.unit
def test_metrics_on_a_perfect_gpipe_timeline():
    spans, losses, plan = fake_run()
    m = metrics_from_records(spans, losses, plan)
    # F/B window 5 x 30 ms with 4 x 30 ms of compute per stage: the textbook 0.2
    assert m["pipeline_bubble_fraction"] == pytest.approx(0.2, abs=1e-6)
    # walls: iteration 1 to the next start (150 + 5 ms gap), iteration 2 (the last) its own
    # 150 ms; iteration 0 is warm-up
    walls = [0.155, 0.150]
    assert m["iteration_time_s"] == pytest.approx(sum(walls) / 2)
    util = sum(0.120 / w for w in walls) / 2
    assert m["gpu_utilization"] == pytest.approx(util, abs=1e-6)
    assert m["bubble_fraction"] == pytest.approx(1 - util, abs=1e-6)
    for st in m["stages"]:
        assert st["gpu_utilization"] == pytest.approx(util, abs=1e-6)
    # profile mode: tokens/s of the target (micro-batch 1 x seq 2048), and of the small model
    assert m["tokens_per_s"] == pytest.approx(4 * 1 * 2048 / m["iteration_time_s"])
    assert m["model_tokens_per_s"] == pytest.approx(4 * 2 * 16 / m["iteration_time_s"])
    assert m["loss"] == [5.0, 4.0, 3.0]
    assert m["iterations_averaged"] == [1, 2]
    assert [(s["stage"], s["host"]) for s in m["stages"]] == [(0, "h0"), (1, "h1")]
    assert m["op_duration_cv_max"] == pytest.approx(0.0, abs=1e-6)
    json.dumps(m)


@pytest.mark.unit
def test_metrics_count_compute_overruns():
    """An op whose real compute (compute_ns) outlasted its profile hold is counted, with its
    excess; warm-up and ops without a hold are not."""
    spans, losses, plan = fake_run()
    for w in plan["workers"]:
        w.update(hold_forward_ms=10.0, hold_backward_ms=20.0, hold_opt_ms=0.0)
    for r in spans:
        r["compute_ns"] = 1_000_000                      # 1 ms: within every hold
    late = [r for r in spans if r["iteration"] == 1 and r["name"] == "B"][:2]
    late[0]["compute_ns"], late[1]["compute_ns"] = 23_000_000, 20_500_000
    late[0]["late_ns"], late[1]["late_ns"] = 2_000_000, 5_000_000   # start latency: beside
    next(r for r in spans if r["iteration"] == 0)["compute_ns"] = 99_000_000   # warm-up
    m = metrics_from_records(spans, losses, plan)
    over = m["compute_overruns"]
    assert over["count"] == 2 and over["ops"] == 2 * 2 * 8
    assert over["total_ms"] == pytest.approx(3.5) and over["max_ms"] == pytest.approx(3.0)
    assert over["by_op"] == {"F": 0, "B": 2, "OPT": 0}
    assert over["start_latency_total_ms"] == pytest.approx(7.0)
    assert over["start_latency_max_ms"] == pytest.approx(5.0)
    real = in_real_time(m, 2.0)["compute_overruns"]
    assert real["total_ms"] == pytest.approx(1.75) and real["start_latency_max_ms"] == 2.5


@pytest.mark.unit
def test_optimizer_step_estimate():
    from testbed.spec.training import ProfileConfig
    from testbed.spec.profiles import find_block
    from testbed.rules.costs import optimizer_ms, stage_costs
    assert optimizer_ms(403_000_000) == pytest.approx(403e6 * 30 / 4.8e12 * 1e3)   # 2.5 ms
    cfg = ProfileConfig(file="h200-transformer.json", width=2048, seq=2048, micro_batch=2,
                        n_layer=24)
    costs = stage_costs(cfg, 3)
    block = find_block(cfg)
    assert [c.params for c in costs] == [8 * block["params"]] * 3
    assert all(c.optimizer_ms == pytest.approx(optimizer_ms(c.params)) for c in costs)
    assert costs[0].optimizer_ms > 0


@pytest.mark.unit
def test_metrics_in_measured_mode_count_the_model_tokens():
    spans, losses, plan = fake_run(iterations=4)
    del plan["config"]["profile"]
    plan["config"]["compute"] = "measured"
    m = metrics_from_records(spans, losses, plan)
    assert m["iterations_averaged"] == [1, 2, 3]
    assert m["iteration_time_s"] == pytest.approx((0.155 + 0.155 + 0.150) / 3)
    assert m["tokens_per_s"] == m["model_tokens_per_s"] == \
        pytest.approx(4 * 2 * 16 / m["iteration_time_s"])


@pytest.mark.unit
def test_metrics_with_two_iterations_average_both():
    spans, losses, plan = fake_run(iterations=2)
    m = metrics_from_records(spans, losses, plan)
    assert m["iterations_averaged"] == [0, 1]
    assert m["iteration_time_s"] == pytest.approx((0.155 + 0.150) / 2)


@pytest.mark.unit
def test_timeline_plot_writes_png(tmp_path):
    from testbed.analysis.timeline_plot import plot_timeline
    spans, _, _ = fake_run()
    out = plot_timeline(spans, tmp_path / "tl.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


@pytest.mark.loopback
def test_measure_profile_cpu_smoke():
    from trainer.measure_profile import main
    from testbed.spec.paths import GPU_PROFILES as PROFILE_DIR
    from testbed.rules.costs import StageCost, optimizer_ms, stage_costs
    out = PROFILE_DIR / f"test-smoke-{os.getpid()}.json"   # profiles are read from there only
    try:
        assert main([str(out), "--cpu-smoke", "--reps", "2"]) == 0
        prof = json.loads(out.read_text())
        assert {"what", "device", "dtype", "torch", "timing", "blocks"} <= prof.keys()
        row = prof["blocks"][0]
        assert {"width", "heads", "seq", "micro_batch", "forward_ms", "backward_ms",
                "activation_bytes"} <= row.keys()
        assert row["forward_ms"] > 0
        assert row["activation_bytes"] == row["micro_batch"] * row["seq"] * row["width"] * 4
        # the written file works as a profile for a run
        cfg = TrainConfig.from_dict({
            "model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64},
            "stages": 2, "micro_batches": 2, "compute": "profile",
            "profile": {"file": str(out), "width": row["width"], "seq": row["seq"],
                        "micro_batch": row["micro_batch"], "n_layer": 3}})
        costs = stage_costs(cfg.profile, 2)
        assert costs[0] == StageCost(layers=2, forward_ms=2 * row["forward_ms"],
                                     backward_ms=2 * row["backward_ms"],
                                     activation_bytes=row["activation_bytes"],
                                     params=2 * row["params"],
                                     optimizer_ms=optimizer_ms(2 * row["params"]))
    finally:
        out.unlink(missing_ok=True)


@pytest.mark.unit
def test_shipped_profiles_match_their_provenance():
    import hashlib
    import re
    from testbed.spec.paths import GPU_PROFILES as PROFILE_DIR
    text = (PROFILE_DIR / "PROVENANCE.md").read_text()
    rows = re.findall(r"^\| `([^`]+\.json)` \|.*\| ([0-9a-f]{64}) \|$", text, re.M)
    assert {name for name, _ in rows} == {p.name for p in PROFILE_DIR.glob("*.json")}
    for name, sha in rows:
        assert hashlib.sha256((PROFILE_DIR / name).read_bytes()).hexdigest() == sha, name


@pytest.mark.loopback
@pytest.mark.parametrize("cc", ["reno", "cubic", "bbr"])
def test_transport_sockets_run_the_chosen_congestion_control(cc):
    """Both ends of a stage-to-stage connection run the congestion control asked for, as the
    kernel reports it (TCP_CONGESTION read back). Any available one needs root; reno and bbr
    are allowed to everyone here."""
    import os

    from testbed.host.tcpcc import congestion_control_of

    allowed = open("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read().split()
    if cc not in open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split():
        pytest.skip(f"this kernel has no {cc}")
    if os.geteuid() != 0 and cc not in allowed:
        pytest.skip(f"needs root: {cc} is not in tcp_allowed_congestion_control")
    listener = Listener("127.0.0.1", 0, congestion_control=cc)
    port = listener.sock.getsockname()[1]
    got = {}
    t = threading.Thread(target=lambda: got.update(ch=listener.accept("a", 10)))
    t.start()
    ch = connect("127.0.0.1", port, hello="a", peer="b", timeout_s=10, congestion_control=cc)
    t.join(10)
    try:
        assert congestion_control_of(ch.sock) == cc
        assert congestion_control_of(got["ch"].sock) == cc
    finally:
        ch.sock.close()
        got["ch"].sock.close()
        listener.close()


@pytest.mark.loopback
def test_transport_refuses_an_unknown_congestion_control():
    with pytest.raises(OSError, match="cannot use TCP congestion control 'nosuchcc'"):
        Listener("127.0.0.1", 0, congestion_control="nosuchcc")


@pytest.mark.loopback
def test_a_failed_send_is_reported_at_once_on_both_sides():
    """A sender thread that fails (here its slot gate raises) ends the channel at once: this
    side's recv names the cause, and the peer's recv sees the connection end, both within
    seconds instead of their 30 s timeouts."""
    port = free_port()
    lst = Listener("127.0.0.1", port)

    def broken_gate(wire_bytes: int):
        raise RuntimeError("the slot arbiter went away")

    got = {}
    t = threading.Thread(target=lambda: got.setdefault("ch", connect(
        "127.0.0.1", port, hello="s0r0", peer="s1r0", timeout_s=5, gate=broken_gate)))
    t.start()
    peer = lst.accept("s0r0", timeout_s=5)
    t.join(5)
    ch = got["ch"]
    t0 = time.monotonic()
    ch.send(KIND_ACT, 0, 0, torch.zeros(4))
    with pytest.raises(ConnectionError, match="slot arbiter went away"):
        ch.recv(KIND_GRAD, 0, 0, timeout_s=30)
    with pytest.raises(ConnectionError):
        peer.recv(KIND_ACT, 0, 0, timeout_s=30)
    assert time.monotonic() - t0 < 3
    with pytest.raises(ConnectionError, match="s1r0"):
        ch.close(timeout_s=1)
    peer.close(timeout_s=1)
    lst.close()
