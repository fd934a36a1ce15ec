"""The layers depend one way, checked over the source itself (its syntax trees, every import statement,
those inside functions included):

- `training/engine/`, `rollouts/sandbox/` (the jail, its proxy and the result protocol) and
  `rollouts/inference/` (the vLLM and CTranslate2 servers) are pure: they import neither Django (nor its
  add-ons, Channels, DRF, Celery) nor any of the project's apps, only themselves and libraries. The two
  rollouts packages do not import each other; the engine may import both, pure as well and on the allowed
  side of training -> rollouts;
- `training` depends on `rollouts`, never the other way round: nothing in `rollouts` imports `training`,
  and no rollouts model has a relation to a training model;
- inside `training`, the serving app (`training/serving/`) and the client-driven runs' app
  (`training/client_runs/`, which may use serving) depend on the core: nothing else in training imports
  them, and no core model points at theirs;
- `artweb` plumbing that both apps use (artweb.api, artweb.pages, artweb.presenters, ...) imports neither app,
  only the pure `rollouts.sandbox` and `rollouts.inference` (libraries to it: no Django, no models; e.g.
  the bounded JSON parser);
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


PURE = {
    "training.engine": ("training.engine", "rollouts.sandbox", "rollouts.inference"),
    "rollouts.sandbox": ("rollouts.sandbox",),
    "rollouts.inference": ("rollouts.inference",),
}


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
        if module not in ARTWEB_WIRING and not module.startswith(("artweb.cli", "artweb.launcher", "artweb.testing"))
        for line, name in imported_modules(path, module)
        if _top(name) in ("training", "rollouts")
        and not any(_is_within(name, pure) for pure in ("rollouts.sandbox", "rollouts.inference"))
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
    pkg = tmp_path / "rollouts" / "sandbox"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("def f():\n    from django.db import models\n\nfrom ..views import x\n")
    found = sorted(imported_modules(pkg / "bad.py", "rollouts.sandbox.bad"))
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


def _imports_with_names(path: Path, module: str) -> list[tuple[int, str]]:
    """imported_modules, plus `package.name` for each name of a `from package import name`: so that
    `from training import serving` counts as an import of training.serving."""
    found = imported_modules(path, module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _imports_of_app(app: str, importers: tuple[str, ...]) -> list[str]:
    """Where a module of training outside `importers` (the app itself and the apps allowed to use it)
    imports the app `app` (a package of training), by module or by name."""
    return [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path, module in _sources("training")
        if not any(_is_within(module, allowed) for allowed in importers)
        for line, name in _imports_with_names(path, module)
        if _is_within(name, app)
    ]


def _relations_to(label: str, *, of: tuple[str, ...]) -> list[str]:
    """Concrete relations from the models of the apps `of` to a model of the app `label`."""
    return [
        f"{model.__name__}.{field.name} -> {field.related_model._meta.label}"
        for app in of
        for model in apps.get_app_config(app).get_models()
        for field in model._meta.get_fields()
        if field.is_relation and field.related_model is not None and field.concrete
        if field.related_model._meta.app_label == label
    ]


@pytest.mark.django_db(databases=[])
def test_it_keeps_training_from_importing_its_serving_app():
    """The serving app (training/serving/: the OpenAI endpoint, aliases, playground, diffs, the serving
    thread) uses training's runs, checkpoints, inference server and serving gate; nothing else in training
    imports it but the client-driven runs' app (whose inference is the endpoint's), and no training model
    has a relation to a serving model."""
    assert _imports_of_app("training.serving", ("training.serving", "training.client_runs")) == []
    assert _relations_to("serving", of=("training",)) == []
    assert apps.get_app_config("serving").name == "training.serving"
    assert {m.__name__ for m in apps.get_app_config("serving").get_models()} >= {"CheckpointAlias", "ServeJob"}


@pytest.mark.django_db(databases=[])
def test_it_keeps_training_from_importing_its_client_runs_app():
    """The client-driven runs' app (training/client_runs/: ART's ServerlessBackend protocol, the models ART
    clients register and their training jobs) uses training's runs, steps and checkpoints and the serving
    app's endpoint; nothing else in training imports it, and neither training's nor serving's models point
    at its models. The step machinery reaches it through the step source its AppConfig.ready registers
    (training/services/steps/sources.py), the dashboard through the reverse relations of its models."""
    from training.client_runs.source import CLIENT_SOURCE
    from training.models import Run
    from training.services.steps.sources import step_source

    assert _imports_of_app("training.client_runs", ("training.client_runs",)) == []
    assert _relations_to("client_runs", of=("training", "serving")) == []
    assert apps.get_app_config("client_runs").name == "training.client_runs"
    assert {m.__name__ for m in apps.get_app_config("client_runs").get_models()} >= {
        "ClientModel",
        "ClientTrainingJob",
        "ClientTrainingJobEvent",
    }
    assert step_source(Run(driver=Run.Driver.CLIENT)) is CLIENT_SOURCE
    assert step_source(Run(driver=Run.Driver.SCRIPT)) is None


@pytest.mark.parametrize("app, model", [("serving", "ServeJob"), ("client_runs", "ClientModel")])
def test_the_app_checks_see_an_import_of_the_app_by_name(tmp_path, app, model):
    pkg = tmp_path / "training" / "views"
    pkg.mkdir(parents=True)
    (pkg / "bad.py").write_text(f"from training import {app}\n\ndef f():\n    from ..{app}.models import {model}\n")
    found = {name for _, name in _imports_with_names(pkg / "bad.py", "training.views.bad")}
    assert {f"training.{app}", f"training.{app}.models"} <= found


# --- the test harness, the REST client and the command line, the engine's import ------------------------


def test_bench_imports_the_shared_harness_never_the_tests():
    """What bench/ and tests/ share lives in artweb.testing; a benchmark that imported tests/ would tie
    the two trees together (and load the tests' conftest-free modules outside pytest)."""
    assert _violations("bench", lambda name: _top(name) == "tests") == []


def test_only_the_tests_and_the_benchmarks_import_the_test_harness():
    """artweb.testing (factories, started servers and workers) is for tests/ and bench/: product code
    outside it never imports it, so nothing a deployment runs depends on it."""
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package in APPS
        for path, module in _sources(package)
        if not _is_within(module, "artweb.testing")
        for line, name in imported_modules(path, module)
        if _is_within(name, "artweb.testing")
    ]
    assert violations == []


CLIENT_SIDE = ("artweb.client", "artweb.cli")


def test_the_rest_client_and_the_cli_import_no_django_and_no_app():
    """The REST client and the command line run on a user's machine with httpx, click and rich: no
    Django, DRF, Celery or Channels, and nothing of the project but themselves."""

    def forbidden(name: str) -> bool:
        if any(_is_within(name, allowed) for allowed in CLIENT_SIDE):
            return False
        return _top(name) in FRAMEWORKS or _top(name) in APPS

    assert [v for package in CLIENT_SIDE for v in _violations(package, forbidden)] == []


def _loaded_by(statement: str) -> list[str]:
    """The modules a fresh interpreter holds after running statement (no Django settings given)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_importing_the_rest_client_and_the_cli_loads_no_django_and_no_app():
    """Checked on a running interpreter too: the packages they live in (artweb) load nothing on import."""
    loaded = _loaded_by("import artweb.client, artweb.cli")
    frameworks = sorted({_top(m) for m in loaded} & set(FRAMEWORKS))
    project = [
        m for m in loaded if _top(m) in APPS and m != "artweb" and not any(_is_within(m, p) for p in CLIENT_SIDE)
    ]
    assert (frameworks, project) == ([], [])


def test_importing_the_engine_loads_no_torch():
    """training.engine's __init__ re-exports nothing: a caller that reads the config or the advantages
    (the web process does) pays for torch only when it imports the trainer."""
    loaded = _loaded_by("import training.engine, training.engine.config, training.engine.advantages")
    assert "torch" not in loaded
    assert "torch" in _loaded_by("import training.engine.trainer")  # the check can see torch load


# --- analytics --------------------------------------------------------------------------------------------

# What the rest of training may take from training.analytics: the recorders a step calls as it commits
# (learning-signal figures, heatmap cells, the alert check) and the alert rules the run page edits.
ANALYTICS_FOR_TRAINING = {
    "training.analytics.learning_signals",
    "training.analytics.heatmap",
    "training.analytics.alerts",
}
# Wiring modules of training that join analytics in: the app's ready(), its task list and its URLs.
TRAINING_WIRING = {"training.apps", "training.tasks", "training.urls"}


def test_training_takes_only_the_step_recorders_from_analytics():
    """Analytics reads what runs and steps stored; the rest of training imports from it only what a step
    records as it commits, so re-scoring, reward health and the heatmap's reads stay out of the core."""
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path, module in _sources("training")
        if not _is_within(module, "training.analytics") and not _is_within(module, "training.serving")
        if module not in TRAINING_WIRING
        for line, name in _imports_with_names(path, module)
        if _is_within(name, "training.analytics") and name != "training.analytics"
        if not any(_is_within(name, allowed) for allowed in ANALYTICS_FOR_TRAINING)
    ]
    assert violations == []
