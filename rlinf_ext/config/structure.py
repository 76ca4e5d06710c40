"""Structural checks of a composed config against the schema: unknown keys, wrong types, missing values.

A key the schema lacks is looked up in RLinf's compatibility table (``config/compat.py``) before it is called
unknown: at its accepted value it is dropped, at any other value it is refused with the table's reason and fix.

`check_structure` walks the unresolved DictConfig next to the dataclasses, resolving one key at a time, so a
bad key or an unset environment variable is reported where it is written and every problem is collected.
It returns the issues and a plain dict of the values that passed, from which the typed config is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from rlinf_ext.config import compat
from rlinf_ext.config.schema import REQUIRED, ImportPath
from rlinf_ext.protocol.agents import AGENTS

_ENV_RE = re.compile(r"oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")
_REF_RE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")
_KEY_NOT_FOUND_RE = re.compile(r"Interpolation key '([^']+)' not found")
_ENV_MISSING_RE = re.compile(r"Environment variable '([^']+)' not found")


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config: the dotted key, what is wrong, and what to do about it. A ``warning`` is a choice
    that runs but is likely a mistake: validate prints it and accepts the config."""

    key: str
    reason: str
    fix: str
    warning: bool = False

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}\n    fix: {self.fix}"


# ------------------------------------------------------------------------------------------ type matching
def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "mapping"
    if tp is Any:
        return "any"
    if tp is ImportPath:
        return "an import path pkg.module:attr"
    return getattr(tp, "__name__", str(tp))


def matches(value: Any, tp: Any) -> bool:
    """Does a resolved YAML value fit the annotation? (ints are accepted where floats are expected)."""
    if tp is Any:
        return True
    if tp is ImportPath:
        return isinstance(value, str) and ":" in value
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return any(matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(matches(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return isinstance(value, tp)


def _type_fix(key: str, tp: Any, value: Any) -> str:
    choices = _literal_choices(tp)
    if choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.5)
        hint = f"did you mean {key}={close[0]}? " if close else ""
        return f"{hint}allowed: {', '.join(str(c) for c in choices)}."
    return f"set {key} to a {type_name(tp)}, e.g. {key}={_example(tp)}."


def _literal_choices(tp: Any) -> list[Any]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return list(typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return [c for a in typing.get_args(tp) for c in _literal_choices(a)]
    return []


def _example(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return repr(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return _example(next(a for a in typing.get_args(tp) if a is not type(None)))
    return {bool: "true", int: "4", float: "0.5", str: "text", ImportPath: "mypkg.agent:SPEC"}.get(
        tp, "[a, b]" if origin is list else "..."
    )


# ------------------------------------------------------------------------------------------ walking
def _env_hint(raw: Any) -> str | None:
    m = _ENV_RE.search(raw) if isinstance(raw, str) else None
    return m.group(1) if m else None


def _resolve_one(node: DictConfig, name: str, key: str) -> tuple[Any, ConfigIssue | None, bool]:
    """Resolve node[name] to a plain value. Returns (value, issue, transitive) where transitive marks a
    failure that only comes from an interpolated key which is reported on its own."""
    child = node._get_node(name)
    if isinstance(child, (DictConfig, ListConfig)):
        raw = str(OmegaConf.to_container(child, resolve=False))
    else:
        raw = child._value() if child is not None else None
    if OmegaConf.is_missing(node, name):
        return (
            None,
            ConfigIssue(key, "required value is missing (???).", f"pass {key}=VALUE on the command line."),
            False,
        )
    try:
        value = node[name]
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        return value, None, False
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        env = _ENV_MISSING_RE.search(msg)
        direct_env = _env_hint(raw)
        if env and direct_env is not None and env.group(1) in _ENV_RE.findall(raw):
            return (
                None,
                ConfigIssue(
                    key,
                    f"required value comes from environment variable {env.group(1)}, which is not set.",
                    f"export {env.group(1)}=... or pass {key}=VALUE.",
                ),
                False,
            )
        if env or isinstance(exc, MissingMandatoryValue) or "missing" in msg.lower():
            return None, None, True
        not_found = _KEY_NOT_FOUND_RE.search(msg)
        if not_found and not_found.group(1) not in str(raw):
            return None, None, True  # an interpolated key failed; that key is reported where it is written
        return (
            None,
            ConfigIssue(
                key, f"cannot resolve {raw!r}: {msg}", "fix the interpolation (${section.key} or ${oc.env:VAR})."
            ),
            False,
        )


def _moved_to(key: str) -> str | None:
    """Where a key of the shared schema went, when an agent's section took it over (``AgentSpec.moved_keys``)."""
    return next((new for spec in AGENTS.values() for old, new in spec.moved_keys if old == key), None)


def _unknown_issue(key: str, name: str, valid: list[str], parent: str) -> ConfigIssue:
    moved = _moved_to(key)
    if moved is not None:
        return ConfigIssue(key, f"unknown key: it moved to {moved}.", f"write it as {moved} (same meaning and value).")
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    full = [f"{parent}{c}" for c in close]
    fix = f"did you mean {' or '.join(full)}?" if close else f"remove it; valid keys here: {', '.join(valid)}."
    return ConfigIssue(key, "unknown key (not in the schema).", fix)


def _compat_issues(node: DictConfig, name: str, key: str) -> list[ConfigIssue]:
    """Issues of ``node[name]``, a key (or a section of keys) of the compatibility table; [] when accepted."""
    entry = compat.BY_KEY.get(key)
    if entry is None:  # a section such as ``actor.tokenizer``: every key below it must be a compatibility key
        child = node._get_node(name)
        if not isinstance(child, DictConfig) or child._is_none() or child._is_interpolation():
            return [ConfigIssue(key, "must be a mapping (a section).", f"write {key} as a YAML mapping of keys.")]
        issues: list[ConfigIssue] = []
        for sub in child.keys():
            sub_key = f"{key}.{sub}"
            if sub_key in compat.BY_KEY or compat.is_compat_section(sub_key):
                issues += _compat_issues(child, str(sub), sub_key)
            else:
                valid = sorted(k[len(key) + 1 :].split(".")[0] for k in compat.BY_KEY if k.startswith(key + "."))
                issues.append(_unknown_issue(sub_key, str(sub), valid, key + "."))
        return issues
    value, issue, transitive = _resolve_one(node, name, key)
    if issue or transitive:
        return [issue] if issue else []
    root = node._get_root()
    try:
        accepted = compat.accepted_value(entry, lambda dotted: OmegaConf.select(root, dotted, throw_on_missing=True))
    except OmegaConfBaseException:
        return []  # a key the accepted value follows is unresolvable; it is reported where it is written
    if compat.same_value(value, accepted):
        return []
    reason, fix = compat.refusal(entry, value)
    return [ConfigIssue(key, reason, fix)]


def _refs(raw: Any) -> list[str]:
    """Config keys a raw value interpolates (`${a.b}` -> a.b; resolver calls such as ${oc.env:X} are not keys)."""
    return _REF_RE.findall(raw) if isinstance(raw, str) else []


def check_structure(
    cfg: DictConfig, cls: type, prefix: str = "", bad: set[str] | None = None
) -> tuple[list[ConfigIssue], dict[str, Any], set[str]]:
    """Returns (issues, plain dict of valid values, keys whose value could not be used)."""
    issues: list[ConfigIssue] = []
    values: dict[str, Any] = {}
    bad = set() if bad is None else bad
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in cfg.keys():
        name = str(name)
        if name in fields:
            continue
        key = f"{prefix}{name}"
        if key in compat.BY_KEY or compat.is_compat_section(key):
            issues += _compat_issues(cfg, name, key)  # accepted: dropped here, never in the typed config
        else:
            issues.append(_unknown_issue(key, name, list(fields), prefix))
    for name, f in fields.items():
        key = f"{prefix}{name}"
        tp = hints[name]
        if name not in cfg.keys():  # (`in` is False for a ??? value; keys() is not)
            bad.add(key)
            continue
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            node = cfg._get_node(name)
            if isinstance(node, DictConfig) and not node._is_none() and not node._is_interpolation():
                sub_issues, sub_values, _ = check_structure(node, sub, key + ".", bad)
                issues += sub_issues
                values[name] = sub_values
                continue
            issues.append(ConfigIssue(key, "must be a mapping (a section).", f"write {key} as a YAML mapping of keys."))
            bad.add(key)
            continue
        value, issue, transitive = _resolve_one(cfg, name, key)
        if issue or transitive:
            if issue:
                issues.append(issue)
            bad.add(key)
            continue
        if isinstance(value, str) and value == REQUIRED:
            issues.append(ConfigIssue(key, "required value is missing (???).", f"pass {key}=VALUE."))
            bad.add(key)
            continue
        if not matches(value, tp):
            bad.add(key)
            if any(ref in bad for ref in _refs(cfg._get_node(name)._value())):
                continue  # the interpolated key is wrong and already reported
            issues.append(
                ConfigIssue(
                    key, f"expected {type_name(tp)}, got {type(value).__name__} {value!r}.", _type_fix(key, tp, value)
                )
            )
            continue
        values[name] = value
    return issues, values, bad


def build(cls: type, values: dict[str, Any]) -> Any:
    """Typed dataclass from checked values; keys that failed keep the schema default."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            kwargs[f.name] = build(sub, values[f.name])
        else:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)
