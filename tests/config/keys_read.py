"""Where schema keys are read: a static scan (Python's ast) of the modules outside ``rlinf_ext/config/``.

A leaf ``... .P.L`` declared by the dataclass ``C`` counts as read in a module that has
- the attribute chain ``<anything>.P.L`` (``cfg.rollout.vllm.sleep_level``), or ``getattr(<...>.P, "L")``;
- ``v.L`` or ``getattr(v, "L")`` where ``v`` is bound to ``<...>.P`` (``vllm = cfg.rollout.vllm``, also in a tuple
  assignment) or annotated ``C`` (a parameter ``options: VLLMConfig``);
- ``getattr(v, name)`` with such a ``v`` and the string ``"L"`` in the module (a loop over a tuple of names);
- the dotted name ``"P.L"`` (or the full key) as a string.
A leaf whose value another read leaf's default interpolates (``${algorithm.training_batch_size_per_gpu}``) is read
through it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlinf_ext.config.reference import SCHEMA, Leaf, Section, leaves

PACKAGE = Path(__file__).resolve().parents[2] / "rlinf_ext"


@dataclass
class ModuleReads:
    chains: set[tuple[str, str]] = field(default_factory=set)  # (P, L) of <...>.P.L
    on_names: set[tuple[str, str]] = field(default_factory=set)  # (v, L) of v.L / getattr(v, "L")
    dynamic_on: set[str] = field(default_factory=set)  # bases of getattr(base, name): "P" or a variable
    bound: dict[str, set[str]] = field(default_factory=dict)  # variable -> {P of <...>.P it was assigned}
    annotated: dict[str, set[str]] = field(default_factory=dict)  # variable -> {class names it is annotated}
    aliases: dict[str, set[str]] = field(default_factory=dict)  # holder -> {variables assigned to it}
    strings: set[str] = field(default_factory=set)
    words: set[str] = field(default_factory=set)  # identifiers and the words of strings (section mentions)


def _annotation_names(node: ast.AST | None) -> set[str]:
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _base(node: ast.AST) -> tuple[str, str] | None:
    """("attr", P) for <...>.P, ("name", v) for a variable v."""
    if isinstance(node, ast.Attribute):
        return "attr", node.attr
    if isinstance(node, ast.Name):
        return "name", node.id
    return None


def scan_module(source: str) -> ModuleReads:
    reads = ModuleReads()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            base = _base(node.value)
            if base and base[0] == "attr":
                reads.chains.add((base[1], node.attr))
            elif base:
                reads.on_names.add((base[1], node.attr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) >= 2
        ):
            base, name = _base(node.args[0]), node.args[1]
            if base is None:
                continue
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                (reads.chains if base[0] == "attr" else reads.on_names).add((base[1], name.value))
            else:
                reads.dynamic_on.add(base[1])
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (
                    zip(target.elts, node.value.elts)
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    else [(target, node.value)]
                )
                for t, v in pairs:
                    holder = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                    if holder and isinstance(v, ast.Attribute):
                        reads.bound.setdefault(holder, set()).add(v.attr)
                    elif holder and isinstance(v, ast.Name):
                        reads.aliases.setdefault(holder, set()).add(v.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            reads.annotated.setdefault(node.target.id, set()).update(_annotation_names(node.annotation))
            if isinstance(node.value, ast.Attribute):
                reads.bound.setdefault(node.target.id, set()).add(node.value.attr)
        elif isinstance(node, ast.arg):
            reads.annotated.setdefault(node.arg, set()).update(_annotation_names(node.annotation))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            reads.strings.add(node.value)
            reads.words.update(re.findall(r"\w+", node.value))
        if isinstance(node, ast.Name):
            reads.words.add(node.id)
        elif isinstance(node, ast.Attribute):
            reads.words.add(node.attr)
    return reads


def _reads_leaf(reads: ModuleReads, leaf: Leaf) -> bool:
    parts = leaf.key.split(".")
    parent, name, owner = parts[-2], parts[-1], leaf.owner.__name__
    if (parent, name) in reads.chains or f"{parent}.{name}" in reads.strings or leaf.key in reads.strings:
        return True

    def holds_section(var: str, seen: frozenset[str] = frozenset()) -> bool:
        if parent in reads.bound.get(var, ()) or owner in reads.annotated.get(var, ()):
            return True
        return any(holds_section(a, seen | {var}) for a in reads.aliases.get(var, ()) if a not in seen)

    if any(holds_section(var) for var, attr in reads.on_names | reads.chains if attr == name):
        return True
    accessed = any(attr == name for _, attr in reads.on_names | reads.chains)
    if accessed and (parent in reads.words or owner in reads.words):
        return True  # `.L` in a module that names the section (its holder is typed Any or passed along)
    dynamic = parent in reads.dynamic_on or any(holds_section(var) for var in reads.dynamic_on)
    return dynamic and name in reads.strings


def modules(root: Path = PACKAGE) -> dict[Path, ModuleReads]:
    """Every module of the package outside config/, scanned."""
    return {
        path: scan_module(path.read_text())
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] != "config"
    }


def readers(leaf: Leaf, scanned: dict[Path, ModuleReads] | None = None) -> list[Path]:
    """The modules that read ``leaf`` (for a failure message, and to check the scan by hand)."""
    scanned = modules() if scanned is None else scanned
    return [path for path, reads in scanned.items() if _reads_leaf(reads, leaf)]


def unread_leaves(
    sections: Sequence[Section] = SCHEMA, allowed: Iterable[str] = (), scanned: dict[Path, ModuleReads] | None = None
) -> list[str]:
    """Keys of ``sections`` that no scanned module reads, minus ``allowed``."""
    scanned = modules() if scanned is None else scanned
    all_leaves = list(leaves(sections))
    read = {leaf.key for leaf in all_leaves if any(_reads_leaf(r, leaf) for r in scanned.values())}
    read |= set(allowed)
    changed = True
    while changed:  # a leaf interpolated by a read leaf's default is read through it
        changed = False
        for leaf in all_leaves:
            default = leaf.field.default
            if leaf.key in read and isinstance(default, str):
                for other in all_leaves:
                    if other.key not in read and "${" + other.key + "}" in default:
                        read.add(other.key)
                        changed = True
    return [leaf.key for leaf in all_leaves if leaf.key not in read]
