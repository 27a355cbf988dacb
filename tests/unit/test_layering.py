"""Imports in proxy/ go one way, read from the source (every ``import`` of every module, wherever it stands, type-only
imports under ``if TYPE_CHECKING:`` included: an annotation that names a module above is an arrow up all the same).

The layers, lowest first:

- ``proxy.wire``: codecs and specs; imports nothing else of Sluice's;
- ``proxy.config`` (all of it: the ``base`` vocabulary, the core ``sections``, the generic ``loader`` and the
  ``state`` file), ``proxy.metrics``, ``proxy.accesslog``, ``proxy.dashboard``, ``proxy.kafka_acls``: the settings,
  the metrics, the logs and the dashboard's vocabulary every layer is handed (policies take their own section, the
  chain and the connection core count and log); they import only each other, so they are leaves beside ``wire``
  however high their users sit. The configuration knows no policy: the settings model of the registered policies is
  composed at the top, in ``proxy.app``;
- ``proxy.core``: the sans-IO core; imports ``wire`` and the leaves, never a policy (the server hands the chain
  its policies);
- ``proxy.policies``: imports ``core``, ``wire`` and the leaves;
- the rest (the composition root ``proxy.app``, the server and its I/O, TLS, admin, reconfiguration, the CLI, the
  analytics): the top, importing any layer; no module of a lower layer imports it. Within it, ``proxy.io`` imports
  no other module of the top but ``proxy.tls`` and ``proxy.http_routes`` (the admin API's requests and answers, the
  values its HTTP server carries); a connection's host is the ``io.host.ConnectionHost`` protocol.

No cycle between modules, counting every import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import proxy
import proxy.core

ROOT = Path(proxy.__file__).parent


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


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


LEAVES = frozenset(m for m in MODULES if _in(m, "proxy.config") or m in ("proxy.metrics", "proxy.accesslog",
                                                                        "proxy.dashboard", "proxy.kafka_acls"))


def _layer(module: str) -> int:
    if _in(module, "proxy.wire"):
        return 0
    if module in LEAVES:
        return 1
    if _in(module, "proxy.core"):
        return 2
    if _in(module, "proxy.policies"):
        return 3
    return 4


def test_the_graph_is_read() -> None:
    """The parser sees the imports the map describes (a broken reader would pass everything below)."""
    assert "proxy.wire.messages" in GRAPH["proxy.core.chain"][0]
    assert "proxy.core.policy" in GRAPH["proxy.policies.sharing.policy"][0]
    assert "proxy.core.connection" in GRAPH["proxy.io.host"][1]  # type-only


def test_no_import_from_a_lower_layer_up() -> None:
    upward = sorted((m, dep) for m, (runs, typed) in GRAPH.items() for dep in runs | typed
                    if _layer(dep) > _layer(m))
    assert upward == []


def test_leaves_import_only_leaves_and_wire() -> None:
    assert sorted((m, d) for m in LEAVES for d in GRAPH[m][0] | GRAPH[m][1]
                  if d not in LEAVES and not _in(d, "proxy.wire")) == []


def test_the_io_layer_imports_nothing_of_the_top_but_tls_and_http_routes() -> None:
    assert sorted((m, d) for m in MODULES if _in(m, "proxy.io") for d in GRAPH[m][0] | GRAPH[m][1]
                  if _layer(d) == 4 and not _in(d, "proxy.io") and d not in ("proxy.tls", "proxy.http_routes")) == []


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components over every import, type-only ones too: none has two modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v][0] | GRAPH[v][1]):
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
