"""The package's layout: data flows one way through the stages (docs/layout.md, "The package").

Every import in longctx/ is read with ast (module-level and late imports alike) and checked
against the stage order; the tests at the bottom make sure the checker itself catches what it is
meant to catch, on small packages written for the purpose.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "longctx"
# The stages, earliest first: a module may import its own stage and earlier ones, never a later one.
# "core" is the floor (with the root package's __version__); "config" is longctx/config.py, "cli"
# longctx/cli.py and longctx/__main__.py (and longctx/snakemake_hook.py: an entry point too, run as
# Snakemake starts, which may use the config's words).
STAGES = ("core", "specs", "attention", "refengine", "engines", "config", "measure", "analysis", "report", "cli")
TOP_LEVEL = {"__init__": "core", "config": "config", "cli": "cli", "__main__": "cli", "snakemake_hook": "cli"}
# The reference engine is a server of its own: it stands on the attention kernels and the specs only.
REFENGINE_MAY_IMPORT = {"refengine", "attention", "specs", "root"}
ENGINE_PACKAGES = ("engines", "refengine")


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__), for every .py under root."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        parts = list(p.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (p, is_pkg)
    return out


def stage(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"  # the root package: __version__
    if len(parts) == 2 and parts[1] in TOP_LEVEL:
        return TOP_LEVEL[parts[1]]
    return parts[1]


def _absolute(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_pkg:
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports(module: str, path: Path, is_pkg: bool, known: dict) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import of the package in path."""
    root = module.split(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == root]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_pkg, node.level, node.module)
            if target.split(".")[0] != root:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub, None, node.lineno) if sub in known else (target, a.name, node.lineno))
    return found


def private_attributes(module: str, path: Path, is_pkg: bool, known: dict) -> list[tuple[str, str, str, int]]:
    """(alias, module, name, line) for every `alias._name` where alias is another package module imported
    by name (`from . import microbench`, `import longctx.x as y`)."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_pkg, node.level, node.module)
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in known:
                    aliases[a.asname] = a.name
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != module):
            out.append((node.value.id, aliases[node.value.id], node.attr, node.lineno))
    return out


def problems(root: Path, stages=STAGES, refengine_may_import=REFENGINE_MAY_IMPORT) -> list[str]:
    """Every import that breaks the stage order, reaches another module's private names, leaves the
    reference engine's allowed stages, or closes a cycle."""
    known = modules(root)
    order = {s: i for i, s in enumerate(stages)}
    out, graph = [], {}
    for module, (path, is_pkg) in known.items():
        where = f"{path.relative_to(root.parent)}"
        src = stage(module)
        if src not in order:
            out.append(f"{where}: stage {src!r} is not in the documented order {stages}")
            continue
        for target, name, line in imports(module, path, is_pkg, known):
            if target not in known:
                out.append(f"{where}:{line}: imports {target}, which does not exist")
                continue
            dst = stage(target)
            if target != module:
                graph.setdefault(module, set()).add(target)
            if order.get(dst, -1) > order[src]:
                out.append(f"{where}:{line}: {src} imports {target} ({dst}), a later stage")
            if src == "refengine" and (dst if len(target.split(".")) > 1 else "root") not in refengine_may_import:
                out.append(f"{where}:{line}: the reference engine imports {target} ({dst})")
            if name and name.startswith("_") and not name.startswith("__") and target != module:
                out.append(f"{where}:{line}: imports the private name {name} of {target}")
        for alias, target, name, line in private_attributes(module, path, is_pkg, known):
            out.append(f"{where}:{line}: reads the private name {name} of {target} (as {alias}.{name})")
    out += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (or a self-import)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_engine(node: ast.AST) -> bool:
    """engine, x.engine, x["engine"], x.get("engine"): an expression that is the engine's name."""
    if isinstance(node, ast.Name):
        return "engine" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "engine" in node.attr.lower()
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "engine"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        return isinstance(node.args[0], ast.Constant) and node.args[0].value == "engine"
    return False


def engine_tests(root: Path) -> list[str]:
    """Outside engines/ and refengine/: the string "reference" (the reference engine's name) and any
    comparison of something named engine with a string."""
    out = []
    for module, (path, _) in modules(root).items():
        if stage(module) in ENGINE_PACKAGES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "reference":
                out.append(f"{path.relative_to(root.parent)}:{node.lineno}: names the reference engine")
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(_is_engine, sides)) and any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno}: asks which engine it has: {ast.unparse(node)}")
    return out


def test_data_flows_one_way_through_the_stages():
    assert problems(PACKAGE) == []


def test_only_the_engines_know_which_engine_they_drive():
    assert engine_tests(PACKAGE) == []


# measure/ is one concept per module (docs/layout.md names each): a module that outgrows this holds two
MEASURE_MAX_LINES = 400


def oversized(directory: Path, limit: int = MEASURE_MAX_LINES) -> list[str]:
    """The modules under directory longer than limit lines, with their length."""
    return [f"{p.relative_to(directory.parent)}: {n} lines" for p in sorted(directory.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]


def test_measure_keeps_one_concept_per_module():
    assert oversized(PACKAGE / "measure") == []


def test_the_size_check_finds_a_module_that_grew(tmp_path):
    root = _package(tmp_path, {"measure/small.py": "x = 1\n", "measure/big.py": "x = 1\n" * (MEASURE_MAX_LINES + 1)})
    assert oversized(root / "measure") == [f"measure/big.py: {MEASURE_MAX_LINES + 1} lines"]


def test_every_stage_of_the_order_is_a_package_or_a_module_that_exists():
    for s in STAGES:
        assert (PACKAGE / s).is_dir() or (PACKAGE / f"{s}.py").is_file(), s


# --- the checker on packages made for the purpose ---------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "longctx"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()
    return root


def test_the_checker_finds_a_later_stage_a_cycle_a_private_name_and_the_engine_leaving_its_stages(tmp_path):
    root = _package(tmp_path, {
        "measure/sweep.py": "from ..analysis.fits import fit\n",  # measure reaching forward
        "analysis/fits.py": "def fit(): ...\n",
        "config.py": "def late():\n    from .engines import base\n",
        "engines/base.py": "from ..config import late\n",  # config -> engines -> config
        "report/markdown.py": "from .latex import _escape\n",
        "report/latex.py": "def _escape(): ...\n",
        "attention/kernelbench.py": "from . import microbench\n\ndef f():\n    return microbench._timed()\n",
        "attention/microbench.py": "def _timed(): ...\n",
        "refengine/server.py": "from ..measure import sweep\n",
    })
    found = "\n".join(problems(root))
    assert "measure imports longctx.analysis.fits (analysis), a later stage" in found
    assert "imports the private name _escape of longctx.report.latex" in found
    assert "reads the private name _timed of longctx.attention.microbench (as microbench._timed)" in found
    assert "import cycle: longctx.config -> longctx.engines.base -> longctx.config" in found
    assert "the reference engine imports longctx.measure.sweep (measure)" in found
    assert "engines imports longctx.config (config), a later stage" in found


def test_the_checker_passes_a_package_that_keeps_the_order(tmp_path):
    root = _package(tmp_path, {
        "core/errors.py": "class ConfigError(ValueError): ...\n",
        "engines/base.py": "from ..core.errors import ConfigError\n",
        "config.py": "from .core.errors import ConfigError\nfrom .engines import base\n",
        "refengine/server.py": "from .. import __version__\nfrom ..specs import pool\n",
        "specs/pool.py": "",
    })
    (root / "__init__.py").write_text("__version__ = '0'\n")
    assert problems(root) == []


def test_the_engine_check_finds_a_branch_on_the_engine(tmp_path):
    root = _package(tmp_path, {"analysis/memory.py": "def f(entry):\n    return entry.get('engine') != 'reference'\n",
                               "engines/reference.py": "NAME = 'reference'\n"})
    found = engine_tests(root)
    assert len(found) == 2 and all(f.startswith("longctx/analysis/memory.py:2") for f in found)


@pytest.mark.parametrize("bad", ["from ..nothing import x\n", "import longctx.nothing\n"])
def test_the_checker_reports_an_import_of_a_missing_module(tmp_path, bad):
    root = _package(tmp_path, {"measure/x.py": bad})
    assert any("longctx.nothing, which does not exist" in p for p in problems(root))
