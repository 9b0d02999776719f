"""The floors of the package: what each loads when imported (the protocols build jobs and decide
without model code; the plain-data modules under them need nothing but numpy; each import runs
in a fresh interpreter, so a module another test loaded cannot hide a heavy one), and the import
graph: no module imports from a floor above its own, and no imports go in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import wanspec


def _loaded_after(statement: str, heavy: tuple[str, ...]) -> list[str]:
    """The `heavy` top-level packages loaded by running `statement` in a fresh interpreter."""
    probe = f"import sys\n{statement}\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.split()


def _protocol_modules() -> list[str]:
    folder = Path(wanspec.__file__).parent / "protocols"
    return sorted(
        f"wanspec.protocols.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"
    )


def test_the_protocols_load_no_model_code_and_no_tensor_library() -> None:
    """Machines get arrays: every protocol module (and the job and runtime types they use) loads
    neither torch nor transformers nor a model module."""
    modules = ", ".join([*_protocol_modules(), "wanspec.jobs", "wanspec.runtime"])
    heavy = ("torch", "transformers", "wanspec.models.lm")
    assert _loaded_after(f"import {modules}", heavy) == []


@pytest.mark.parametrize(
    "module",
    [
        "wanspec.jobs",
        "wanspec.models.batch_policy",
        "wanspec.wire",
        "wanspec.link",
        "wanspec.runtime",
        "wanspec.sampling",
        "wanspec.sampling.proposal",
        "wanspec.vocab",
    ],
)
def test_plain_data_modules_need_nothing_but_numpy(module: str) -> None:
    assert _loaded_after(f"import {module}", ("torch", "transformers")) == []


# The floors of docs/ARCHITECTURE.md: a module imports only from its own floor or those below.
FLOORS = {
    "sampling": 0,
    "paths": 0,
    "vocab": 1,
    "wire": 1,
    "jobs": 1,
    "assets": 1,
    "link": 1,
    "models": 1,
    "protocols": 2,
    "runtime": 2,
    "sim": 3,
    "net": 3,
    "api": 4,
    "settings_cli": 4,
    "edge_service": 5,
    "bench": 5,
    "cli": 6,
}
SOURCE = Path(wanspec.__file__).parent


def _imports() -> dict[str, set[str]]:
    """wanspec module → the wanspec modules it imports (at any level, TYPE_CHECKING left out)."""
    modules = {
        ".".join(("wanspec", *p.relative_to(SOURCE).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): p
        for p in SOURCE.rglob("*.py")
    }
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        hidden = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(tree):
            if id(node) in hidden or not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            found.update(_targets(node, package, modules))
        graph[name] = found - {name}
    return graph


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: dict) -> set[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parts, base] if base else parts)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("wanspec."):
            out.add(name)
    return out


def _floor(module: str) -> int | None:
    return FLOORS.get(module.split(".")[1]) if module.count(".") else None


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in _imports().items()
        for b in targets
        if _floor(a) is not None and _floor(b) is not None and _floor(b) > _floor(a)
    ]
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    graph = _imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target] if target in path else [target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [module])):
            raise AssertionError(" -> ".join(cycle))


def test_the_drivers_share_the_link_model_not_each_other() -> None:
    assert _loaded_after("import wanspec.sim", ("wanspec.net",)) == []
    assert _loaded_after("import wanspec.net.shaping, wanspec.net.proxy", ("wanspec.sim",)) == []


# Reads of another module's private attributes that stay, each with its reason, keyed by
# (file under wanspec/, attribute).
FOREIGN_PRIVATE_ALLOWED = {
    ("bench/metrics.py", "_extract_corpus_statistics"): (
        "sacrebleu offers a sentence's BLEU sufficient statistics (what corpus_score sums) only "
        "here, and the paired bootstrap resamples exactly those"
    ),
    ("bench/metrics.py", "_compute_score_from_stats"): (
        "sacrebleu's one way to score summed statistics with the smoothing and brevity penalty "
        "of its corpus_score, so a resampled corpus scores as sacrebleu would score it"
    ),
}
_SELF_NAMES = {"self", "cls"}


def _defined_here(tree: ast.Module) -> set[str]:
    """Attribute names a module defines: its functions, classes and methods, the names its class
    bodies assign (fields) and what it assigns on `self` or `cls`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        stored = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
        if stored and _is_self(node.value):
            names.add(node.attr)
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else []
                targets += [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _is_self(node: ast.expr) -> bool:
    """`self`, `cls` or `super()`: the object's own attributes, wherever the class was defined."""
    if isinstance(node, ast.Name):
        return node.id in _SELF_NAMES
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "super"


def _foreign_private_reads(path: Path, used: set[tuple[str, str]]) -> list[str]:
    """`path:line: expr` for each `<obj>._name` (read or written) in `path` where `<obj>` is not
    the object itself and no code of this module defines `_name`; allowed ones go to `used`."""
    tree = ast.parse(path.read_text())
    own, where = _defined_here(tree), path.relative_to(SOURCE).as_posix()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        dunder = node.attr.startswith("__") and node.attr.endswith("__")
        if dunder or _is_self(node.value) or node.attr in own:
            continue
        if (where, node.attr) in FOREIGN_PRIVATE_ALLOWED:
            used.add((where, node.attr))
            continue
        found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_attributes() -> None:
    """A session's cache, a store's trie: a module reaches into an object only through what the
    object's class makes public, unless that class is defined in the same module (a helper class
    beside the one it serves); dunder names are public protocol."""
    used: set[tuple[str, str]] = set()
    found = [
        hit for path in sorted(SOURCE.rglob("*.py")) for hit in _foreign_private_reads(path, used)
    ]
    assert found == []
    assert set(FOREIGN_PRIVATE_ALLOWED) - used == set(), "an allowed read no longer happens"


def _private_imports(path: Path) -> list[str]:
    """`path:line: name` for each private name `path` imports from another wanspec module."""
    tree = ast.parse(path.read_text())
    where = path.relative_to(SOURCE).as_posix()
    return [
        f"{where}:{node.lineno}: {node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("wanspec")
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.endswith("__")
    ]


def test_no_module_imports_another_modules_private_names() -> None:
    """What one module needs of another is part of that module's public surface: a private
    name imported elsewhere is a helper that should be public, or logic in the wrong place
    (dunder names such as `__version__` are public)."""
    assert [hit for path in sorted(SOURCE.rglob("*.py")) for hit in _private_imports(path)] == []
