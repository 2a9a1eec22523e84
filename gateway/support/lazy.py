"""Package facades that import nothing until a name is used (PEP 562), so that importing a light module of a
package (``gateway.admission.planner``, ``gateway.dialects``) does not load its heavy neighbours (the waiting room
and redis, the backend client and aiohttp) through the package's ``__init__``.

    # gateway/<package>/__init__.py
    if TYPE_CHECKING:                     # what type checkers and readers see
        from gateway.pkg.mod import Name
    _EXPORTS = {"Name": "gateway.pkg.mod"}
    def __getattr__(name: str) -> object:
        return export(__name__, _EXPORTS, name)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping


def export(package: str, exports: Mapping[str, str], name: str) -> object:
    """``package.name``, imported from its module on first use and kept on the package."""
    module = exports.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(sys.modules[package], name, value)
    return value
