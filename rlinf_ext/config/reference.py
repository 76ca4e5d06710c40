"""The key reference of ``docs/contracts.md``, generated from the schema and the compatibility table.

``python -m rlinf_ext.config.reference`` rewrites the marked blocks of ``docs/contracts.md`` (key, type and default
per key; the engine table; the compatibility table); ``--check`` exits 1 when they differ from the schema. The help texts stay out of
the doc, so it reads in one sitting: ``rlinf-ext keys [PREFIX]`` prints them. ``SCHEMA`` holds the central schema,
every registered agent's section and every built-in tool's (one more ``(prefix, dataclass)`` pair each).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinf_ext.config.agent_schema import agent_sections, builtin_tool_sections
from rlinf_ext.config.compat import COMPAT
from rlinf_ext.config.schema import REQUIRED, ExperimentConfig
from rlinf_ext.config.structure import type_name
from rlinf_ext.protocol.agents import AGENTS
from rlinf_ext.protocol.engines import ENGINES

Section = tuple[str, type]  # (dotted prefix, "" for the root; a dataclass)
SCHEMA: tuple[Section, ...] = (
    ("", ExperimentConfig),
    *(section for spec in AGENTS.values() for section in agent_sections(spec)),
    *builtin_tool_sections(),
)
DOC = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
KEYS_BLOCK, COMPAT_BLOCK, ENGINES_BLOCK = "keys", "compat", "engines"
REGENERATE = "python -m rlinf_ext.config.reference"


@dataclass(frozen=True)
class Leaf:
    """One key of the schema: a dataclass field that is not itself a section."""

    key: str  # dotted name
    owner: type  # the dataclass that declares the field
    field: dataclasses.Field
    annotation: Any

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def help(self) -> str:
        return self.field.metadata.get("help", "")

    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        return self.field.default_factory()  # a list or a mapping


def section_class(f: dataclasses.Field) -> type | None:
    """The dataclass of a section field (``fld(SomeConfig, ...)``), else None."""
    sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
    return sub if isinstance(sub, type) and dataclasses.is_dataclass(sub) else None


def leaves(sections: Sequence[Section] = SCHEMA) -> Iterator[Leaf]:
    """Every leaf below each (prefix, dataclass), depth first in declaration order."""
    for prefix, cls in sections:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            sub = section_class(f)
            if sub is not None:
                yield from leaves(((key, sub),))
            else:
                yield Leaf(key, cls, f, hints[f.name])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "??? (required)" if value == REQUIRED else value
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def keys_markdown(sections: Sequence[Section] = SCHEMA) -> str:
    """One table per top-level section (in order of first appearance): key, type, default."""
    groups: dict[str, list[Leaf]] = {}
    for leaf in leaves(sections):
        groups.setdefault(leaf.key.split(".")[0], []).append(leaf)
    out: list[str] = []
    for top, group in groups.items():
        out += ["", f"`{top}`", "", "| key | type | default |", "|---|---|---|"]
        out += [
            f"| `{leaf.key}` | {_cell(type_name(leaf.annotation))} | `{_cell(_yaml(leaf.default()))}` |"
            for leaf in group
        ]
    return "\n".join(out[1:])


def keys_text(prefix: str = "", sections: Sequence[Section] = SCHEMA) -> str:
    """Every key equal to ``prefix`` or below it, with its type, default and help; "" if none."""
    out = []
    for leaf in leaves(sections):
        if not prefix or leaf.key == prefix or leaf.key.startswith(prefix.rstrip(".") + "."):
            out += [f"{leaf.key}: {type_name(leaf.annotation)} = {_yaml(leaf.default())}", f"    {leaf.help}"]
    return "\n".join(out)


def compat_markdown() -> str:
    out = ["| RLinf key | accepted value | what rlinf_ext does instead |", "|---|---|---|"]
    out += [f"| `{e.key}` | `{_cell(e.accepted_text())}` | {_cell(e.why)} |" for e in COMPAT]
    return "\n".join(out)


def engines_markdown() -> str:
    """One row per entry of the engine table (``protocol/engines.py``)."""
    out = [
        "| `rollout_backend` | runs on | GPU weight sync: collocated / disaggregated | partial rollout | evaluates | GPU install |",
        "|---|---|---|---|---|---|",
    ]
    for e in ENGINES.values():
        evaluates = ", ".join(kind for kind, vision in (("text", False), ("VL", True)) if e.evaluates(vision))
        out.append(
            f"| `{e.name}` | {', '.join(e.devices)} | {e.collocated_route} / {e.disaggregated_route} | "
            f"{'yes' if e.partial_rollout else 'no'} | {evaluates or 'no'} | {_cell(e.install or 'the CPU install')} |"
        )
    return "\n".join(out)


def _replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"docs/contracts.md needs exactly one {begin} ... {end} block.")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render(text: str, sections: Sequence[Section] = SCHEMA) -> str:
    """``text`` (docs/contracts.md) with its generated blocks rewritten."""
    text = _replace_block(text, KEYS_BLOCK, keys_markdown(sections))
    text = _replace_block(text, ENGINES_BLOCK, engines_markdown())
    return _replace_block(text, COMPAT_BLOCK, compat_markdown())


def add_arguments(verb: str, parser: argparse.ArgumentParser) -> None:
    """`rlinf-ext keys [PREFIX]`."""
    parser.add_argument("prefix", nargs="?", default="", help="a key or a section, e.g. runner or tools.search")


def run(verb: str, args: argparse.Namespace) -> int:
    text = keys_text(args.prefix)
    if not text:
        sections = sorted({leaf.key.split(".")[0] for leaf in leaves()})
        print(
            f"rlinf-ext keys: no key is {args.prefix!r} or below it; the sections are {', '.join(sections)}.",
            file=sys.stderr,
        )
        return 1
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/contracts.md is not up to date")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    fresh = render(text)
    if args.check:
        if fresh != text:
            print(f"{args.doc}: the key reference differs from the schema; regenerate it with `{REGENERATE}`.")
            return 1
        return 0
    if fresh != text:
        args.doc.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
