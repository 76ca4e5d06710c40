"""Compose an experiment YAML: `defaults:` list, schema defaults underneath, `key=value` overrides on top.

The result is an *unresolved* OmegaConf DictConfig (interpolations kept) so that validation can report a
missing environment variable at the key that names it. See the module docstring of `schema.py`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlinf_ext.config.schema import ExperimentConfig
from rlinf_ext.protocol.agents import AGENTS, AgentSpec, agent_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
# experiment names are looked up in each registered agent's examples/<agent>/config/, in registry order
EXPERIMENT_DIRS = tuple(REPO_ROOT / "examples" / name / "config" for name in AGENTS)


class ComposeError(ValueError):
    """A YAML could not be read or composed (missing file, bad `defaults` entry, bad override)."""

    def __init__(self, key: str, reason: str, fix: str):
        super().__init__(f"{key}: {reason} Fix: {fix}")
        self.key, self.reason, self.fix = key, reason, fix
        self.all: list[ComposeError] = [self]

    @classmethod
    def many(cls, errors: list["ComposeError"]) -> "ComposeError":
        """One exception carrying several problems (`.all`), so every bad override is reported at once."""
        first = errors[0]
        combined = cls(first.key, first.reason, first.fix)
        combined.all = list(errors)
        return combined


def register_resolvers() -> None:
    """Resolvers used by our YAMLs, plus RLinf's (`subtract`, `not`, ...) so RLinf-style YAMLs resolve too."""
    if not OmegaConf.has_resolver("rlinf_ext.repo_root"):
        OmegaConf.register_new_resolver("rlinf_ext.repo_root", lambda: str(REPO_ROOT))
    for name, fn in {
        "multiply": lambda x, y: x * y,
        "int_div": lambda x, y: x // y,
        "subtract": lambda x, y: x - y,
        "not": lambda x: not bool(x),
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def find_experiment(name_or_path: str | Path) -> Path:
    """A path to a YAML, or a bare name (with or without `.yaml`) looked up in `EXPERIMENT_DIRS`, in order."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path.resolve()
    stem = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    for folder in EXPERIMENT_DIRS:
        candidate = folder / stem
        if candidate.exists() and len(path.parts) == 1:
            return candidate
    known = sorted(p.stem for folder in EXPERIMENT_DIRS for p in folder.glob("*.yaml"))
    raise ComposeError(
        "CONFIG",
        f"no experiment YAML '{name_or_path}' (not a file, not a name under {' or '.join(map(str, EXPERIMENT_DIRS))}).",
        f"give a path to a .yaml file or one of: {', '.join(known)}.",
    )


def schema_defaults() -> DictConfig:
    """The schema's defaults as a plain DictConfig (interpolations kept, `???` for required values)."""
    return OmegaConf.create(dataclasses.asdict(ExperimentConfig()))


def replace_on_merge_keys(cls: type = ExperimentConfig, prefix: str = "") -> list[str]:
    """Dotted keys of mappings that a later layer replaces as a whole (field metadata merge="replace")."""
    keys: list[str] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if f.metadata.get("merge") == "replace":
            keys.append(key)
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            keys += replace_on_merge_keys(sub, key + ".")
    return keys


def _merge(acc: DictConfig, layer: DictConfig) -> DictConfig:
    for key in replace_on_merge_keys():
        if OmegaConf.select(layer, key, default=None) is not None:
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(acc, parent_key) if parent_key else acc
            if isinstance(parent, DictConfig) and leaf in parent:
                parent[leaf] = {}
    return OmegaConf.merge(acc, layer)


def _read_yaml(path: Path, key: str) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except FileNotFoundError:
        raise ComposeError(key, f"file {path} does not exist.", "fix the name or create the file.") from None
    except Exception as exc:  # yaml syntax errors
        raise ComposeError(key, f"{path} is not valid YAML: {exc}", "fix the YAML syntax.") from None
    if not isinstance(cfg, DictConfig):
        raise ComposeError(key, f"{path} must contain a mapping at top level.", "make the file a YAML mapping.")
    return cfg


def _default_entry_path(entry: Any, current: Path) -> Path | None:
    """Resolve one `defaults` entry to a file; None for `_self_`."""
    if entry == "_self_":
        return None
    if isinstance(entry, (dict, DictConfig)) and len(entry) == 1:
        ((group, name),) = dict(entry).items()
        return CONFIGS_DIR / str(group) / f"{name}.yaml"
    if isinstance(entry, str):
        if entry.endswith((".yaml", ".yml")) or entry.startswith("."):
            name = entry if entry.endswith((".yaml", ".yml")) else f"{entry}.yaml"
            return (current.parent / name).resolve()
        return CONFIGS_DIR / f"{entry.lstrip('/')}.yaml"
    raise ComposeError(
        f"defaults (in {current})",
        f"entry {entry!r} is neither 'group/name', {{group: name}}, 'file.yaml' nor _self_.",
        "write e.g. '- model/qwen2.5-3b' or '- cluster: cpu'.",
    )


def _note_origins(origins: dict[str, str] | None, layer: DictConfig, source: str) -> None:
    """Record ``source`` as where each dotted key of ``layer`` (sections and leaves) was last set."""
    if origins is None:
        return

    def walk(node: Any, prefix: str) -> None:
        for name, value in node.items():
            origins[f"{prefix}{name}"] = source
            if isinstance(value, dict):
                walk(value, f"{prefix}{name}.")

    walk(OmegaConf.to_container(layer, resolve=False), "")


def layer_name(path: Path) -> str:
    """A layer file as the errors name it: relative to the repository when inside it."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def compose_file(path: Path, _stack: tuple[Path, ...] = (), origins: dict[str, str] | None = None) -> DictConfig:
    """Read one YAML and everything its `defaults:` list pulls in, merged in order. With ``origins``, each dotted
    key is mapped there to the layer file that set it last (what an error about the key names)."""
    path = path.resolve()
    if path in _stack:
        chain = " -> ".join(p.name for p in (*_stack, path))
        raise ComposeError("defaults", f"circular defaults: {chain}.", "remove one of the entries of the cycle.")
    cfg = _read_yaml(path, f"defaults (from {_stack[-1].name})" if _stack else "CONFIG")
    defaults = cfg.pop("defaults", None) if "defaults" in cfg else None
    entries = list(defaults) if isinstance(defaults, ListConfig) else ([] if defaults is None else None)
    if entries is None:
        raise ComposeError(f"defaults (in {path})", "must be a list.", "write `defaults: [model/x, cluster/y]`.")
    if "_self_" not in entries:
        entries.append("_self_")
    acc = OmegaConf.create({})
    for entry in entries:
        target = _default_entry_path(entry, path)
        if target is None:
            acc = _merge(acc, cfg)
            _note_origins(origins, cfg, layer_name(path))
            continue
        if not target.exists():
            group_dir = target.parent
            options = sorted(p.stem for p in group_dir.glob("*.yaml")) if group_dir.is_dir() else []
            raise ComposeError(
                f"defaults (in {path.name})",
                f"entry {OmegaConf.to_container(entry) if isinstance(entry, DictConfig) else entry!r} -> "
                f"{target} does not exist.",
                f"use one of: {', '.join(options)}." if options else f"create {target}.",
            )
        acc = _merge(acc, compose_file(target, (*_stack, path), origins))
    return acc


def parse_overrides(overrides: Iterable[str]) -> DictConfig:
    """`key=value` strings -> a DictConfig (OmegaConf dotlist: values parsed as YAML). Raises ComposeError
    naming every malformed override."""
    items = list(overrides)
    errors: list[ComposeError] = []
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip() or key != key.strip():
            errors.append(
                ComposeError(
                    item, "an override must look like key=value.", "write e.g. data.rollout_batch_size=16 (no spaces)."
                )
            )
            continue
        try:
            OmegaConf.from_dotlist([item])  # one at a time, so the error names the override
        except (OmegaConfBaseException, yaml.YAMLError) as exc:
            first = str(exc).splitlines()[0]
            errors.append(
                ComposeError(key, f"the value of override '{item}' is not valid YAML ({first}).", "quote or fix it.")
            )
    if errors:
        raise errors[0] if len(errors) == 1 else ComposeError.many(errors)
    return OmegaConf.from_dotlist(items)


def compose(name_or_path: str | Path, overrides: Iterable[str] = ()) -> DictConfig:
    """Schema defaults <- experiment YAML (with its defaults) <- overrides, with the agent's own section's defaults
    under what they set (``agentloop.<agent>``). Interpolations unresolved."""
    return compose_traced(name_or_path, overrides)[0]


def compose_traced(name_or_path: str | Path, overrides: Iterable[str] = ()) -> tuple[DictConfig, dict[str, str]]:
    """`compose`, and where each key the YAMLs or the overrides set came from: dotted key -> layer file
    (repository-relative) or "a command-line override"; keys only the schema or the agent's defaults set are absent."""
    register_resolvers()
    origins: dict[str, str] = {}
    cfg = _merge(schema_defaults(), compose_file(find_experiment(name_or_path), origins=origins))
    command_line = parse_overrides(overrides)
    _note_origins(origins, command_line, "a command-line override")
    return with_agent_defaults(_merge(cfg, command_line)), origins


def composed_agent(cfg: DictConfig) -> AgentSpec | None:
    """The spec ``agentloop.agent`` names, or None when it cannot be read or resolved (check_config reports why)."""
    try:
        name = cfg.agentloop.agent
        return agent_spec(name) if isinstance(name, str) else None
    except (OmegaConfBaseException, ValueError):
        return None


def with_agent_defaults(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the defaults of its agent's section (``AgentSpec.config``) under what the YAMLs set there."""
    spec = composed_agent(cfg)
    if spec is None or not spec.has("config"):
        return cfg
    defaults = OmegaConf.create({"agentloop": {spec.name: dataclasses.asdict(spec.load("config")())}})
    return OmegaConf.merge(defaults, cfg)
