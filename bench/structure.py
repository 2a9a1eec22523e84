"""The code structure of kvgate checkouts, side by side, as one Markdown table (and a details section under it).

    python bench/structure.py ROOT [ROOT2 ...]

One column per ROOT (a checkout: ROOT/gateway, ROOT/tests, ROOT/kvsim). Every row is a static ``ast`` walk of the
``.py`` files (or, for row 2, an import in a fresh child interpreter), so anyone can repeat it. "Modules" are the
``.py`` files under ``ROOT/gateway`` (``__init__.py`` included unless a row says otherwise); "lines" are
``len(text.splitlines())`` (what ``wc -l`` prints, give or take a last line without a newline).

1. Packages in import cycles. Nodes: the packages of ``gateway/``, a package being the first path component under
   ``gateway/`` (``gateway/admission/shared/pools.py`` belongs to ``admission``). Modules directly at the
   ``gateway/`` root (``gateway/errors.py``, ``gateway/lazy.py``...) are left out of the graph, both as importers and
   as imported. Edges: every ``import gateway.X...`` and ``from gateway.X... import ...`` (``from gateway import X``
   meaning ``gateway.X``; relative imports resolved), wherever it stands: inside functions, under ``try`` and under
   ``if TYPE_CHECKING:``; imports within one package are no edge. Two numbers: the packages in strongly connected
   components of more than one package with all imports, and with runtime imports only (the body of every
   ``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:`` left out). The names a lazy facade imports at first use
   (``_EXPORTS`` strings, ``gateway/lazy.py``) are strings, not imports, and make no edge. The details list each
   component, every package edge inside it with its number of imports (an import statement counts once per module
   it names), fewest first: the cheapest to cut; and, for the thinnest few, the imports behind them (module ->
   module, line).
2. What an import loads: ``[python, "-c", ...]`` with cwd=ROOT and PYTHONPATH=ROOT imports the module and prints the
   new entries of ``sys.modules``: the count of ``gateway`` and ``gateway.*`` names, and which of aiohttp, asyncio,
   redis are new. "-" when the module has no file at ROOT. The child python is ``--python`` (default: the one
   running this script).
3. Functions and methods in ``gateway/`` (``def``/``async def``, nested ones included, lambdas not) with more than 6
   parameters: positional-only, positional, keyword-only, ``*args`` and ``**kwargs`` each count 1, a first
   positional ``self``/``cls`` does not. The details: the top 8 as ``module:qualname (count)``.
4. ``BackendKind`` comparisons in ``gateway/``: ``ast.Compare`` nodes with an ``is``/``is not``/``==``/``!=`` one of
   whose two sides is an attribute of the name ``BackendKind`` (``kind is BackendKind.OLLAMA``), or an ``in``/``not
   in`` against a tuple/list/set literal holding one (``kind in (BackendKind.A, BackendKind.B)``); one per Compare
   node, and the number of modules holding them. Beside it, in ``gateway/check/`` (later ``gateway/cli/check/``):
   Compare nodes of the same operators with a ``str`` constant operand (or, for ``in``, such a constant in the
   literal) equal to a kind name: "ollama", "llama-server", "llama_server", "llamacpp", "openai"; count and
   ``path:line``.
5. Error bodies built outside the error boundary: calls in ``gateway/`` (not the boundary,
   ``gateway/error_boundary.py`` or later ``gateway/edge/error_boundary.py``, ``gateway/errors.py`` nor
   ``gateway/dialects/``) to ``web.json_response(...)``, ``web.Response(...)`` or a bare ``json_response(...)`` whose
   arguments (positional or keyword, at any depth) hold a dict literal with the str key "error", or a name or
   attribute whose identifier contains "error" (any case). Count and ``path:line``.
6. Modules at the ``gateway/`` root: ``gateway/*.py`` less ``__init__.py`` and ``__main__.py``.
7. Module base names (file name without ``.py``) used by more than one module in ``gateway/``, ``__init__.py``
   left out: how many such names, and each with its count.
8. Modules of more than 400 lines (count, names in the details), and of 350 to 400 lines inclusive (count).
9. Sleeps in tests: calls ``asyncio.sleep(...)`` and ``time.sleep(...)`` (an attribute ``sleep`` on the name
   ``asyncio`` or ``time``) in ``tests/``, and how many of them sleep a literal 0 (a yield, not a wait). Beside it:
   ``monkeypatch.setattr(...)`` calls in ``tests/`` whose first argument is a name a file imports from ``gateway``
   or ``kvsim`` (``from gateway.x import y [as z]``, ``import gateway.x [as z]``), an attribute chain on such a name,
   or a str constant starting with "gateway." or "kvsim.".
10. Test files under ``tests/gateway/`` and under ``tests/e2e/`` (``test_*.py``; end-to-end tests moved there from
    tests/gateway/ when tests came to mirror the package), and the lines of every ``.py`` there over the lines of
    every ``.py`` under ``tests/``.
11. Lines and modules in ``gateway/``: every ``.py`` under it.

The grep approximations (they also match comments and strings): ``grep -rhoE '(asyncio|time)\\.sleep\\(' tests |
wc -l``; ``grep -rn 'BackendKind\\.' gateway``; ``ls gateway/*.py``; ``find gateway -name '*.py' | xargs wc -l``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

MANY_PARAMETERS = 6
TOP_FUNCTIONS = 8
LONG_MODULE = 400
NEARLY_LONG_MODULE = 350
EDGES_PER_CYCLE = 6
IMPORTS_PER_EDGE = 2
PROBED_IMPORTS = ("gateway.dialects", "gateway.domain", "gateway.admission.planner", "gateway.fitting.trim", "kvsim")
HEAVY_MODULES = ("aiohttp", "asyncio", "redis")
KIND_NAMES = frozenset({"ollama", "llama-server", "llama_server", "llamacpp", "openai"})
BOUNDARY_FILES = ("gateway/error_boundary.py", "gateway/edge/error_boundary.py", "gateway/errors.py")
BOUNDARY_DIRS = ("gateway/dialects/",)
PROJECT_PACKAGES = ("gateway", "kvsim")
CHILD_TIMEOUT_S = 120

CHILD_PROBE = """
import importlib, json, sys
before = set(sys.modules)
importlib.import_module(sys.argv[1])
new = set(sys.modules) - before
print(json.dumps({"gateway": sorted(m for m in new if m == "gateway" or m.startswith("gateway.")),
                  "heavy": [m for m in sys.argv[2:] if m in new]}))
"""


@dataclass(frozen=True)
class Module:
    """One parsed ``.py`` file of a checkout."""

    name: str  # dotted: gateway.admission.planner
    relpath: str  # from the checkout root, with "/": gateway/admission/planner.py
    tree: ast.Module
    lines: int

    @property
    def is_package_init(self) -> bool:
        return self.relpath.endswith("/__init__.py")


@dataclass(frozen=True)
class Checkout:
    root: Path
    python: str
    gateway: list[Module]
    tests: list[Module]


@dataclass
class Cell:
    value: str
    details: list[str] = field(default_factory=list)


Row = tuple[str, Cell]


# --- reading a checkout -------------------------------------------------------------------------------------------


def dotted_name(relpath: Path) -> str:
    parts = list(relpath.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load_modules(root: Path, directory: str) -> list[Module]:
    modules = []
    for path in sorted((root / directory).rglob("*.py")):
        relpath = path.relative_to(root)
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        modules.append(Module(dotted_name(relpath), relpath.as_posix(), tree, len(text.splitlines())))
    return modules


def load_checkout(root: Path, python: str) -> Checkout:
    return Checkout(root, python, load_modules(root, "gateway"), load_modules(root, "tests"))


def module_exists(root: Path, dotted: str) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def nodes_in_order(tree: ast.AST) -> list[ast.AST]:
    """``ast.walk``'s nodes in source order (it walks breadth first)."""
    return sorted(ast.walk(tree), key=lambda node: (getattr(node, "lineno", 0), getattr(node, "col_offset", 0)))


# --- row 1: import cycles between packages ------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted
    line: int
    type_only: bool


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import under ``node``, with whether it stands in the body of an ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, type_only
        elif isinstance(child, ast.If) and is_type_checking(child.test):
            for statement in child.body:
                yield from import_nodes_of_statement(statement, True)
            for statement in child.orelse:
                yield from import_nodes_of_statement(statement, type_only)
        else:
            yield from import_nodes(child, type_only)


def import_nodes_of_statement(
    statement: ast.stmt, type_only: bool
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    if isinstance(statement, ast.Import | ast.ImportFrom):
        yield statement, type_only
    else:
        yield from import_nodes(statement, type_only)


def absolute_from(module: Module, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports resolved against ``module``."""
    if node.level == 0:
        return node.module or ""
    package = module.name.split(".") if module.is_package_init else module.name.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(module: Module, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    source = absolute_from(module, node)
    # from gateway.pkg import mod -> gateway.pkg.mod when it is a module; else the names come from gateway.pkg
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names]


def gateway_edges(modules: list[Module]) -> list[Edge]:
    known = {module.name for module in modules}
    edges = []
    for module in modules:
        for node, type_only in import_nodes(module.tree):
            for target in dict.fromkeys(imported_modules(module, node, known)):  # one per statement and module
                if target.startswith("gateway."):
                    edges.append(Edge(module.name, target, node.lineno, type_only))
    return edges


def package_of(dotted: str, packages: set[str]) -> str | None:
    """``admission`` for ``gateway.admission.shared.pools``; None for a module at the gateway root."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in packages else None


def package_names(checkout: Checkout) -> set[str]:
    return {path.name for path in (checkout.root / "gateway").iterdir() if (path / "__init__.py").is_file()}


def package_graph(edges: list[Edge], packages: set[str]) -> dict[tuple[str, str], list[Edge]]:
    graph: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for edge in edges:
        source, target = package_of(edge.source, packages), package_of(edge.target, packages)
        if source is not None and target is not None and source != target:
            graph[source, target].append(edge)
    return graph


def strongly_connected(nodes: set[str], arcs: set[tuple[str, str]]) -> list[list[str]]:
    """Tarjan's algorithm; each component sorted, the components in the order they close."""
    successors: dict[str, list[str]] = defaultdict(list)
    for source, target in sorted(arcs):
        successors[source].append(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in successors[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return components


def describe_cycle(component: list[str], graph: dict[tuple[str, str], list[Edge]]) -> list[str]:
    inside = [(arc, edges) for arc, edges in graph.items() if arc[0] in component and arc[1] in component]
    inside.sort(key=lambda item: (len(item[1]), item[0]))
    lines = [
        f"cycle of {len(component)}: {', '.join(component)}",
        f"  its {len(inside)} package edges (imports): "
        + ", ".join(f"{source}->{target} ({len(edges)})" for (source, target), edges in inside),
        "  the thinnest, with imports behind them:",
    ]
    for (source, target), edges in inside[:EDGES_PER_CYCLE]:
        examples = "; ".join(f"{e.source} -> {e.target} (line {e.line})" for e in edges[:IMPORTS_PER_EDGE])
        lines.append(f"    {source} -> {target}: {examples}")
    return lines


def cycle_cell(edges: list[Edge], packages: set[str]) -> Cell:
    graph = package_graph(edges, packages)
    components = [c for c in strongly_connected(packages, set(graph)) if len(c) > 1]
    details = [line for component in components for line in describe_cycle(component, graph)]
    names = " / ".join(", ".join(component) for component in components)
    return Cell(f"{sum(map(len, components))} ({names})" if components else "0", details)


def import_cycle_rows(checkout: Checkout) -> list[Row]:
    edges = gateway_edges(checkout.gateway)
    packages = package_names(checkout)
    runtime = [edge for edge in edges if not edge.type_only]
    return [
        ("packages in import cycles, all imports", cycle_cell(edges, packages)),
        ("packages in import cycles, runtime imports", cycle_cell(runtime, packages)),
    ]


# --- row 2: what an import loads ----------------------------------------------------------------------------------


def probe_import(checkout: Checkout, dotted: str) -> Cell:
    if not module_exists(checkout.root, dotted):
        return Cell("-")
    env = {**os.environ, "PYTHONPATH": str(checkout.root), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [checkout.python, "-c", CHILD_PROBE, dotted, *HEAVY_MODULES],
        cwd=checkout.root, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False,
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return Cell("error", [f"{dotted}: {last}"])
    loaded = json.loads(result.stdout)
    heavy = ", ".join(loaded["heavy"]) or "none of " + "/".join(HEAVY_MODULES)
    return Cell(f"{len(loaded['gateway'])} ({heavy})")


def import_load_rows(checkout: Checkout) -> list[Row]:
    return [(f"gateway modules loaded by `import {dotted}`", probe_import(checkout, dotted)) for dotted in
            PROBED_IMPORTS]


# --- row 3: functions with many parameters ------------------------------------------------------------------------

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, FunctionNode]]:
    """Every function under ``node`` with its qualified name (``Class.method``, ``outer.inner``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, FunctionNode):
            yield prefix + child.name, child
            yield from functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from functions(child, f"{prefix}{child.name}.")
        else:
            yield from functions(child, prefix)


def parameter_count(arguments: ast.arguments) -> int:
    positional = [*arguments.posonlyargs, *arguments.args]
    if positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    starred = int(arguments.vararg is not None) + int(arguments.kwarg is not None)
    return len(positional) + len(arguments.kwonlyargs) + starred


def many_parameter_rows(checkout: Checkout) -> list[Row]:
    counted = [
        (parameter_count(function.args), f"{module.name}:{qualname}")
        for module in checkout.gateway
        for qualname, function in functions(module.tree)
    ]
    many = sorted(((count, name) for count, name in counted if count > MANY_PARAMETERS), key=lambda c: (-c[0], c[1]))
    details = [f"{name} ({count})" for count, name in many[:TOP_FUNCTIONS]]
    return [(f"functions with more than {MANY_PARAMETERS} parameters", Cell(str(len(many)), details))]


# --- row 4: BackendKind comparisons -------------------------------------------------------------------------------

EQUALITY_OPS = (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)
MEMBERSHIP_OPS = (ast.In, ast.NotIn)


def literal_elements(node: ast.expr) -> list[ast.expr]:
    return list(node.elts) if isinstance(node, ast.Tuple | ast.List | ast.Set) else []


def compare_matches(compare: ast.Compare, matches: Callable[[ast.expr], bool]) -> bool:
    """Whether an ``is``/``==``-like operator has an operand ``matches`` accepts, or an ``in`` a literal holding one."""
    operands = [compare.left, *compare.comparators]
    for position, op in enumerate(compare.ops):
        left, right = operands[position], operands[position + 1]
        if isinstance(op, EQUALITY_OPS) and (matches(left) or matches(right)):
            return True
        if isinstance(op, MEMBERSHIP_OPS) and any(matches(element) for element in literal_elements(right)):
            return True
    return False


def is_backend_kind(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "BackendKind"


def is_kind_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KIND_NAMES


def matching_compares(module: Module, matches: Callable[[ast.expr], bool]) -> list[int]:
    return [
        node.lineno
        for node in nodes_in_order(module.tree)
        if isinstance(node, ast.Compare) and compare_matches(node, matches)
    ]


def backend_kind_rows(checkout: Checkout) -> list[Row]:
    per_module = {module.relpath: matching_compares(module, is_backend_kind) for module in checkout.gateway}
    holding = {path: lines for path, lines in per_module.items() if lines}
    total = sum(map(len, holding.values()))
    details = [f"{path}: {len(lines)}" for path, lines in sorted(holding.items(), key=lambda item: -len(item[1]))]
    check = [module for module in checkout.gateway  # the check tool, later gateway/cli/check/
             if module.relpath.startswith(("gateway/check/", "gateway/cli/check/"))]
    strings = [f"{m.relpath}:{line}" for m in check for line in matching_compares(m, is_kind_name)]
    return [
        ("`BackendKind.X` comparisons (modules)", Cell(f"{total} ({len(holding)})", details)),
        ("kind-name string comparisons in the check tool", Cell(str(len(strings)), strings)),
    ]


# --- row 5: error bodies outside the boundary ---------------------------------------------------------------------

RESPONSE_ATTRIBUTES = ("json_response", "Response")


def is_response_call(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "json_response"
    return (
        isinstance(func, ast.Attribute)
        and func.attr in RESPONSE_ATTRIBUTES
        and isinstance(func.value, ast.Name)
        and func.value.id == "web"
    )


def mentions_error(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Dict) and any(
            isinstance(key, ast.Constant) and key.value == "error" for key in inner.keys
        ):
            return True
        if isinstance(inner, ast.Name) and "error" in inner.id.lower():
            return True
        if isinstance(inner, ast.Attribute) and "error" in inner.attr.lower():
            return True
    return False


def inside_boundary(module: Module) -> bool:
    return module.relpath in BOUNDARY_FILES or module.relpath.startswith(BOUNDARY_DIRS)


def error_body_rows(checkout: Checkout) -> list[Row]:
    found = [
        f"{module.relpath}:{node.lineno}"
        for module in checkout.gateway
        if not inside_boundary(module)
        for node in nodes_in_order(module.tree)
        if isinstance(node, ast.Call)
        and is_response_call(node)
        and any(mentions_error(argument) for argument in [*node.args, *(k.value for k in node.keywords)])
    ]
    return [("error bodies built outside the error boundary", Cell(str(len(found)), found))]


# --- rows 6 to 8: modules, names, lengths -------------------------------------------------------------------------


def root_module_rows(checkout: Checkout) -> list[Row]:
    names = [
        module.relpath.removeprefix("gateway/")
        for module in checkout.gateway
        if module.relpath.count("/") == 1 and module.relpath not in ("gateway/__init__.py", "gateway/__main__.py")
    ]
    return [("modules at the gateway/ root", Cell(str(len(names)), [", ".join(names)]))]


def duplicate_name_rows(checkout: Checkout) -> list[Row]:
    stems = Counter(Path(module.relpath).stem for module in checkout.gateway if not module.is_package_init)
    repeated = sorted((name, count) for name, count in stems.items() if count > 1)
    details = [", ".join(f"{name} ({count})" for name, count in repeated)] if repeated else []
    return [("module base names used more than once", Cell(str(len(repeated)), details))]


def module_length_rows(checkout: Checkout) -> list[Row]:
    long = sorted(((m.lines, m.relpath) for m in checkout.gateway if m.lines > LONG_MODULE), reverse=True)
    nearly = [m for m in checkout.gateway if NEARLY_LONG_MODULE <= m.lines <= LONG_MODULE]
    return [
        (f"modules over {LONG_MODULE} lines", Cell(str(len(long)), [f"{path} ({lines})" for lines, path in long])),
        (f"modules of {NEARLY_LONG_MODULE} to {LONG_MODULE} lines", Cell(str(len(nearly)))),
    ]


# --- rows 9 and 10: tests -----------------------------------------------------------------------------------------


def sleep_calls(module: Module) -> Iterator[ast.Call]:
    for node in ast.walk(module.tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "sleep"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("asyncio", "time")
        ):
            yield node


def sleeps_zero(call: ast.Call) -> bool:
    return bool(call.args) and isinstance(call.args[0], ast.Constant) and call.args[0].value == 0


def is_project(dotted: str) -> bool:
    return any(dotted == package or dotted.startswith(package + ".") for package in PROJECT_PACKAGES)


def project_names(tree: ast.Module) -> set[str]:
    """The names a test file binds to something imported from gateway or kvsim."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and is_project(node.module or ""):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names if is_project(alias.name))
    return names


def root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def patches_project(call: ast.Call, names: set[str]) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "setattr" and root_name(func.value) == "monkeypatch"):
        return False
    if not call.args:
        return False
    target = call.args[0]
    if isinstance(target, ast.Constant) and isinstance(target.value, str):
        return target.value.startswith(("gateway.", "kvsim."))
    return root_name(target) in names


def test_sleep_rows(checkout: Checkout) -> list[Row]:
    sleeps = [call for module in checkout.tests for call in sleep_calls(module)]
    by_kind = Counter(root_name(call.func) for call in sleeps)
    zero = sum(map(sleeps_zero, sleeps))
    patches = [
        f"{module.relpath}:{node.lineno}"
        for module in checkout.tests
        for names in [project_names(module.tree)]
        for node in nodes_in_order(module.tree)
        if isinstance(node, ast.Call) and patches_project(node, names)
    ]
    summary = f"{len(sleeps)} (asyncio {by_kind['asyncio']}, time {by_kind['time']}; sleep(0): {zero})"
    return [
        ("sleeps in tests/", Cell(summary)),
        ("`monkeypatch.setattr` on project modules in tests/", Cell(str(len(patches)), patches)),
    ]


def gateway_test_rows(checkout: Checkout) -> list[Row]:
    rows: list[Row] = []
    for folder in ("tests/gateway/", "tests/e2e/"):
        under = [module for module in checkout.tests if module.relpath.startswith(folder)]
        files = [module for module in under if Path(module.relpath).name.startswith("test_")]
        share = sum(m.lines for m in under) / max(1, sum(m.lines for m in checkout.tests))
        rows += [(f"test files under {folder}", Cell(str(len(files)))),
                 (f"share of test lines in {folder}", Cell(f"{share:.0%}"))]
    return rows


# --- row 11: size -------------------------------------------------------------------------------------------------


def size_rows(checkout: Checkout) -> list[Row]:
    return [
        ("lines in gateway/", Cell(f"{sum(m.lines for m in checkout.gateway):,}")),
        ("modules in gateway/", Cell(str(len(checkout.gateway)))),
    ]


# --- the table ----------------------------------------------------------------------------------------------------

MEASURES: tuple[Callable[[Checkout], list[Row]], ...] = (
    import_cycle_rows,
    import_load_rows,
    many_parameter_rows,
    backend_kind_rows,
    error_body_rows,
    root_module_rows,
    duplicate_name_rows,
    module_length_rows,
    test_sleep_rows,
    gateway_test_rows,
    size_rows,
)


def measure(checkout: Checkout) -> list[Row]:
    return [row for measure_rows in MEASURES for row in measure_rows(checkout)]


def render(roots: list[str], columns: list[list[Row]]) -> str:
    labels = [label for label, _ in columns[0]]
    lines = [f"| | {' | '.join(roots)} |", f"|---|{'---|' * len(roots)}"]
    for position, label in enumerate(labels):
        lines.append(f"| {label} | {' | '.join(column[position][1].value for column in columns)} |")
    lines += ["", "Details:"]
    for position, label in enumerate(labels):
        cells = [(root, column[position][1]) for root, column in zip(roots, columns, strict=True)]
        if any(cell.details for _, cell in cells):
            lines.append(f"\n{label}:")
            for root, cell in cells:
                lines.append(f"- {root}:" + ("" if cell.details else " (none)"))
                lines += [f"    {detail}" for detail in cell.details]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("roots", nargs="+", help="checkouts to measure, one column each")
    parser.add_argument("--python", default=sys.executable, help="the interpreter for the import probes (row 2)")
    args = parser.parse_args()
    columns = [measure(load_checkout(Path(root).resolve(), args.python)) for root in args.roots]
    print(render(args.roots, columns))


if __name__ == "__main__":
    main()
