"""The direction of dependencies, read from the source: every import statement of every module, those
inside functions and under ``TYPE_CHECKING`` included, parsed with :mod:`ast` (nothing is imported).

* No import cycle among the project's modules.
* ``adversary`` may import ``nlagg_node`` (its math, config and wire layers); ``nlagg_node`` never
  imports ``adversary``, except in the composition points that start both: the CLI and the lab.
* ``adversary`` never imports those composition points.
* Inside ``adversary``, its concept folders keep their direction: the capture (which runs beside
  a broker) reaches neither the analysis nor the reporting, even through another module, and the
  transcript (which any capture, simulated ones too, writes) reaches none of capture, analysis and
  reporting.

And, from the syntax tree: no function over 100 lines or with more than 15 parameters (compiled
kernels excepted), beyond a list of known ones that may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nlagg_node", "adversary")
COMPOSITION_POINTS = ("nlagg_node.cli", "nlagg_node.lab")


def _module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``)."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


MODULES = _module_files()


def _target(name: str) -> str | None:
    """The project module an imported dotted name lands in (its longest known prefix), if any."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _imports(module: str) -> set[str]:
    """Project modules that ``module`` imports anywhere in its source."""
    path, is_pkg = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(
                    package[: len(package) - node.level + 1] + ([node.module] if node.module else [])
                )
            else:
                base = node.module or ""
            # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            ]
        else:
            continue
        found.update(t for t in map(_target, names) if t is not None and t != module)
    return found


GRAPH = nx.DiGraph([(m, t) for m in MODULES for t in _imports(m)])
GRAPH.add_nodes_from(MODULES)


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_walk_sees_function_level_imports() -> None:
    # cli.analysis imports the adversary only inside its command functions.
    assert "adversary.analysis.experiments" in _imports("nlagg_node.cli.analysis")
    assert "nlagg_node.sim.engine" in _imports("nlagg_node.sim")


def test_no_import_cycle() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert cycles == []


@pytest.mark.parametrize(
    ("importer", "forbidden", "allowed"),
    [
        ("nlagg_node", ("adversary",), COMPOSITION_POINTS),
        ("adversary", COMPOSITION_POINTS, ()),
    ],
    ids=["nlagg_node-never-imports-adversary", "adversary-never-imports-composition-points"],
)
def test_dependencies_point_one_way(
    importer: str, forbidden: tuple[str, ...], allowed: tuple[str, ...]
) -> None:
    wrong = sorted(
        f"{m} -> {t}"
        for m, t in GRAPH.edges
        if _in(m, (importer,)) and not _in(m, allowed) and _in(t, forbidden)
    )
    assert wrong == []


def test_every_lazy_export_of_adversary_resolves() -> None:
    import adversary

    assert len(adversary.__all__) == len(set(adversary.__all__)) > 0
    missing = [name for name in adversary.__all__ if getattr(adversary, name, None) is None]
    assert missing == []


def test_every_error_class_lives_in_the_one_tree() -> None:
    from nlagg_node import errors

    def is_error(base: ast.expr) -> bool:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
        return name.endswith(("Error", "Exception"))

    found = {
        (module, node.name)
        for module, (path, _) in MODULES.items()
        if module != "nlagg_node.errors"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and any(is_error(b) for b in node.bases)
    }
    assert found == set()
    assert all(issubclass(getattr(errors, name), errors.NlaggError) for name in errors.__all__)


def test_array_aliases_are_defined_once() -> None:
    """``FloatArray``, ``IntArray`` and ``BoolArray`` are assigned in nlagg_node.arrays only."""
    aliases = {"FloatArray", "IntArray", "BoolArray"}
    found = {
        (module, target.id)
        for module, (path, _) in MODULES.items()
        if module != "nlagg_node.arrays"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id in aliases
    }
    assert found == set()


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        (
            "adversary.capture",
            ("adversary.analysis", "adversary.reporting", "adversary.attack", "adversary.report"),
        ),
        ("adversary.transcript", ("adversary.capture", "adversary.analysis", "adversary.reporting")),
    ],
    ids=["capture", "transcript"],
)
def test_concept_folders_keep_their_direction(folder: str, forbidden: tuple[str, ...]) -> None:
    inside = [m for m in MODULES if _in(m, (folder,))]
    assert inside
    wrong = sorted(f"{m} -> {t}" for m in inside for t in nx.descendants(GRAPH, m) if _in(t, forbidden))
    assert wrong == []


MAX_FUNCTION_LINES = 100
MAX_PARAMETERS = 15


def _function_sizes() -> dict[str, tuple[int, int]]:
    """``module:qualname`` -> (lines, parameters without self/cls) of every function that is not
    a compiled kernel (decorated with numba's ``njit``/``jit``)."""
    out: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, module, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                compiled = any("jit" in ast.unparse(d) for d in child.decorator_list)
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                n = len(params) - (1 if params and params[0].arg in ("self", "cls") else 0)
                if not compiled:
                    out[f"{module}:{prefix}{child.name}"] = (
                        (child.end_lineno or child.lineno) - child.lineno + 1,
                        n,
                    )
                visit(child, module, f"{prefix}{child.name}.")

    for module, (path, _) in MODULES.items():
        visit(ast.parse(path.read_text(encoding="utf-8")), module, "")
    return out


def test_functions_are_short_and_take_few_parameters() -> None:
    sizes = _function_sizes()
    offending = {
        name
        for name, (lines, params) in sizes.items()
        if lines > MAX_FUNCTION_LINES or params > MAX_PARAMETERS
    }
    assert sorted(offending) == []
