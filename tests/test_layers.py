"""dmp's modules import only downward, and no modules import each other in a circle.

Every import statement of every module under ``dmp/`` is read with `ast`, those inside
functions too (a lazy import still makes the importer depend on what it imports), and held
against `LAYERS`: a module may import the modules of its own part (its package, where no two
import each other in a circle) and those of the parts on lower floors, nothing else.  A new
module whose part is on no floor fails the test until it is given one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dmp"

#: the parts of dmp, floor by floor from the ground up (docs/architecture.md, "Layers"); a
#: part is a module or a package, and a module belongs to the longest part that names it or a
#: package above it.  A part named before its module exists takes its floor when it does.
LAYERS = (
    ("dmp.exceptions",),
    ("dmp.config",),                            # dmp's settings (dmp/dmp.yaml)
    ("dmp.utils", "dmp.kernels"),
    ("dmp.io", "dmp.engine", "dmp.pipeline_schema"),  # the formats and the engine know
                                                # nothing of each other
    ("dmp.plotting",),
    ("dmp.base",),                              # the estimators' base
    ("dmp.linear_model", "dmp.monitor"),
    ("dmp.decomposition", "dmp.hashing"),
    ("dmp.reports",),                           # what a pipeline run reports, per estimator
    ("dmp.utils.estimator_checks",),            # conformance checks run on any estimator
    ("dmp.pipeline", "dmp.testing", "dmp.planning"),  # planning: `dmp.plan`
    ("dmp.k8s",),
    ("dmp.cli", "dmp._run_worker"),
    ("dmp",),                                   # dmp/__init__.py: wires the monitor into
                                                # the engine's fits (dmp.utils.cluster)
)


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package)}`` of every module under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def _imports(root: Path) -> dict[str, list[tuple[str, int]]]:
    """``{module: [(imported module, line), ...]}``: every import of a module of ``root``'s
    package by a module of it, wherever the statement stands.  ``from P import name`` is an
    import of the module ``P.name`` where there is one, else of ``P``."""
    modules = _modules(root)
    top = root.name
    out: dict[str, list[tuple[str, int]]] = {}
    for name, (path, package) in modules.items():
        edges = out.setdefault(name, [])
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if package else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                subs = [f"{source}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in modules]
                if len(targets) < len(subs):
                    targets.append(source)
            else:
                continue
            for target in targets:
                if target == top or target.startswith(top + "."):
                    # ``import dmp.io.sparse`` runs dmp.io too, but depends on dmp.io.sparse
                    while target not in modules and "." in target:
                        target = target.rsplit(".", 1)[0]
                    if target != name:
                        edges.append((target, node.lineno))
    return out


def _part(module: str) -> str | None:
    """The part of `LAYERS` that ``module`` belongs to (None: on no floor)."""
    best = None
    for floor in LAYERS:
        for part in floor:
            inside = module == part or (part != "dmp" and module.startswith(part + "."))
            if inside and (best is None or len(part) > len(best)):
                best = part
    return best


def _floor(part: str) -> int:
    return next(i for i, floor in enumerate(LAYERS) if part in floor)


def _circles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in graph.get(v, ()):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(graph, circle) -> str:
    inside = set(circle)
    ties = [f"{a} -> {b} (line {line})" for a in circle for b, line in graph[a] if b in inside]
    return "circle: " + "; ".join(ties)


GRAPH = _imports(PACKAGE)


def test_every_module_is_on_a_floor():
    lost = [m for m in GRAPH if _part(m) is None]
    assert not lost, (f"modules on no floor of LAYERS (add each where it belongs, above "
                      f"everything it imports): {', '.join(lost)}")


def test_imports_only_downward():
    upward = []
    for module, edges in GRAPH.items():
        part = _part(module)
        for target, line in edges:
            other = _part(target)
            if None in (part, other) or other == part:
                continue
            if _floor(other) >= _floor(part):
                upward.append(f"{module} (line {line}) imports {target}: floor "
                              f"{_floor(part)} ({part}) -> floor {_floor(other)} ({other})")
    assert not upward, "imports that do not run downward:\n" + "\n".join(upward)


def test_no_import_circles():
    circles = _circles(GRAPH)
    assert not circles, "\n".join(_describe(GRAPH, c) for c in circles)


def test_the_reader_sees_lazy_and_relative_imports(tmp_path):
    """The checks above can fail: a circle closed by an import inside a function, through a
    relative ``from . import``, is found; an import of a package's face is not taken for
    one of its modules."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .b import g\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n    return b\n")
    (pkg / "sub" / "b.py").write_text("from .. import a\n\ndef g():\n    pass\n")
    (pkg / "c.py").write_text("from .sub import g\n")
    graph = _imports(pkg)
    assert graph["pkg.a"] == [("pkg.sub.b", 2)]
    assert graph["pkg.sub.b"] == [("pkg.a", 1)]
    assert graph["pkg.c"] == [("pkg.sub", 1)]
    assert _circles(graph) == [["pkg.a", "pkg.sub.b"]]


@pytest.mark.parametrize("module, part", [("dmp", "dmp"), ("dmp.io._store", "dmp.io"),
                                          ("dmp.engine.backends.dask", "dmp.engine"),
                                          ("dmp.newthing", None)])
def test_parts(module, part):
    assert _part(module) == part
