"""Imports in proxy/ go one way, read from the source (every ``import`` of every module, wherever it stands).

The layers, lowest first:

- ``proxy.wire``: codecs and specs; imports nothing else of Sluice's;
- ``proxy.config`` (its ``base`` vocabulary and core ``sections``), ``proxy.metrics``, ``proxy.accesslog``: the
  settings, the metrics and the logs every layer is handed (policies take their settings, the chain and the
  connection core count and log); they import only each other, so they are leaves beside ``wire`` however high
  their users sit. ``proxy.config.loader`` and ``proxy.config.state`` compose the registered policies' sections:
  they are at the top. The one edge from a leaf up is the package's own re-export of the loader's names
  (``proxy/config/__init__.py``, PEP 562: imported on first use, so ``from proxy.config import load_settings``
  keeps working without a policy's ``import proxy.config.base`` importing the loader);
- ``proxy.core``: the sans-IO core; imports ``wire`` and the leaves, never a policy (the server hands the chain
  its policies);
- ``proxy.policies``: imports ``core``, ``wire`` and the leaves;
- the rest (the server and its I/O, TLS, admin, reconfiguration, the CLI, the analytics): the top, importing any
  layer; no module of a lower layer imports it.

No cycle between modules among the imports that run (module level or deferred inside a function); imports made
only for type annotations (under ``if TYPE_CHECKING:``) never run and are left out of that check, not out of the
layering (sharing's groups/offsets annotate with the policy class that calls them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import proxy
import proxy.core

ROOT = Path(proxy.__file__).parent
LEAVES = frozenset({"proxy.config", "proxy.config.base", "proxy.config.sections", "proxy.metrics", "proxy.accesslog"})
#: the config package's lazy re-export of the loader's and the state file's names (see above)
LAZY_REEXPORT = frozenset({("proxy.config", "proxy.config.loader"), ("proxy.config", "proxy.config.state")})


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = ["proxy", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of import nodes inside ``if TYPE_CHECKING:`` blocks."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            ids.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ids


def _imports(module: str) -> tuple[set[str], set[str]]:
    """(imports that run, type-only imports) of ``module``: Sluice's modules it names."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    type_only = _type_only(tree)
    runs: set[str] = set()
    typed: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
        found = {n for n in names if n in MODULES and n != module}
        (typed if id(node) in type_only else runs).update(found)
    return runs, typed


GRAPH = {m: _imports(m) for m in MODULES}


def _layer(module: str) -> int:
    if module == "proxy.wire" or module.startswith("proxy.wire."):
        return 0
    if module in LEAVES:
        return 1
    if module == "proxy.core" or module.startswith("proxy.core."):
        return 2
    if module == "proxy.policies" or module.startswith("proxy.policies."):
        return 3
    return 4


def test_the_graph_is_read() -> None:
    """The parser sees the imports the map describes (a broken reader would pass everything below)."""
    assert "proxy.wire.messages" in GRAPH["proxy.core.chain"][0]
    assert "proxy.core.policy" in GRAPH["proxy.policies.sharing.policy"][0]
    assert "proxy.policies.sharing.policy" in GRAPH["proxy.policies.sharing.groups"][1]  # type-only


def test_no_import_from_a_lower_layer_up() -> None:
    upward = sorted((m, dep) for m, (runs, typed) in GRAPH.items() for dep in runs | typed
                    if _layer(dep) > _layer(m) and not (_layer(m) == 1 and _layer(dep) == 1)
                    and (m, dep) not in LAZY_REEXPORT)
    assert upward == []


def test_leaves_import_only_leaves() -> None:
    assert sorted((m, d) for m in LEAVES for d in GRAPH[m][0] | GRAPH[m][1]
                  if d not in LEAVES and (m, d) not in LAZY_REEXPORT) == []
    assert all(d in GRAPH[m][1] for m, d in LAZY_REEXPORT)  # type-only: the names are imported on first use


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components over the imports that run: none has two modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v][0]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_core_package_names_each_of_its_modules() -> None:
    doc = proxy.core.__doc__ or ""
    missing = sorted(p.name for p in (ROOT / "core").glob("*.py") if p.name != "__init__.py" and p.name not in doc)
    assert missing == []
