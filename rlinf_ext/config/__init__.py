"""Experiment configs: typed schema, Hydra-style composition, strict validation (see `schema.py`)."""

from rlinf_ext.config.loader import (
    CheckedConfig,
    ConfigError,
    check_config,
    load_config,
    to_dictconfig,
    to_yaml,
    validate,
)
from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue

__all__ = [
    "CheckedConfig",
    "ConfigError",
    "ConfigIssue",
    "ExperimentConfig",
    "check_config",
    "load_config",
    "to_dictconfig",
    "to_yaml",
    "validate",
]
