"""The key reference of docs/contracts.md is what the schema and the compatibility table say; `rlinf-ext keys`
prints the help texts the doc leaves out."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_ext.cli import main as cli
from rlinf_ext.config.compat import COMPAT
from rlinf_ext.config.reference import DOC, REGENERATE, SCHEMA, keys_markdown, leaves, main, render
from rlinf_ext.config.schema import fld


def test_contracts_key_reference_is_generated_from_the_schema():
    text = DOC.read_text()
    assert render(text) == text, f"docs/contracts.md's key reference differs from the schema: run `{REGENERATE}`."


def test_every_key_and_compat_key_is_in_the_doc():
    text = DOC.read_text()
    for leaf in leaves(SCHEMA):
        assert f"| `{leaf.key}` |" in text
    for entry in COMPAT:
        assert f"| `{entry.key}` |" in text


@dataclass
class _Mounted:
    budget: int = fld(3, "Calls at most.")


def test_a_mounted_section_is_one_more_pair(tmp_path):
    table = keys_markdown([*SCHEMA, ("agentloop.calculator", _Mounted)])
    agentloop = table.split("`agentloop`")[1].split("\n\n`")[0]  # the agentloop table, not a second one
    assert table.count("`agentloop`\n") == 1
    assert "| `agentloop.calculator.budget` | int | `3` |" in agentloop
    stale = tmp_path / "contracts.md"
    stale.write_text(
        "x\n<!-- keys:begin -->\nold\n<!-- keys:end -->\n<!-- engines:begin -->\n<!-- engines:end -->\n"
        "<!-- compat:begin -->\n<!-- compat:end -->\n"
    )
    assert main(["--check", "--doc", str(stale)]) == 1
    assert main(["--doc", str(stale)]) == 0 and main(["--check", "--doc", str(stale)]) == 0
    assert "| `runner.max_steps` |" in stale.read_text()
    assert "| `vllm` | cpu, gpu | ipc / nccl | yes |" in stale.read_text()  # the engine table, from its entries


def test_a_changed_default_makes_the_doc_stale():
    text = DOC.read_text()
    row = "| `runner.max_steps` | int | `"
    assert row in text
    stale = text.replace(row, row + "9", 1)
    assert render(stale) != stale and render(stale) == text


def test_keys_prints_the_help_under_a_prefix(capsys):
    assert cli(["keys", "runner.max_staleness"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("runner.max_staleness: int = 0\n    ") and out.count("\n    ") == 1
    assert cli(["keys", "agentloop.searchr1"]) == 0
    keys = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if not line.startswith(" ")]
    assert keys and all(k.startswith("agentloop.searchr1.") for k in keys)


def test_keys_refuses_an_unknown_prefix_naming_the_sections(capsys):
    assert cli(["keys", "runer"]) == 1
    err = capsys.readouterr().err
    assert "'runer'" in err and "runner" in err
