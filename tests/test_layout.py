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
PACKAGES = ("engine", "kvtransfer", "protocol", "node", "prefill_node", "decode_node", "conductor", "cluster",
            "metrics", "benchmarks")
MAX_MODULES_PER_FOLDER = 15


def _package_folders() -> list[Path]:
    return [REPO / p for p in PACKAGES if (REPO / p / "__init__.py").exists()]


def _modules() -> dict[str, Path]:
    """Dotted name (raypd.engine.cache.radix_cache; a package is its __init__) -> file."""
    out = {"raypd": REPO / "raypd" / "__init__.py"}
    for folder in _package_folders():
        for f in folder.rglob("*.py"):
            parts = ["raypd", *f.relative_to(REPO).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


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


def test_no_import_cycles_counting_function_level_imports():
    modules = _modules()
    known = set(modules)
    graph = nx.DiGraph()
    for name, path in modules.items():
        for dep in _imports(name, path, known):
            graph.add_edge(name, dep)
    # A package's __init__ that re-exports its own modules is not a cycle with them: importing a
    # submodule runs the parent's __init__ first, which is Python's own order, not our dependency.
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges) if a.startswith(b + ".")])
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def test_dependencies_point_one_way():
    """engine imports only protocol; kvtransfer imports no other raypd package; conductor no torch-side one."""
    modules = _modules()
    known = set(modules)
    allowed = {
        "protocol": set(), "kvtransfer": set(), "metrics": set(), "engine": {"protocol"},
        "conductor": {"protocol", "metrics"},
    }
    wrong = []
    for name, path in modules.items():
        parts = name.split(".")
        if len(parts) < 2 or parts[1] not in allowed:
            continue
        for dep in _imports(name, path, known):
            dep_pkg = dep.split(".")[1] if dep.count(".") else "raypd"
            if dep_pkg != parts[1] and dep_pkg not in allowed[parts[1]]:
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
