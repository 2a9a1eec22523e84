"""The gateway and the simulator stand apart: the gateway never imports kvsim (the CLI loads it only to run
``kvgate sim`` / ``kvgate demo``), and it reads the simulated GPU through an exporter URL like a real one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config.settings import BackendSettings

ROOT = Path(__file__).resolve().parents[2]
LAZY_ALLOWED = {"cli/main.py", "cli/demo.py"}  # they load the simulator inside the functions that run it

PROBE = """
import sys
import gateway.app, gateway.cli.main, gateway.cli.demo, gateway.backends.probes, gateway.config.settings
loaded = sorted(m for m in sys.modules if m == "kvsim" or m.startswith("kvsim."))
print(",".join(loaded))
"""


def test_importing_the_gateway_loads_no_simulator() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"gateway imports loaded {done.stdout.strip()}"


def _kvsim_imports(tree: ast.AST) -> list[tuple[ast.stmt, bool]]:
    """Every import of kvsim, with whether it is deferred: inside a function, or under ``if TYPE_CHECKING:`` (read
    by the type checker only, never run)."""
    found: list[tuple[ast.stmt, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
                isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING")
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0:
                names = [child.module or ""]
            if any(name == "kvsim" or name.startswith("kvsim.") for name in names):
                assert isinstance(child, ast.stmt)
                found.append((child, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def test_no_gateway_module_imports_kvsim_at_module_level() -> None:
    files = sorted((ROOT / "gateway").rglob("*.py"))
    assert len(files) > 20
    offences = []
    for path in files:
        for node, in_function in _kvsim_imports(ast.parse(path.read_text(), str(path))):
            if not in_function or path.relative_to(ROOT / "gateway").as_posix() not in LAZY_ALLOWED:
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offences == []


def test_the_check_sees_an_import_at_module_level() -> None:
    source = "import os\nfrom kvsim.app import x\nif True:\n    import kvsim\ndef f():\n    import kvsim.runner\n"
    tree = ast.parse(source)
    assert [(node.lineno, inner) for node, inner in _kvsim_imports(tree)] == [(2, False), (4, False), (6, True)]


def test_vram_sim_is_refused_pointing_at_the_exporter_url() -> None:
    with pytest.raises(ValidationError, match="/sim/metrics"):
        BackendSettings(name="gpu", url="http://127.0.0.1:11434", vram="sim")
    settings = BackendSettings(name="gpu", url="http://127.0.0.1:11434", vram="http://127.0.0.1:11434/sim/metrics")
    assert settings.vram == "http://127.0.0.1:11434/sim/metrics"
