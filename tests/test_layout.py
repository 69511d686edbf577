"""The repository's shape: one installed root, small folders, no import cycles, a map that matches
the code, and nothing read or linked from outside the checkout."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
# The installed subpackages of raypd and the folders they come from (pyproject.toml's package-dir).
PACKAGES = ("engine", "kvtransfer", "protocol", "node", "prefill_node", "decode_node", "flex_node", "conductor",
            "cluster", "metrics", "benchmarks")
# What each package may import, every package named: the one way dependencies point
# (cluster -> conductor, the node roles -> node -> kvtransfer, engine -> protocol).
BELOW_NODES = {"engine", "kvtransfer", "protocol", "metrics"}
ALLOWED = {
    "protocol": set(), "kvtransfer": set(), "metrics": set(), "engine": {"protocol"},
    "conductor": {"protocol", "metrics"},
    "node": BELOW_NODES,
    "prefill_node": BELOW_NODES | {"node"},
    "decode_node": BELOW_NODES | {"node"},
    "flex_node": BELOW_NODES | {"node", "prefill_node", "decode_node"},
    "cluster": BELOW_NODES | {"conductor", "node", "prefill_node", "decode_node", "flex_node"},
    "benchmarks": set(PACKAGES) - {"benchmarks"},
}
MAX_MODULES_PER_FOLDER = 15


def _package_folders(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    return [repo / p for p in packages if (repo / p / "__init__.py").exists()]


def _modules(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted name (raypd.engine.cache.radix_cache; a package is its __init__) -> file."""
    out = {"raypd": repo / "raypd" / "__init__.py"}
    for folder in _package_folders(repo, packages):
        for f in folder.rglob("*.py"):
            parts = ["raypd", *f.relative_to(repo).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


def test_every_top_level_package_is_known():
    folders = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"raypd", "tests"}
    assert folders == set(PACKAGES), f"tests/test_layout.py's PACKAGES lacks {folders - set(PACKAGES)}"
    assert set(ALLOWED) == set(PACKAGES), f"no allowed dependencies stated for {set(PACKAGES) - set(ALLOWED)}"


def test_setuptools_maps_every_package_folder():
    text = (REPO / "pyproject.toml").read_text()
    for folder in _package_folders():
        assert f'"raypd.{folder.name}" = "{folder.name}"' in text, f"{folder.name}/ is not installed under raypd"
        link = REPO / "raypd" / folder.name
        assert link.is_symlink() and link.resolve() == folder, f"raypd/{folder.name} must link to ../{folder.name}"


def test_no_folder_holds_more_than_15_modules():
    crowded = {}
    for folder in _package_folders():
        for d in [folder, *[p for p in folder.rglob("*") if p.is_dir()]]:
            n = len([f for f in d.glob("*.py") if f.name != "__init__.py"])
            if n > MAX_MODULES_PER_FOLDER:
                crowded[str(d.relative_to(REPO))] = n
    assert not crowded, f"split these folders by concept: {crowded}"


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Every raypd module this one imports, at any depth of the file (function-level imports too)."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from pkg import sub` imports the submodule when one exists, else a name of pkg.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import raypd.a.b` names a module; attributes are cut off
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _import_graph(modules: dict[str, Path]) -> nx.DiGraph:
    known = set(modules)
    graph = nx.DiGraph()
    for name, path in modules.items():
        for dep in _imports(name, path, known):
            graph.add_edge(name, dep)
    # A package's __init__ that re-exports its own modules is not a cycle with them: importing a
    # submodule runs the parent's __init__ first, which is Python's own order, not our dependency.
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges) if a.startswith(b + ".")])
    return graph


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "raypd"


def import_cycles(modules: dict[str, Path]) -> tuple[list[list[str]], list[list[str]]]:
    """(cycles among modules, cycles among top-level packages): two packages can import each other
    through different modules with no module cycle, and that is still a knot in the layering."""
    graph = _import_graph(modules)
    packages = nx.DiGraph((_package(a), _package(b)) for a, b in graph.edges if _package(a) != _package(b))
    return ([sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1],
            [sorted(c) for c in nx.strongly_connected_components(packages) if len(c) > 1])


def test_no_import_cycles_counting_function_level_imports():
    module_cycles, package_cycles = import_cycles(_modules())
    assert not module_cycles, f"import cycles: {module_cycles}"
    assert not package_cycles, f"package cycles: {package_cycles}"


def test_a_package_cycle_without_a_module_cycle_is_found(tmp_path):
    # roles/a.py imports core/b.py, and core/c.py imports roles/d.py: no module imports itself back,
    # but the packages form a knot (as node/flex_node.py once made with the role packages).
    files = {"raypd/__init__.py": "", "roles/__init__.py": "", "core/__init__.py": "",
             "roles/a.py": "from raypd.core import b\n", "core/b.py": "",
             "core/c.py": "def late():\n    from raypd.roles.d import X\n", "roles/d.py": "X = 1\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    module_cycles, package_cycles = import_cycles(_modules(tmp_path, ("roles", "core")))
    assert module_cycles == [] and package_cycles == [["core", "roles"]]


def test_dependencies_point_one_way():
    """Each package imports only what ALLOWED says (engine only protocol, kvtransfer nothing, node no role)."""
    modules = _modules()
    known = set(modules)
    wrong = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 2:
            continue
        for dep in _imports(name, path, known):
            dep_pkg = _package(dep)
            if dep_pkg != parts[1] and dep_pkg not in ALLOWED[parts[1]]:
                wrong.append(f"{name} -> {dep}")
    assert not wrong, wrong


def _architecture_rows() -> dict[str, set[str]]:
    """Section folder ('engine/cache/') -> module file names named in that section's table rows."""
    rows: dict[str, set[str]] = {}
    section = None
    for line in (REPO / "docs" / "architecture.md").read_text().splitlines():
        heading = re.match(r"#+ `?([a-z_]+(?:/[a-z_]+)*/)", line)
        if heading:
            section = heading.group(1)
            rows.setdefault(section, set())
        elif section and line.startswith("|"):
            first_cell = line.split("|")[1]
            rows[section].update(re.findall(r"`([\w/]+\.py)`", first_cell))
    return rows


def test_every_module_has_a_row_in_the_map():
    rows = _architecture_rows()
    missing, stale = [], []
    for folder in _package_folders():
        for f in folder.rglob("*.py"):
            if f.name == "__init__.py":
                continue
            section = str(f.parent.relative_to(REPO)) + "/"
            if f.name not in rows.get(section, set()):
                missing.append(str(f.relative_to(REPO)))
    for section, names in rows.items():
        for name in names:
            if not (REPO / section / name).exists():
                stale.append(section + name)
    assert not missing, f"modules without a row in docs/architecture.md (under a '## folder/' heading): {missing}"
    assert not stale, f"rows in docs/architecture.md naming modules that do not exist: {stale}"


def test_package_docstrings_point_to_the_map():
    """One sentence each; the module lists live in docs/architecture.md only, so they cannot drift."""
    for folder in _package_folders():
        for init in folder.rglob("__init__.py"):
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            rel = init.relative_to(REPO)
            assert "docs/architecture.md" in doc, f"{rel}: docstring should point to docs/architecture.md"
            assert ".py" not in doc and "|" not in doc, f"{rel}: lists modules; the map is docs/architecture.md"


def test_nothing_reads_or_links_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in tracked:
        path = REPO / name
        if not path.exists() and not path.is_symlink():  # deleted in the work tree, not yet committed
            continue
        if path == Path(__file__).resolve():  # this test names the paths it looks for
            continue
        if path.is_symlink():
            if REPO not in path.resolve().parents:
                offenders.append(f"{name} links outside")
            continue
        # Code, docs and config; recorded results (docs/results/*.json) only name the paths a run used.
        if path.suffix not in (".py", ".md", ".yaml", ".yml", ".toml", ".tpl") \
                and path.name not in ("Makefile", "run"):
            continue
        text = path.read_text(errors="replace")
        if "../shared" in text or "/work/shared" in text:
            offenders.append(name)
    assert not offenders, f"these read or link outside the repository: {offenders}"


@pytest.mark.parametrize("name", ["engine", "node", "cluster", "benchmarks", "conductor", "kvtransfer", "protocol"])
def test_only_the_root_package_is_installed(name, tmp_path):
    """From outside the checkout the generic names are not importable; raypd's are."""
    code = (f"import importlib.util, raypd, raypd.{name}; "
            f"assert importlib.util.find_spec({name!r}) is None, 'top-level {name} is importable'")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_public_entry_points_resolve_outside_the_checkout(tmp_path):
    code = ("import importlib; "
            "mod, _, attr = 'raypd.cluster.serve_app:app_builder'.partition(':'); "
            "assert callable(getattr(importlib.import_module(mod), attr)); "
            "from importlib.metadata import entry_points; "
            "(ep,) = [e for e in entry_points(group='console_scripts') if e.name == 'raypd']; "
            "assert callable(ep.load())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    bench = subprocess.run([sys.executable, "-m", "raypd", "bench", "--help"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    for name in ("pd", "transfer", "engine", "routing", "conductor", "streaming"):
        assert name in bench.stdout, f"raypd bench {name} is gone"


def test_node_classes_reach_into_no_other_object_private_parts():
    """The node packages compose (a core, a duty, stages) through public interfaces: no `x._name`
    on anything but self, which is how FlexNode once drove both role classes."""
    reaches = []
    for pkg in ("node", "prefill_node", "decode_node", "flex_node"):
        for f in (REPO / pkg).rglob("*.py"):
            for n in ast.walk(ast.parse(f.read_text())):
                if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__") and \
                        not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                    reaches.append(f"{f.relative_to(REPO)}:{n.lineno} {ast.unparse(n)}")
    assert not reaches, reaches
