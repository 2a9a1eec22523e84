"""Issue 24, point 6: layers a test holds.

The pure layers load no I/O: importing the domain, the dialects, the planner, trimming and summarizing, or the memory
math loads neither aiohttp nor asyncio nor redis; kvsim loads of the gateway only the GGUF reader and the tokenizer
conversion. Each import runs in a fresh interpreter. Before the package facades became lazy (gateway/support/lazy.py):
``import gateway.dialects`` loaded 59 gateway modules and aiohttp, the planner redis and asyncio, kvsim 51 gateway
modules.

The packages form layers: their import graph has no cycle, and each package imports only those below it in
``LAYERS``. Before issue 24's fix, 10 packages formed one cycle (admission, backends, config, dialects, edge, fitting,
loads, memory, observability, tokens) and 11 package edges pointed up against ``LAYERS``."""

from __future__ import annotations

import ast
import functools
import itertools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

HEAVY = ("aiohttp", "asyncio", "redis")
PURE = ["gateway.domain", "gateway.dialects", "gateway.admission.planner", "gateway.fitting.trim",
        "gateway.fitting.summary_fit", "gateway.memory.kv", "gateway.memory.fit_estimate"]
KVSIM_MAY_LOAD = {"gateway", "gateway.support", "gateway.support.gguf_reader", "gateway.support.lazy", "gateway.tokens",
                  "gateway.tokens.gguf_vocab", "gateway.tokens.pretokenizers", "gateway.tokens.spm_merges",
                  "gateway.tokens.tokenizer_cache",
                  "gateway.tokens.vocab_attrs"}


def _loaded(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(result.stdout))


@pytest.mark.parametrize("module", PURE)
def test_a_pure_layer_loads_no_io(module: str) -> None:
    loaded = _loaded(module)
    gateway_modules = [m for m in loaded if m.startswith("gateway")]
    print(f"\n  import {module}: {len(gateway_modules)} gateway modules; "
          f"{ {h: h in loaded for h in HEAVY} }")
    assert not [h for h in HEAVY if h in loaded]


def test_kvsim_takes_only_the_gguf_reader_and_the_tokenizer_conversion() -> None:
    gateway_modules = {m for m in _loaded("kvsim") if m.startswith("gateway")}
    print(f"\n  import kvsim: {sorted(gateway_modules)}")
    assert gateway_modules <= KVSIM_MAY_LOAD, sorted(gateway_modules - KVSIM_MAY_LOAD)


# The package graph (issue 24, point 6, its other half). A node is the first path component under gateway/: a package
# (admission, memory, ...) or a module of the root (domain, proxy, ...). An edge is an import that runs: every
# ``import gateway.X`` and ``from gateway.X import`` (``from gateway import X`` too), wherever it sits, a function
# body included; an import under ``if TYPE_CHECKING:`` is left out (it names a type for mypy and never runs: such
# imports are printed). Read with ast, so nothing is imported.

GATEWAY = Path(__file__).resolve().parents[1] / "gateway"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "domain", "errors"),  # the root's leaves: the version, the request's data, the one error tree
    ("support",),        # helpers with no home of their own: GGUF reader, safe text, hop-by-hop headers, lazy facades
    ("memory",),         # KV bytes, load cost, VRAM readings: the math every later layer sizes things with
    ("config",),         # the settings, validated in memory's terms (cache types, sizes), and their reload
    ("backends",),       # the HTTP client, the registry, probes, the exporter VRAM source
    ("tokens",),         # the counters, some of which ask a backend
    ("dialects",),       # each API's bodies, parsed once (they count text with tokens' rules)
    ("fitting",),        # rewrites, trims and summaries of a parsed request
    ("loads",),          # the load level: may a model load on the GPU now
    ("runtimes",),       # one runtime per backend kind
    ("admission",),      # the sequence level: tenants, pools, planner, ledger, waiting room
    ("notice",),         # the line a reply gets when kvgate left something out (reads the admission outcome)
    ("routing",),        # which backend serves a request when several can
    ("observability",),  # metrics, logs, status, rendered from what the layers below decided
    ("edge",),           # the HTTP edge: serving, targets, routes, headers, bodies, the error boundary
    ("api",),            # kvgate's own routes
    ("streaming",),      # the root's top: the relay of the answer
    ("proxy",),          # the request path, which relays through streaming
    ("app",),            # create_app, which wires the proxy and the routes
    ("cli",),            # the command line: kvgate serve starts the app
    ("__main__",),       # python -m gateway
)
"""Bottom to top: a node may import only nodes of a lower row. A row of several holds peers that import none of
each other. A package not here yet (runtimes, while it is being written) is simply absent."""


@dataclass(frozen=True, slots=True)
class Import:
    file: str
    """The importing file, under gateway/."""
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module}"


def _node_of_file(relative: Path) -> str:
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _node_of_module(module: str) -> str | None:
    """The node a ``gateway.…`` module belongs to; None outside the gateway."""
    parts = module.split(".")
    if parts[0] != "gateway":
        return None
    if len(parts) == 1:
        return "__init__"
    if (GATEWAY / parts[1] / "__init__.py").is_file() or (GATEWAY / f"{parts[1]}.py").is_file():
        return parts[1]
    return "__init__"  # a name of gateway/__init__.py itself (``from gateway import __version__``)


def _under_type_checking(tree: ast.Module) -> set[int]:
    """The ids of every node inside an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) block."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                hidden.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return hidden


def _modules(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The gateway modules one import statement names (a relative import resolved against ``package``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    if base == "gateway":  # from gateway import dialects
        return [f"gateway.{alias.name}" for alias in node.names]
    return [base]


@functools.cache
def _sources() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the gateway, parsed once: its path under gateway/ and its tree."""
    return tuple((path.relative_to(GATEWAY), ast.parse(path.read_text(), str(path)))
                 for path in sorted(GATEWAY.rglob("*.py")))


def _imports(*, type_only: bool = False) -> dict[tuple[str, str], list[Import]]:
    """Every edge between two nodes, with the imports that make it: those that run, or with ``type_only`` those
    under ``if TYPE_CHECKING:``."""
    edges: dict[tuple[str, str], list[Import]] = {}
    for relative, tree in _sources():
        package = ".".join(("gateway", *relative.parent.parts))
        hidden = _under_type_checking(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or (id(node) in hidden) != type_only:
                continue
            for module in _modules(node, package):
                source, target = _node_of_file(relative), _node_of_module(module)
                if target is not None and target != source:
                    edges.setdefault((source, target), []).append(Import(str(relative), node.lineno, module))
    return edges


def _packages() -> set[str]:
    return {path.parent.name for path in GATEWAY.glob("*/__init__.py")}


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as its nodes in order, the first repeated at the end; None when it has none."""
    done: set[str] = set()
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in path:
                return [*path[path.index(target):], target]
            if target not in done and (found := walk(target)) is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (found := walk(start)) is not None:
            return found
    return None


def test_the_package_graph_has_no_cycle() -> None:
    """Packages only (the root's modules are no nodes here; the next test places them)."""
    packages = _packages()
    edges = {edge: why for edge, why in _imports().items() if set(edge) <= packages}
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    print(f"\n  {len(packages)} packages, {len(edges)} edges between them")
    cycle = _a_cycle(graph)
    if cycle is not None:
        hops = list(itertools.pairwise(cycle))
        lines = [f"{a} -> {b}: " + "; ".join(str(i) for i in edges[(a, b)][:3]) for a, b in hops]
        pytest.fail("the packages import each other in a cycle: " + " -> ".join(cycle) + "\n  " + "\n  ".join(lines))


def test_packages_import_only_lower_layers() -> None:
    """``LAYERS``: every node in one row, and every import pointing down. An import under ``if TYPE_CHECKING:`` may
    point up (it never runs); those are printed, for the next change that can do without them."""
    row = {node: number for number, nodes in enumerate(LAYERS) for node in nodes}
    nodes = {_node_of_file(relative) for relative, _ in _sources()}
    print("\n  layers, bottom to top:")
    for number, placed in enumerate(LAYERS):
        print(f"  {number:>4}  " + ", ".join(node if node in nodes else f"({node}: not here)" for node in placed))
    unplaced = sorted(nodes - row.keys())
    assert not unplaced, f"{unplaced}: in no row of LAYERS; add each where it belongs (it may import only rows below)"
    upward = [f"{a} (row {row[a]}) -> {b} (row {row[b]}): " + "; ".join(str(i) for i in why)
              for (a, b), why in sorted(_imports().items()) if row[b] >= row[a]]
    for (a, b), why in sorted(_imports(type_only=True).items()):
        if row[b] >= row[a]:
            print(f"  type only, pointing up: {a} -> {b}: " + "; ".join(str(i) for i in why))
    if upward:
        pytest.fail("imports that point up or sideways:\n  " + "\n  ".join(upward))
