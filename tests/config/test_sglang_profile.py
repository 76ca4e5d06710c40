"""`rollout.rollout_backend=sglang` validates where the SGLang profile (sglang 0.5.23) is installed, and is refused
with the install command where it is not (config/rules/hardware.py `engine_profile_installed`, reading the entry's
pin in protocol/engines.py).

The installed version is read from sglang's metadata (`engines.installed_version`); these tests set what it reports.
"""

from __future__ import annotations

import pytest

from rlinf_ext.config import check_config
from rlinf_ext.protocol import engines

SGLANG_CONFIGS = ("qwen2.5-3b-tool-1node", "qwen2.5-3b-tool-1node-eval", "qwen2.5-vl-7b-1node", "qwen2.5-vl-7b-eval")


def backend_issues(name: str, overrides=()) -> list:
    return [
        i
        for i in check_config(name, ["rollout.rollout_backend=sglang", *overrides]).issues
        if i.key == "rollout.rollout_backend"
    ]


@pytest.mark.parametrize("reported", [None, "0.4.6.post5", "0.5.24"])
def test_sglang_is_refused_with_the_install_command_without_the_profile(reference_env, monkeypatch, reported):
    monkeypatch.setattr(engines, "installed_version", lambda package: reported)
    for name in SGLANG_CONFIGS:
        issues = backend_issues(name)
        assert len(issues) == 1, [str(i) for i in issues]
        assert "bash scripts/install.sh --sglang" in issues[0].fix
        assert "sglang 0.5.23" in issues[0].reason
        assert ("not installed" in issues[0].reason) == (reported is None)
        if reported is not None:
            assert f"sglang {reported} is installed" in issues[0].reason
    assert check_config("tiny-cpu").ok  # the CPU profile is untouched


def test_both_agents_validate_on_sglang_with_the_profile(reference_env, monkeypatch):
    """The Search-R1 and MMSearch-R1 GPU configs (RLinf's seed values) validate unchanged on sglang."""
    monkeypatch.setattr(engines, "installed_version", lambda package: engines.SGLANG_VERSION)
    for name in SGLANG_CONFIGS:
        report = check_config(name, ["rollout.rollout_backend=sglang"])
        assert report.ok, (name, [str(i) for i in report.issues])


def test_installed_version_reads_the_metadata(monkeypatch):
    import importlib.metadata

    from tests.support.signature_checks import checked_against

    def reporting(found):  # importlib.metadata.version, spelled and checked as the real one
        @checked_against(importlib.metadata.version)
        def version(distribution_name):
            assert distribution_name == "sglang"
            if found is None:
                raise importlib.metadata.PackageNotFoundError(distribution_name)
            return found

        return version

    monkeypatch.setattr(importlib.metadata, "version", reporting(None))
    assert engines.installed_version("sglang") is None
    monkeypatch.setattr(importlib.metadata, "version", reporting("0.5.23"))
    assert engines.installed_version("sglang") == "0.5.23"


def test_the_launcher_refuses_sglang_before_starting_anything(reference_env, monkeypatch):
    from rlinf_ext.runner import launch
    from rlinf_ext.runner.errors import LaunchError

    monkeypatch.setattr(engines, "installed_version", lambda package: None)

    def must_not_run(*_a, **_k):
        raise AssertionError("started preparing the run before refusing the rollout backend")

    monkeypatch.setattr(launch, "prepare_tiny_assets", must_not_run)
    monkeypatch.setattr(launch, "evaluate_agent", must_not_run)
    with pytest.raises(LaunchError, match=r"rollout.rollout_backend: sglang needs the SGLang profile"):
        launch.run_evaluation_only(
            "qwen2.5-3b-tool-1node-eval", ["rollout.rollout_backend=sglang"], show_progress=False
        )
