"""No module outside gateway/runtimes/ branches on a backend's kind (issue 24, point 4): a comparison with a
``BackendKind`` member (``backend.kind is BackendKind.OLLAMA``, ``==``, ``!=``, ``in``) is a question a runtime
answers. Read off the source with ``ast``; the count before the runtimes was 35 in 17 modules."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def _is_kind_member(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "BackendKind")


def _kind_branches(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Compare)
               and any(_is_kind_member(side) for side in (node.left, *node.comparators)))


def test_only_the_runtimes_branch_on_a_backends_kind() -> None:
    found = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        relative = path.relative_to(GATEWAY).as_posix()
        if relative.startswith("runtimes/"):
            continue
        count = _kind_branches(path)
        if count:
            found[relative] = count
    print(f"\n  kind branches outside gateway/runtimes/: {sum(found.values())} in {len(found)} modules: {found}")
    assert found == {}
