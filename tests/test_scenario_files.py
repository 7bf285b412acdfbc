"""Hostile scenario files (issue 21 §6): each attack, run as `validate` in a child with a memory
limit and a timeout so that a regression cannot eat the machine, gives one `error:` line of at
most ~300 characters and exit 2, quickly and in little memory; YAML 1.2 and duplicate keys;
field bounds; the loader fuzzed with what found these (aliases, deep nesting, huge integers,
special files, bytes)."""

from __future__ import annotations

import copy
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.spec.errors import MAX_LINE_CHARS, ScenarioError
from testbed.spec.scenario import MAX_QUEUE_BYTES, MTU_BYTES, Scenario, load_scenario, parse_scenario

REPO = Path(__file__).resolve().parent.parent
TWO_DC = (REPO / "topologies" / "two_dc.yaml").read_text()
LIMIT_BYTES = 1536 << 20     # RLIMIT_AS of the child: what the attacks reached before is far more
BASE = {"name": "t", "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 1}],
        "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100}]}


def bounded_cli(*args: str, timeout: float = 30, stdin=subprocess.DEVNULL):
    """run_testbed.py args in a child under RLIMIT_AS and a timeout: (exit code or 'timeout',
    stderr lines, seconds, the child's peak RSS in MiB). The peak is the child's own VmHWM,
    read every 20 ms: wait4's ru_maxrss also counts what the child shared with this process
    between fork and exec (a pytest that imported torch: hundreds of MiB)."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen([sys.executable, "run_testbed.py", *args], cwd=REPO,
                                 stdin=stdin, stdout=subprocess.DEVNULL, stderr=err,
                                 preexec_fn=limit)
        rc: int | str = "timeout"
        peak_kib = 0
        while True:
            peak_kib = max(peak_kib, _hwm_kib(child.pid))
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - t0 > timeout:
                child.kill()
                os.waitpid(child.pid, 0)
                break
            time.sleep(0.02)
        child.returncode = rc if isinstance(rc, int) else -9    # reaped here, not by Popen
        err.seek(0)
        lines = err.read().decode(errors="replace").splitlines()
    return rc, lines, time.monotonic() - t0, peak_kib / 1024


def _hwm_kib(pid: int) -> int:
    """VmHWM of a live process in KiB (0 before its exec has a figure, or once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def assert_one_line(rc, lines, *words: str) -> None:
    assert rc == 2 and len(lines) == 1, (rc, lines[-3:])
    assert lines[0].startswith("error: ") and len(lines[0]) <= MAX_LINE_CHARS + 60, lines[0][:400]
    for w in words:
        assert w in lines[0], lines[0]


def alias_bomb() -> str:
    """332 bytes that expand to 9^9 strings: a billion laughs in the scenario's name."""
    items = ["&a [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    for prev, c in zip("abcdefgh", "bcdefghi"):
        items.append(f"&{c} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "name: [\n  " + ",\n  ".join(items) + "]\n"


@pytest.mark.loopback
def test_alias_bomb_is_refused_in_little_memory(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    rc, lines, seconds, rss = bounded_cli("validate", str(path))
    assert_one_line(rc, lines, "scenario:", "line 2", "anchor or alias")
    assert seconds < 15 and rss < 300, (seconds, rss)


@pytest.mark.loopback
@pytest.mark.parametrize("special", ["/dev/zero", "zero.json", "fifo.json", "dir.json"])
def test_profile_file_must_be_a_regular_file(tmp_path, special):
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.json")       # nobody writes: reading it would wait forever
    (tmp_path / "dir.json").mkdir()
    name = special if special.startswith("/") else str(tmp_path / special)
    path = tmp_path / "profile.yaml"
    path.write_text(TWO_DC.replace("file: h200-transformer.json", f"file: {name}"))
    rc, lines, seconds, rss = bounded_cli("validate", str(path), timeout=15)
    assert_one_line(rc, lines, "training.profile.file:")
    assert seconds < 15 and rss < 300, (seconds, rss)


@pytest.mark.loopback
def test_profile_file_outside_the_profile_folder_is_refused(tmp_path):
    from testbed.spec.paths import GPU_PROFILES as PROFILE_DIR
    outside = tmp_path / "h200-transformer.json"   # a valid profile, copied out of the folder
    outside.write_text((PROFILE_DIR / "h200-transformer.json").read_text())
    for name in (str(outside), str(PROFILE_DIR / ".." / ".." / "README.md")):
        doc = TWO_DC.replace("file: h200-transformer.json", f"file: {name}")
        rc, lines, _, _ = bounded_cli("validate", str(write(tmp_path, doc)), timeout=15)
        assert_one_line(rc, lines, "training.profile.file:")


@pytest.mark.unit
def test_recorded_scenarios_read_back_the_same(tmp_path):
    from testbed.spec.yamlfile import dump_yaml, load_yaml
    doc = {"name": "1e2", "description": "0o17", "dcs": [{"name": "no", "hosts": 2}],
           "on": ["off", "yes", "~", "null", "1_000", "12:30:00", "2024-01-01"],
           "big": 10 ** 30, "x": 1.5, "inf": float("inf"), "neg": -0.0}
    assert load_yaml(write(tmp_path, dump_yaml(doc)), "fix") == doc
    assert list(load_yaml(write(tmp_path, dump_yaml(doc), "b.yaml"), "fix")) == list(doc)


@pytest.mark.loopback
def test_scenario_from_stdin_fifo_is_refused_not_waited_on(tmp_path):
    read, write = os.pipe()          # held open: a reader of /dev/stdin would wait
    try:
        rc, lines, seconds, _ = bounded_cli("validate", "/dev/stdin", timeout=10, stdin=read)
    finally:
        os.close(read)
        os.close(write)
    assert_one_line(rc, lines, "is not a regular file")


@pytest.mark.unit
def test_a_huge_value_gives_a_short_line_quickly():
    doc = copy.deepcopy(BASE)
    doc["systems"] = ["baseline"] * 300_000
    t0 = time.monotonic()
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc)
    assert len(str(err.value)) <= MAX_LINE_CHARS and time.monotonic() - t0 < 10
    assert str(err.value).startswith("systems: 300000 entries")


@pytest.mark.unit
def test_a_file_over_the_size_cap_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(TWO_DC + "description: x\n" + "# padding\n" * 200_000)
    with pytest.raises(ScenarioError, match="is over 262144 bytes"):
        load_scenario(path)


def with_value(where: tuple, value) -> dict:
    """A copy of BASE with value at the path where (keys and list indices)."""
    doc = copy.deepcopy(BASE)
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return doc


@pytest.mark.unit
@pytest.mark.parametrize("value", [10**5000, -10**5000, 2**64], ids=["10^5000", "-10^5000", "2^64"])
@pytest.mark.parametrize("where", [("dcs", 0, "hosts"), ("wan", 0, "delay_ms"),
                                   ("wan", 0, "queue"), ("connections",)])
def test_huge_integers_are_one_short_line(value, where):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(with_value(where, value))
    assert len(str(err.value)) <= MAX_LINE_CHARS


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.unit
def test_duplicate_key_names_the_key_and_line(tmp_path):
    text = TWO_DC.replace("\nwan:", "\nwan: []\nwan:", 1)
    line = text.split("\n").index("wan:") + 1
    with pytest.raises(ScenarioError) as err:
        load_scenario(write(tmp_path, text))
    assert f"line {line}: key 'wan' appears twice" in str(err.value)


@pytest.mark.unit
def test_yaml_1_2_scalars(tmp_path):
    """`no` is a string (YAML 1.1: false), `1e2` a number (YAML 1.1: a string)."""
    text = ("name: t\ndcs: [{name: no, hosts: 1}, {name: on, hosts: 1}]\n"
            "wan: [{between: [no, on], delay_ms: 1e2, rate_mbit: 1e2}]\n")
    sc = load_scenario(write(tmp_path, text))
    assert [dc.name for dc in sc.dcs] == ["no", "on"]
    assert sc.wan[0].delay_ms == 100.0 and sc.wan[0].rate_mbit == 100.0


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted((REPO / "topologies").rglob("*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_scenarios_read_as_they_did_under_pyyaml(path):
    """No shipped file has a value YAML 1.1 and 1.2 read differently (no, on, 1e2, 0o17, 1:30)."""
    import yaml
    from testbed.spec.yamlfile import load_yaml
    old = yaml.safe_load(path.read_text())
    assert repr(load_yaml(path, "")) == repr(old)


@pytest.mark.unit
def test_deep_nesting_is_one_line(tmp_path):
    with pytest.raises(ScenarioError, match="line 1: nested deeper than 20 levels"):
        load_scenario(write(tmp_path, "name: " + "[" * 5000 + "]" * 5000 + "\n"))


@pytest.mark.loopback
@pytest.mark.parametrize("kind", ["binary", "directory", "nul"])
def test_binary_file_and_directory_exit_2(tmp_path, kind):
    path = tmp_path / "s.yaml"
    if kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "nul":
        path.write_bytes(b"name: \x00\n")
    else:
        path.mkdir()
    rc, lines, _, _ = bounded_cli("validate", str(path), timeout=20)
    assert_one_line(rc, lines, "error: scenario: ",
                    {"binary": "not UTF-8", "directory": "is a directory",
                     "nul": "not valid YAML"}[kind])
    assert "Error:" not in lines[0]


@pytest.mark.loopback
@pytest.mark.parametrize("command", [["run", "topologies/two_dc.yaml"],
                                     ["reproduce", "results"]])
def test_out_naming_a_file_exits_2_before_any_work(tmp_path, command):
    out = tmp_path / "taken"
    out.write_text("mine")
    rc, lines, _, _ = bounded_cli(*command, "--out", str(out), timeout=30)
    assert_one_line(rc, lines, "error: --out: ", "is not a folder")
    assert out.read_text() == "mine"


@pytest.mark.loopback
def test_validate_checks_every_file_and_names_it(tmp_path):
    bad_a = write(tmp_path, TWO_DC.replace("hosts: 2", "hosts: 0", 1), "bad_a.yaml")
    bad_b = write(tmp_path, TWO_DC.replace("delay_ms:", "delay_msec:", 1), "bad_b.yaml")
    proc = subprocess.run([sys.executable, "run_testbed.py", "validate", str(bad_a),
                           "topologies/two_dc.yaml", str(bad_b), "topologies/three_dc.yaml"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0].startswith(f"error: {bad_a}: dcs[0].hosts: ")
    assert proc.stderr.splitlines()[1].startswith(f"error: {bad_b}: wan[0].delay_msec: ")
    assert len(proc.stderr.splitlines()) == 2
    assert "topologies/two_dc.yaml: ok" in proc.stdout
    assert "topologies/three_dc.yaml: ok" in proc.stdout


@pytest.mark.unit
def test_unknown_field_suggests_the_nearest():
    doc = copy.deepcopy(BASE)
    doc["wan"][0]["delay_msec"] = doc["wan"][0].pop("delay_ms")
    with pytest.raises(ScenarioError, match=r"^wan\[0\]\.delay_msec: unknown field; did you "
                                            r"mean delay_ms\? use between, "):
        parse_scenario(doc)
    doc = copy.deepcopy(BASE)
    doc["sytems"] = ["baseline"]
    with pytest.raises(ScenarioError, match=r"^sytems: .*did you mean systems\?"):
        parse_scenario(doc)


@pytest.mark.unit
@pytest.mark.parametrize("key, message", [
    ("wan." + "9" * 5000 + ".delay_ms", "is past the 1 entries"),
    ("wan.delay_mss", "did you mean delay_ms?")])
def test_sweep_paths_are_checked_in_one_short_line(key, message):
    doc = {**copy.deepcopy(BASE), "sweep": {key: [1, 2]}}
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc)
    assert message in str(err.value) and len(str(err.value)) <= MAX_LINE_CHARS


@pytest.mark.loopback
def test_poisson_load_is_bounded(tmp_path):
    """A load that would draw 10^13 requests is one line, in little time and memory."""
    text = (REPO / "topologies" / "atlas_bubbletea.yaml").read_text().replace(
        "load: {trace: conv, rate_multiplier: 40, start_s: 600, window_s: 1800}",
        "load: {poisson_per_s: 10000000, window_s: 1000000}")
    path = write(tmp_path, text)
    for command in ("validate", "predict"):
        rc, lines, seconds, rss = bounded_cli(command, str(path), timeout=30)
        assert_one_line(rc, lines, "error: bubbletea.load: ", "draws about 1e+13 requests")
        assert seconds < 20 and rss < 300


@pytest.mark.unit
@pytest.mark.parametrize("queue", [3_000_000, "2000MB", "1500000 packets"])
def test_queue_is_bounded(queue):
    doc = copy.deepcopy(BASE)
    doc["wan"][0]["queue"] = queue
    with pytest.raises(ScenarioError, match=r"^wan\[0\]\.queue: .* is over 715827 packets"):
        parse_scenario(doc)
    doc["wan"][0]["queue"] = MAX_QUEUE_BYTES // MTU_BYTES
    assert parse_scenario(doc).wan[0].queue_bytes <= MAX_QUEUE_BYTES


@pytest.mark.unit
@pytest.mark.parametrize("field, value", [("iterations", 10**9), ("micro_batches", 10**6),
                                          ("replicas", 10**7), ("lr", float("inf")),
                                          ("seed", 2**64)])
def test_training_counts_are_bounded(field, value):
    from testbed.spec.training import TrainConfig
    d = {"model": {"n_layer": 2, "n_embd": 8, "n_head": 2, "seq_len": 8, "vocab_size": 16},
         "stages": 2, "micro_batches": 2, field: value}
    with pytest.raises(ScenarioError, match=rf"^training\.{field}: "):
        TrainConfig.from_dict(d)


@pytest.mark.unit
@pytest.mark.parametrize("section, entry, field", [
    ("faults", {"kind": "rate_trace", "link": ["a", "b"], "at_s": 0}, "faults[0]"),
    ("cross_traffic", {"from": "a", "to": "b", "kind": "udp", "stop_s": 5000},
     "cross_traffic[0].rate_trace")])
def test_rate_traces_are_bounded(section, entry, field):
    steps = [[t, 5] for t in range(1001)]
    doc = {**copy.deepcopy(BASE), section: [{**entry, ("steps" if section == "faults"
                                                        else "rate_trace"): steps}]}
    with pytest.raises(ScenarioError, match=rf"^{re.escape(field)}: "):
        parse_scenario(doc)
    doc[section][0]["steps" if section == "faults" else "rate_trace"] = steps[:1000]
    assert parse_scenario(doc)


# -- fuzzing: what found the above, as file text and as parsed documents -------------------

# built by map: hypothesis reprs a sampled_from's elements, and repr refuses 5000 digits
HUGE_INTS = st.integers() | st.builds(lambda n, sign: sign * 10**n,
                                      st.sampled_from([5000, 400, 20]), st.sampled_from([1, -1]))
VALUES = st.recursive(
    st.none() | st.booleans() | HUGE_INTS | st.floats() | st.text(max_size=20)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(max_size=10) | HUGE_INTS, inner, max_size=4),
    max_leaves=30)
FIELDS = [("name",), ("dcs",), ("dcs", 0, "hosts"), ("wan", 0, "queue"), ("wan", 0, "between"),
          ("wan", 0, "rate_mbit"), ("systems",), ("training",), ("sweep",), ("faults",),
          ("cross_traffic",), ("bubbletea",)]


def check_loads(load) -> None:
    try:
        assert isinstance(load(), Scenario)
    except ScenarioError as exc:
        text = str(exc)
        assert text and "\n" not in text and len(text) <= MAX_LINE_CHARS, text[:400]


@pytest.mark.unit
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS), VALUES)
def test_any_value_in_any_field_is_one_short_line(where, value):
    doc = with_value(where, value)
    check_loads(lambda: parse_scenario(doc))


FRAGMENTS = st.sampled_from([
    "&a ", "*a", "[", "]", "{", "}", ": ", "- ", "\n", "\n  ", "! ", "!!binary ", "!!set ",
    "? ", "<<: ", "---\n", "...\n", "'", '"', "1e2", "no", "0o17", "1:30", "9" * 5000, "\t",
    "name: t\n", "dcs: [{name: a, hosts: 1}]\n", "wan: []\n", "wan:\n", "dcs:\n", "\x00",
    "\ufeff", "\x85", "#", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n"])


@pytest.mark.unit
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FRAGMENTS, max_size=40).map("".join) | st.binary(max_size=200))
def test_any_file_is_a_scenario_or_one_short_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    check_loads(lambda: load_scenario(path))
