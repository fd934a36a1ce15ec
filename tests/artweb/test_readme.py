"""The documentation (the MkDocs site under docs/, whose front page is the README) says what a user can
reach, and only that: every environment variable the code reads (docs/reference/settings.md), every REST
API route (docs/reference/rest-api.md), every command of the `artweb` CLI (docs/reference/cli.md), every
page (docs/reference/pages.md), every run setting and every method of the Python client. Every page of the
site is in its navigation, and the README's links into it lead to files that exist.

The variables are found in the source itself: Python through its syntax tree (os.environ[...],
os.environ.get/setdefault/pop, os.getenv, `"X" in os.environ`, names bound to os.environ or to a copy
of it, the settings' django-environ reader, click's envvar=), shell scripts, Docker files and the
Makefile through the `${NAME}` / `$(NAME)` forms they read the environment with.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import fields as dataclass_fields
from pathlib import Path

import click
import yaml
from django.urls import URLPattern, URLResolver, get_resolver

from artweb.cli import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
SETTINGS_PAGE = "reference/settings.md"
PYTHON_TREES = ("artweb", "training", "rollouts")
SHELL_FILES = (
    "docker/common.sh",
    "docker/start-web",
    "docker/start-worker",
    "docker/start-gpu-worker",
    "docker/docker-compose.yml",
    "docker/Dockerfile",
)

# Read by the code but not configuration: values one artweb process hands to another it starts, or
# the sandbox hands to the code inside it. Nobody sets them by hand, so the documentation's tables leave them out.
NOT_CONFIGURATION = {
    "ARTWEB_NEW_ADMIN_PASSWORD": "the launcher to its `prepare` child: the generated admin password",
    "ARTWEB_PREPARE_RESULT": "the launcher to its `prepare` child: the file it reports back in",
    "ARTWEB_SERVING_WORKER": "the Celery worker to its pool processes: it takes the gpu queue, so they serve",
    "ARTWEB_VLLM_ALIASES": "the worker to its vLLM server: the file of the names the server answers to",
    "ARTWEB_VLLM_WEIGHT_PUSH": "the worker to its GPU vLLM server in merged mode: the weight-transfer engine's name",
    "VLLM_API_KEY": "the worker to its vLLM server: that server's random key",
    "ARTWEB_RESULT_FD": "the sandbox to the guest: the pipe results go back through",
    "ARTWEB_PROXY_SOCKET": "the sandbox to the guest: the inference proxy's socket",
    "ARTWEB_EGRESS_SOCKET": "the sandbox to the guest: the socket of a Weave export's HTTPS tunnel",
    "ARTWEB_CONTROL_FD": "the sandbox to the guest: the pipe the batch's settings arrive through",
    "ARTWEB_WARM_UP": "the sandbox to the guest: import the SDK and the client before the batch arrives",
    "LD_PRELOAD": "the system's own: libraries already preloaded into the GPU worker are kept",
    "WEAVE_PROJECT": "the sandbox to the guest: the run's Weave project, from its export target",
    "OPENAI_BASE_URL": "set inside the sandbox for user code: the relay to the inference proxy",
    "OPENAI_API_KEY": "set inside the sandbox for user code: a placeholder, the proxy holds the key",
    "ARTWEB_SAMPLING": "set inside the sandbox for user code: the run's sampling settings",
    "ARTWEB_STEP": "set inside the sandbox for user code: the step being rolled out",
    "ARTWEB_JUDGE_MODEL": "set inside the sandbox for user code: the RULER judge's model name",
    "DJANGO_SETTINGS_MODULE": "every entry point sets it to artweb.settings (the test suite: artweb.testing.settings)",
    "PATH": "the system's own, handed on to the Weave exporter's child process",
    "PYTHONPATH": "the system's own; a GPU vLLM server in merged mode gets the checkout appended to it",
}

# Routes that are not pages: what a page's buttons and forms post to, and what its scripts fetch.
NOT_PAGES = {
    "run-action": "the run page's Cancel / Pause / Resume / Retry buttons post here",
    "run-alerts": "the run page's alert rules form posts here",
    "judge-create": "the Models page's judge endpoint form posts here",
    "judge-delete": "the Models page's judge endpoint Delete button posts here",
    "export-test": "an export target's Send a test event button posts here",
    "export-delete": "an export target's Delete button posts here",
    "script-companion": "a script page's companion reward form posts here",
    "dry-run-status": "the dry run page polls it",
    "plotly-js": "the chart library the pages load",
    "healthz": "a probe, documented in docs/operations/monitoring.md",
    "metrics": "for Prometheus, documented in docs/operations/monitoring.md",
    "logout": "the Sign out button posts here",
    "password_change_done": "where a password change lands",
    "password_reset": "Django's, reached from no page: artweb sends no e-mail",
    "password_reset_done": "Django's, reached from no page: artweb sends no e-mail",
    "password_reset_confirm": "Django's, reached from no page: artweb sends no e-mail",
    "password_reset_complete": "Django's, reached from no page: artweb sends no e-mail",
}


# --- what the code reads -------------------------------------------------------------------------------


def _is_os_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _string_constants(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level names bound to a string, or to a dict / tuple of strings (their values): the
    variable names a read may be written with instead of a literal."""
    out = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        items = value.values if isinstance(value, ast.Dict) else value.elts if isinstance(value, ast.Tuple) else [value]
        if items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
            out[node.targets[0].id] = [i.value for i in items]
    return out


def _loop_constants(tree: ast.Module) -> dict[str, list[str]]:
    """`for var in ("A", "B")`: the loop variable stands for each string."""
    out = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, (ast.Tuple, ast.List))
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.iter.elts)
        ):
            out[node.target.id] = [e.value for e in node.iter.elts]
    return out


def python_env_reads(source: str, *, environ_params: tuple[str, ...] = ()) -> tuple[dict[str, list[int]], list[int]]:
    """({variable: [line, ...]}, [lines of reads whose variable cannot be told]) for one module.

    environ_params: parameter names that hold a copy of the process environment in this module.
    """
    tree = ast.parse(source)
    names = {**_loop_constants(tree), **_string_constants(tree)}
    environs, readers = set(environ_params), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if any(_is_os_environ(n) for n in ast.walk(node.value)):
                environs |= targets  # env = os.environ / dict(os.environ) / {**os.environ, ...} / ... if ... else {}
            if (
                isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "Env"
            ):
                readers |= targets  # env = environ.Env(): env.str("X"), env.int("X"), env("X"), ...

    def is_environ(n: ast.AST) -> bool:
        return _is_os_environ(n) or (isinstance(n, ast.Name) and n.id in environs)

    reads: dict[str, list[int]] = {}
    unknown: list[int] = []
    for node in ast.walk(tree):
        keys: list[ast.AST] = []
        if isinstance(node, ast.Call):
            f = node.func
            environ_method = (
                isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault", "pop") and is_environ(f.value)
            )
            getenv = (
                isinstance(f, ast.Attribute)
                and f.attr == "getenv"
                and isinstance(f.value, ast.Name)
                and f.value.id == "os"
            )
            reader = (isinstance(f, ast.Name) and f.id in readers) or (
                isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in readers
            )
            if environ_method or getenv or reader:
                keys = node.args[:1]
            keys += [kw.value for kw in node.keywords if kw.arg == "envvar"]  # click options
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value):
            keys = [node.slice]
        elif (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], (ast.In, ast.NotIn))
            and is_environ(node.comparators[0])
        ):
            keys = [node.left]
        for key in keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found = [key.value]
            elif isinstance(key, ast.Name) and key.id in names:
                found = names[key.id]
            elif isinstance(key, ast.Subscript) and isinstance(key.value, ast.Name) and key.value.id in names:
                found = names[key.value.id]  # MAPPING[kind]: any of its values
            else:
                unknown.append(node.lineno)
                continue
            for name in found:
                reads.setdefault(name, []).append(node.lineno)
    return reads, unknown


SHELL_READ = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)")
SHELL_ASSIGN = re.compile(
    r"^\s*(?:export\s+|local\s+|ARG\s+|ENV\s+)?([A-Z][A-Z0-9_]*)=|^\s*ARG\s+([A-Z][A-Z0-9_]*)", re.MULTILINE
)


def shell_env_reads(text: str) -> set[str]:
    """Upper-case variables a shell script, Compose file or Dockerfile reads without setting them itself
    (Dockerfile ARGs are build arguments, not the environment)."""
    assigned = {a or b for a, b in SHELL_ASSIGN.findall(text)}
    return set(SHELL_READ.findall(text)) - assigned


def makefile_env_reads(text: str) -> set[str]:
    """`NAME ?= default` takes NAME from the environment when set; `$(NAME)` with no definition in the
    Makefile can only come from it."""
    conditional = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*\?=", text, re.MULTILINE))
    defined = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[:+?]?=", text, re.MULTILINE))
    used = set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", text))
    return conditional | (used - defined)


def code_env_reads() -> tuple[dict[str, list[str]], list[str]]:
    """{variable: ["path:line", ...]} over the whole product, and the reads that name no knowable variable."""
    reads: dict[str, list[str]] = {}
    unknown: list[str] = []
    for tree in PYTHON_TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            # The launcher hands its copy of the environment from function to function as `env`.
            params = ("env",) if rel.startswith("artweb/launcher/") else ()
            found, bad = python_env_reads(path.read_text(encoding="utf-8"), environ_params=params)
            for name, lines in found.items():
                reads.setdefault(name, []).extend(f"{rel}:{n}" for n in lines)
            unknown += [f"{rel}:{n}" for n in bad]
    for rel in SHELL_FILES:
        for name in shell_env_reads((ROOT / rel).read_text(encoding="utf-8")):
            reads.setdefault(name, []).append(rel)
    for name in makefile_env_reads((ROOT / "Makefile").read_text(encoding="utf-8")):
        reads.setdefault(name, []).append("Makefile")
    return reads, unknown


# --- what the documentation says ----------------------------------------------------------------------------


def doc_text(page: str) -> str:
    """A page of the site, by its path under docs/."""
    return (DOCS / page).read_text(encoding="utf-8")


def doc_section(page: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", doc_text(page), re.MULTILINE | re.DOTALL)
    assert match, f"docs/{page} has no '## {title}' section"
    return match.group(1)


def table_first_cells(section: str) -> list[str]:
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [row.split("|")[1].strip() for row in rows]
    return [c for c in cells if c and not set(c) <= {"-", ":", " "}]


def documented_variables() -> set[str]:
    cells = table_first_cells(doc_text(SETTINGS_PAGE))
    return {name for cell in cells for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cell)}


def _route(text: str) -> str:
    """A route with its parameters blanked: `runs/<int:run_id>/` and `runs/<id>/` compare equal."""
    words = text.strip().strip("`").split() or [""]  # a cell may read "GET /api/v1/runs/"
    return re.sub(r"<[^>]*>|\{[^}]*\}", "<>", words[-1]).lstrip("/")


def documented_routes(page: str, section: str) -> set[str]:
    return {
        _route(route)
        for cell in table_first_cells(doc_section(page, section))
        for route in re.findall(r"`([^`]+)`", cell)
    }


def url_routes(patterns=None, prefix: str = ""):
    """(route, name) of every URL pattern, includes flattened."""
    for p in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(p, URLResolver):
            yield from url_routes(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p.name


def cli_commands(group: click.Group = cli, path: str = "artweb") -> list[str]:
    out = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            out += cli_commands(command, f"{path} {name}")
        else:
            out.append(f"{path} {name}")
    return out


# --- the scanners themselves -------------------------------------------------------------------------------


def test_it_finds_each_way_python_reads_the_environment():
    source = """
import os, click, environ
KEY = "FROM_CONSTANT"
KEYS = {"a": "FROM_MAPPING_A", "b": "FROM_MAPPING_B"}
env = environ.Env()
env.int("FROM_ENV_READER", default=1)
os.environ["FROM_SUBSCRIPT"]
os.environ.get("FROM_GET")
os.getenv("FROM_GETENV")
os.environ.setdefault("FROM_SETDEFAULT", "1")
"FROM_IN" in os.environ
os.environ.get(KEY)
os.environ.get(KEYS[kind])
copy = dict(os.environ)
copy.get("FROM_COPY")
for var in ("FROM_LOOP",):
    os.environ[var]
os.environ["WRITTEN_ONLY"] = "1"
click.option("--url", envvar="FROM_CLICK")
def f(env_param):
    env_param.get("FROM_PARAM")
os.environ.get(make_name())
"""
    reads, unknown = python_env_reads(source, environ_params=("env_param",))

    assert set(reads) == {
        "FROM_CONSTANT",
        "FROM_MAPPING_A",
        "FROM_MAPPING_B",
        "FROM_ENV_READER",
        "FROM_SUBSCRIPT",
        "FROM_GET",
        "FROM_GETENV",
        "FROM_SETDEFAULT",
        "FROM_IN",
        "FROM_COPY",
        "FROM_LOOP",
        "FROM_CLICK",
        "FROM_PARAM",
    }
    assert unknown == [source.splitlines().index("os.environ.get(make_name())") + 1]


def test_it_finds_what_shell_docker_and_make_files_read():
    script = 'ARG BASE\nFROM ${BASE}\nexport MINE=1\necho "$MINE ${PORT:-8000} $HOME" "$@"\n'
    assert shell_env_reads(script) == {"PORT", "HOME"}
    makefile = "VENV := .venv\nSTEPS ?= 10\nURL ?= $(or $(DATABASE_URL),x)\nrun:\n\t$(VENV)/bin/x $(STEPS) $$SHELLVAR\n"
    assert makefile_env_reads(makefile) == {"STEPS", "URL", "DATABASE_URL"}


# --- the documentation against the code ---------------------------------------------------------------------


def test_it_can_tell_every_variable_the_code_reads():
    _, unknown = code_env_reads()
    assert not unknown, (
        "These reads name their variable in a way this test cannot follow; use a literal or a "
        f"module-level constant: {unknown}"
    )


def test_it_documents_every_variable_the_code_reads():
    reads, _ = code_env_reads()
    missing = {
        name: where
        for name, where in reads.items()
        if name not in documented_variables() and name not in NOT_CONFIGURATION
    }
    assert not missing, (
        f"Read by the code but missing from docs/{SETTINGS_PAGE}'s tables (add a row: meaning "
        "and default): " + "; ".join(f"{n} ({', '.join(w)})" for n, w in sorted(missing.items()))
    )


def test_it_documents_only_variables_the_code_reads():
    reads, _ = code_env_reads()
    stale = documented_variables() - set(reads)
    assert not stale, f"docs/{SETTINGS_PAGE}'s tables name variables nothing reads: {sorted(stale)}"


def test_its_list_of_internal_variables_is_current():
    reads, _ = code_env_reads()
    assert not set(NOT_CONFIGURATION) - set(reads), "NOT_CONFIGURATION names variables nothing reads any more"
    assert not set(NOT_CONFIGURATION) & documented_variables(), (
        "a variable is both documented and listed as internal; keep it in one place"
    )


def test_it_documents_every_api_route_and_no_other():
    routes = {_route(r.removeprefix("api/v1/")) for r, _ in url_routes() if r.startswith("api/v1/")}
    documented = {r.removeprefix("api/v1/") for r in documented_routes("reference/rest-api.md", "Routes")}

    assert not routes - documented, (
        f"API routes missing from docs/reference/rest-api.md's Routes table: {sorted(routes - documented)}"
    )
    assert not documented - routes, (
        f"docs/reference/rest-api.md's Routes table names routes that do not exist: {sorted(documented - routes)}"
    )


def test_it_documents_every_page_and_no_other():
    pages = {
        _route(r) or "/" for r, name in url_routes() if not r.startswith(("api/", "admin/")) and name not in NOT_PAGES
    }
    documented = {r or "/" for r in documented_routes("reference/pages.md", "Every page")}

    assert not pages - documented, f"Pages missing from docs/reference/pages.md's table: {sorted(pages - documented)}"
    assert not documented - pages, (
        f"docs/reference/pages.md's table names pages that do not exist: {sorted(documented - pages)}"
    )
    assert {name for _, name in url_routes()} >= set(NOT_PAGES), "NOT_PAGES names a route that no longer exists"


def test_it_documents_the_probes():
    section = doc_section("operations/monitoring.md", "Health and metrics")
    assert "`GET /healthz`" in section and "`GET /metrics`" in section
    assert "ARTWEB_METRICS_TOKEN" in section


def test_it_documents_every_cli_command_and_no_other():
    commands = set(cli_commands())
    documented = {
        cmd
        for cell in table_first_cells(doc_section("reference/cli.md", "Commands"))
        for cmd in re.findall(r"`(artweb [^`]+)`", cell)
    }

    assert not commands - documented, (
        f"CLI commands missing from docs/reference/cli.md's Commands table: {sorted(commands - documented)}"
    )
    assert not documented - commands, (
        f"docs/reference/cli.md's Commands table names commands that do not exist: {sorted(documented - commands)}"
    )


def _nav_pages(items) -> list[str]:
    """The page paths of mkdocs.yml's nav: `- page.md` or `- Title: page.md`, sections nested."""
    pages = []
    for item in items:
        for value in item.values() if isinstance(item, dict) else [item]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_its_navigation_lists_every_page_and_no_other():
    nav = _nav_pages(yaml.safe_load(MKDOCS.read_text(encoding="utf-8"))["nav"])
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}

    assert len(nav) == len(set(nav)), f"mkdocs.yml's nav lists a page twice: {sorted(nav)}"
    assert not pages - set(nav), f"docs/ pages missing from mkdocs.yml's nav: {sorted(pages - set(nav))}"
    assert not set(nav) - pages, f"mkdocs.yml's nav names pages docs/ does not have: {sorted(set(nav) - pages)}"


def test_the_readme_links_into_the_docs_at_files_that_exist():
    targets = re.findall(r"\]\((docs/[^)#\s]+)", README.read_text(encoding="utf-8"))
    missing = [target for target in targets if not (ROOT / target).is_file()]

    assert targets, "README.md links to no page of the documentation"
    assert any(target.endswith(".png") for target in targets), "README.md shows no screenshot"
    assert not missing, f"README.md links into docs/ at files that do not exist: {missing}"


def test_it_documents_every_run_setting_and_no_other():
    from training.config import AlertRules, RunConfig
    from training.engine.config import TrainConfig

    documented = {
        name
        for title in ("Run settings", "Alert rules", "Training settings")
        for cell in table_first_cells(doc_section("reference/run-settings.md", title))
        for name in re.findall(r"`([a-z0-9_]+)`", cell)
    }
    settings = {*RunConfig.model_fields, *AlertRules.model_fields, *(f.name for f in dataclass_fields(TrainConfig))}

    assert not settings - documented, (
        f"Run settings missing from docs/reference/run-settings.md: {sorted(settings - documented)}"
    )
    assert not documented - settings, (
        f"docs/reference/run-settings.md names settings that do not exist: {sorted(documented - settings)}"
    )


def test_it_documents_every_method_of_the_python_client_and_no_other():
    from artweb.client import Client

    methods = {name for name, value in inspect.getmembers(Client) if callable(value) and not name.startswith("_")}
    documented = {
        name
        for cell in table_first_cells(doc_section("reference/python-client.md", "Methods"))
        for name in re.findall(r"`([a-z_]+)\(", cell)
    }

    assert not methods - documented, (
        f"Client methods missing from docs/reference/python-client.md: {sorted(methods - documented)}"
    )
    assert not documented - methods, (
        f"docs/reference/python-client.md names methods the client does not have: {sorted(documented - methods)}"
    )
