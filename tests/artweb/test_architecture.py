"""The layers depend one way, checked over the source itself (its syntax trees, every import statement,
those inside functions included):

- `training/engine/` and `rollouts/runtime/` are pure: they import neither Django (nor its add-ons,
  Channels, DRF, Celery) nor any of the project's apps, only themselves and libraries (and the engine
  the runtime, pure as well and on the allowed side of training -> rollouts);
- `training` depends on `rollouts`, never the other way round: nothing in `rollouts` imports `training`,
  and no rollouts model has a relation to a training model;
- `artweb` plumbing that both apps use (artweb.api, artweb.pages, artweb.presenters, ...) imports neither app,
  only the pure `rollouts.runtime` (a library to it: no Django, no models; e.g. the bounded JSON parser);
- the project's modules import each other without a cycle at module level, so no import has to hide
  inside a function to dodge one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]
APPS = ("artweb", "training", "rollouts")
# Modules of artweb that are wiring (they join the apps together) rather than shared plumbing.
ARTWEB_WIRING = {
    "artweb.urls",
    "artweb.api_urls",
    "artweb.routing",
    "artweb.asgi",
    "artweb.celery",
    "artweb.views",
    "artweb.settings",
}
FRAMEWORKS = ("django", "rest_framework", "channels", "celery", "drf_spectacular", "django_filters", "axes")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(package: str):
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        yield path, _module_name(path)


def imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import in the file, function-level ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.append((node.lineno, name))
    return found


def _violations(package: str, forbidden) -> list[str]:
    out = []
    for path, module in _sources(package):
        for line, name in imported_modules(path, module):
            if forbidden(name):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return out


def _top(name: str) -> str:
    return name.split(".", 1)[0]


PURE = {"training.engine": ("training.engine", "rollouts.runtime"), "rollouts.runtime": ("rollouts.runtime",)}


@pytest.mark.parametrize("package", sorted(PURE))
def test_it_keeps_the_pure_layers_free_of_django_and_of_the_apps(package):
    def forbidden(name: str) -> bool:
        if any(name == allowed or name.startswith(allowed + ".") for allowed in PURE[package]):
            return False
        return _top(name) in FRAMEWORKS or _top(name) in APPS

    assert _violations(package, forbidden) == []


def test_it_keeps_rollouts_from_importing_training():
    assert _violations("rollouts", lambda name: _top(name) == "training") == []


def _is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_it_keeps_shared_artweb_plumbing_free_of_both_apps():
    violations = [
        v
        for path, module in _sources("artweb")
        if module not in ARTWEB_WIRING and not module.startswith(("artweb.cli", "artweb.launcher"))
        for line, name in imported_modules(path, module)
        if _top(name) in ("training", "rollouts") and not _is_within(name, "rollouts.runtime")
        for v in [f"{path.relative_to(ROOT)}:{line} imports {name}"]
    ]
    assert violations == []


@pytest.mark.django_db(databases=[])
def test_it_gives_rollouts_models_no_relation_to_training():
    relations = [
        f"{model.__name__}.{field.name} -> {field.related_model._meta.label}"
        for model in apps.get_app_config("rollouts").get_models()
        for field in model._meta.get_fields()
        if field.is_relation and field.related_model is not None and field.concrete
        if field.related_model._meta.app_label == "training"
    ]
    assert relations == []


def module_level_imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Project modules this one imports when it is loaded: statements at module level (inside if/try too,
    not under `if TYPE_CHECKING:`). `from package import name` counts as an import of package.name when
    that is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []

    def visit(body) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.Import):
                names.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                names.extend(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)

    visit(tree.body)
    found = set()
    for name in names:
        while name and name not in known:  # `import a.b.c` of a name inside module a.b: a.b
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
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

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(cycles)


def project_import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = {}
    for package in APPS:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    known = set(files)
    return {module: module_level_imports(path, module, known) for module, path in files.items()}


def test_it_has_no_import_cycle():
    graph = project_import_graph()
    assert len(graph) > 100 and graph["training.tasks"]  # the walk found the tree and its imports
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_a_package_import(tmp_path):
    """a imports b.c (`from b import c`), c imports a: one cycle of two modules; d only imports a."""
    (tmp_path / "artweb" / "b").mkdir(parents=True)
    (tmp_path / "artweb" / "__init__.py").write_text("")
    (tmp_path / "artweb" / "a.py").write_text("from artweb.b import c\n\ndef f():\n    import artweb.d\n")
    (tmp_path / "artweb" / "b" / "__init__.py").write_text("")
    (tmp_path / "artweb" / "b" / "c.py").write_text("from .. import a\n")
    (tmp_path / "artweb" / "d.py").write_text("import artweb.a\nfrom typing import TYPE_CHECKING\n")
    graph = project_import_graph(tmp_path)
    assert import_cycles(graph) == [["artweb.a", "artweb.b.c"]]
    assert "artweb.d" not in graph["artweb.a"]  # imported inside a function: not at load time


def test_the_checks_see_the_imports_they_forbid(tmp_path):
    """The walker finds an import inside a function and resolves a relative one: a forbidden import
    written either way would fail the tests above."""
    pkg = tmp_path / "rollouts" / "runtime"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("def f():\n    from django.db import models\n\nfrom ..views import x\n")
    found = sorted(imported_modules(pkg / "bad.py", "rollouts.runtime.bad"))
    assert found == [(2, "django.db"), (4, "rollouts.views")]


def test_the_web_process_and_the_task_modules_load_without_torch():
    """The engine loads torch; only the code that trains imports it, inside the function that trains,
    so a web process (and a default-queue worker) starts without it."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'artweb.settings'); django.setup(); "
        "import artweb.urls, artweb.routing, training.tasks; print('torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
