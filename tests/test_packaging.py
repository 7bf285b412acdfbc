"""pyproject.toml's pins are requirements.txt's: the runtime dependencies and the dev extra name
the direct dependencies, requirements.txt is the full lock scripts/setup.sh installs, and the
two never drift apart. The environment running the tests holds what requirements.txt pins."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def lock() -> dict[str, str]:
    """requirements.txt: canonical name -> pinned version; every line an exact pin, once."""
    pins: dict[str, str] = {}
    for n, line in enumerate((REPO / "requirements.txt").read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert m, f"requirements.txt:{n}: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"requirements.txt:{n}: {name} pinned twice"
        pins[name] = m.group(2)
    return pins


def declared() -> list[tuple[str, str]]:
    project = PYPROJECT["project"]
    return ([("dependencies", r) for r in project["dependencies"]]
            + [(f"optional-dependencies.{extra}", r)
               for extra, reqs in project["optional-dependencies"].items() for r in reqs])


def test_every_pyproject_pin_is_requirements_txts():
    pins = lock()
    wrong = []
    for where, text in declared():
        req = Requirement(text)
        spec = list(req.specifier)
        name = canonicalize_name(req.name)
        if len(spec) != 1 or spec[0].operator != "==":
            wrong.append(f"[project] {where}: {text!r} is not an exact pin")
        elif name not in pins:
            wrong.append(f"[project] {where}: {text!r} is not in requirements.txt")
        elif spec[0].version != pins[name]:
            wrong.append(f"[project] {where}: {text!r}, requirements.txt: {name}=={pins[name]}")
    assert not wrong, "\n".join(wrong)


def test_runtime_and_dev_are_split_and_the_tools_are_dev():
    runtime = {canonicalize_name(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    dev = {canonicalize_name(Requirement(r).name)
           for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert not runtime & dev, runtime & dev
    assert {"pytest", "pytest-timeout", "hypothesis", "ruff", "import-linter", "grimp"} <= dev
    assert "torch" in runtime and "pytest" not in runtime


def test_the_console_script_is_the_cli(monkeypatch):
    """geodc (the console script) and run_testbed.py run one main: run_testbed's only wraps it
    (a missing package as one line)."""
    target = PYPROJECT["project"]["scripts"]["geodc"]
    module, _, attr = target.partition(":")
    mod = importlib.import_module(module)
    assert callable(getattr(mod, attr))
    calls = []
    monkeypatch.setattr(mod, attr, lambda argv=None: calls.append(argv) or 7)
    from run_testbed import main as run_testbed_main
    assert run_testbed_main(["list"]) == 7 and calls == [["list"]]


def test_the_environment_holds_what_requirements_txt_pins():
    """What scripts/setup.sh installed is the lock (a local build label, torch's +cpu, aside)."""
    wrong = []
    for name, pinned in lock().items():
        try:
            got = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name}=={pinned}: not installed")
            continue
        if Version(got).public != Version(pinned).public:
            wrong.append(f"{name}=={pinned}: {got} installed")
    assert not wrong, "run `make setup` (scripts/setup.sh):\n" + "\n".join(wrong)


def hashed(path: Path) -> dict[str, tuple[str, list[str]]]:
    """A --require-hashes file: canonical name -> (pinned version, its sha256 hashes); every
    requirement an exact pin with at least one hash."""
    reqs: dict[str, tuple[str, list[str]]] = {}
    for line in re.sub(r"\\\n", " ", path.read_text()).splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)",
                         line)
        assert m, f"{path.name}: {line!r} is not name==version --hash=sha256:<64 hex> ..."
        reqs[canonicalize_name(m.group(1))] = (m.group(2), re.findall(r"[0-9a-f]{64}", m.group(3)))
    return reqs


def test_the_container_installs_requirements_txt_with_hashes():
    """requirements-container.txt (scripts/pin_hashes.py) pins exactly requirements.txt's
    versions, plus setuptools and pip, each with its file's sha256, and the Dockerfile,
    scripts/setup.sh (GEODC_PIP_HASHES) and scripts/container_check.sh install or fetch
    from it with --require-hashes (issue 38: pip chose a planted wheel from the cache)."""
    reqs = hashed(REPO / "requirements-container.txt")
    assert {n: v for n, (v, _) in reqs.items()} == {**lock(), "setuptools": reqs["setuptools"][0],
                                                     "pip": reqs["pip"][0]}
    assert Version(reqs["setuptools"][0]) >= Version("77.0.3")     # torch's Requires-Dist
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "pip install -q --require-hashes -r requirements-container.txt" in dockerfile
    assert "ENV GEODC_PIP_HASHES=requirements-container.txt" in dockerfile
    assert not re.search(r"pip install[^\n]* -r requirements\.txt", dockerfile)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert 'pip install -q --require-hashes -r "$GEODC_PIP_HASHES"' in setup
    check = (REPO / "scripts" / "container_check.sh").read_text()
    assert "pip download -q --require-hashes -r requirements-container.txt" in check
    assert "pip wheel" not in check


def test_virtme_ngs_hash_list_pins_stock_kernels_version():
    reqs = hashed(REPO / "requirements-virtme-ng.txt")
    text = (REPO / "scripts" / "stock_kernel.py").read_text()
    pinned = re.search(r'^VIRTME_NG = "virtme-ng==([^"]+)"', text, re.M).group(1)
    assert reqs["virtme-ng"][0] == pinned
    assert f'VIRTME_NG = "virtme-ng=={pinned}"' in (REPO / "scripts" / "pin_hashes.py").read_text()
    assert {"requests", "argcomplete"} <= set(reqs)
