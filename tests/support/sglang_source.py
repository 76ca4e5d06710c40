"""sglang 0.5.23's own types and signatures for the CPU test lane, read from the real release.

The CPU venv runs vLLM's torch 2.13.0 (CPU build); SGLang is the GPU profile's engine (torch 2.14.1). For the tests,
``bash scripts/install.sh --dev`` installs the sglang wheel without its dependencies into ``<venv>/sglang-source``
(``SGLANG_SOURCE_DIR``), beside IPython (the one missing dependency of ``sglang.srt.server_args``). The folder is
never on the test process's ``sys.path``: importing ``sglang`` patches transformers in place and sets cache
variables (``sglang/__init__.py``), and ``importlib.metadata`` would then report sglang as installed.

- ``ServerArgs`` and the disallowed-tokens logit processor are sglang's real classes, run in a child process
  (``probe``, ``tests/support/sglang_probe.py``).
- ``io_struct``'s requests, ``TokenizerManager``'s methods, ``Engine.async_generate``, SGLang's ``SamplingParams``
  and ``init_custom_process_group`` cannot be imported on this lane: ``io_struct`` -> ``schedule_batch`` ->
  ``dllm.config`` -> ``sglang.srt.configs`` (which imports every model config) -> ``nano_nemotron_vl`` ->
  ``multimodal/internvl_utils.py`` imports ``torchvision``, and PyPI's Linux torchvision wheels are CUDA builds: beside
  the CPU torch their ``_C.so`` does not load, and torchvision 0.28.0 then fails at import
  (``_meta_registrations.py:163``, ``register_fake("torchvision::nms")``: "operator torchvision::nms does not
  exist"). Their signatures are read from the installed source with ``ast`` (``SGLangSource.signature``), and the
  request types are built from their declared fields (``SGLangSource.io_struct``): checked stand-ins whose
  constructor refuses what sglang's refuses (an unknown field, a missing required one).

If the folder is missing, the tests that need it fail with the fix (``bash scripts/install.sh --dev``).
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from rlinf_ext.protocol.engines import SGLANG_VERSION
from tests.support.signature_checks import bind_like

SGLANG_SOURCE_ENV = "RLINF_EXT_SGLANG_SOURCE"  # overrides the folder (a scratch install)
SGLANG_SOURCE_DIR = "sglang-source"  # scripts/install.sh --dev: <venv>/sglang-source
INSTALL_FIX = "bash scripts/install.sh --dev"
PROBE = Path(__file__).resolve().with_name("sglang_probe.py")
PROBE_TIMEOUT_S = 240


class SGLangSourceMissing(RuntimeError):
    """sglang's release is not where the tests read it; names the fix."""


def source_dir() -> Path:
    """The folder holding sglang's installed release (``$RLINF_EXT_SGLANG_SOURCE``, else ``<venv>/sglang-source``);
    a clear error naming the install command when it is missing or holds another release."""
    env = os.environ.get(SGLANG_SOURCE_ENV)
    folder = Path(env) if env else Path(sys.prefix) / SGLANG_SOURCE_DIR
    if not (folder / f"sglang-{SGLANG_VERSION}.dist-info").is_dir() or not (folder / "sglang").is_dir():
        found = sorted(p.name for p in folder.glob("sglang-*.dist-info")) if folder.is_dir() else []
        raise SGLangSourceMissing(
            f"sglang {SGLANG_VERSION}'s release is not in {folder} ({'found ' + ', '.join(found) if found else 'missing'}"
            f"): the SGLang tests check every call against it. Fix: {INSTALL_FIX} (installs it there without its "
            f"dependencies; or point {SGLANG_SOURCE_ENV} at such a folder)."
        )
    return folder


class SourceDefault:
    """A default that is not a literal in sglang's source (``field(default_factory=list)``, a constant name)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _default(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return SourceDefault(ast.unparse(node))


def _annotation(node: ast.expr | None) -> Any:
    return inspect.Parameter.empty if node is None else ast.unparse(node)


def function_signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> inspect.Signature:
    """``inspect.Signature`` of a ``def`` as written (annotations as source text)."""
    a, P = node.args, inspect.Parameter
    positional = [*a.posonlyargs, *a.args]
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [_default(d) for d in a.defaults]
    params = [
        P(
            arg.arg,
            P.POSITIONAL_ONLY if k < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
            default=default,
            annotation=_annotation(arg.annotation),
        )
        for k, (arg, default) in enumerate(zip(positional, defaults))
    ]
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL, annotation=_annotation(a.vararg.annotation)))
    params += [
        P(
            arg.arg,
            P.KEYWORD_ONLY,
            default=P.empty if d is None else _default(d),
            annotation=_annotation(arg.annotation),
        )
        for arg, d in zip(a.kwonlyargs, a.kw_defaults)
    ]
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD, annotation=_annotation(a.kwarg.annotation)))
    return inspect.Signature(params, return_annotation=_annotation(node.returns))


def _kw_only(node: ast.ClassDef) -> bool:
    """``class X(msgspec.Struct, kw_only=True)`` or ``@dataclass(kw_only=True)``."""
    keywords = list(node.keywords) + [kw for d in node.decorator_list if isinstance(d, ast.Call) for kw in d.keywords]
    return any(kw.arg == "kw_only" and isinstance(kw.value, ast.Constant) and kw.value.value is True for kw in keywords)


_PARSE_LOCK = threading.Lock()  # the engines of a test run in threads, and the first to check a call parses


class SGLangSource:
    """sglang's modules parsed from ``folder``: signatures of its functions and methods, fields of its structs."""

    def __init__(self, folder: Path):
        self.folder = folder

    @classmethod
    def find(cls) -> SGLangSource:
        return cls(source_dir())

    # ---- modules
    @functools.lru_cache(maxsize=None)
    def tree(self, module: str) -> ast.Module:
        base = self.folder.joinpath(*module.split("."))
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        with _PARSE_LOCK:  # one parse at a time: CPython 3.11's ast.parse in two threads at once can raise
            return ast.parse(path.read_text(), filename=str(path))  # "AST constructor recursion depth mismatch"

    def _defined(self, module: str, name: str) -> tuple[str, ast.AST]:
        """Where ``name`` of ``module`` is defined: a top-level ``def``/``class``, or what an import brings in
        (``from x import name``, ``from x import *``) followed to its definition."""
        body = self.tree(module).body
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return module, node
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if any(alias.name == name and alias.asname in (None, name) for alias in node.names):
                    return self._defined(node.module, name)
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.level in (0, 1) and any(a.name == "*" for a in node.names):
                try:
                    return self._defined(node.module if node.level == 0 else f"{module}.{node.module}", name)
                except LookupError:
                    continue
        raise LookupError(f"sglang's {module} defines no {name}")

    def _class(self, module: str, name: str) -> tuple[str, ast.ClassDef]:
        where, node = self._defined(module, name)
        if not isinstance(node, ast.ClassDef):
            raise LookupError(f"sglang's {module}.{name} is not a class")
        return where, node

    def _bases(self, module: str, node: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class's own bases that sglang defines (library bases such as ``msgspec.Struct`` are skipped)."""
        found = []
        for base in node.bases:
            if isinstance(base, ast.Name):
                try:
                    found.append(self._class(module, base.id))
                except LookupError:
                    continue
        return found

    # ---- signatures
    @functools.lru_cache(maxsize=None)
    def signature(self, module: str, qualname: str) -> inspect.Signature:
        """``inspect.Signature`` of sglang's ``module.qualname``: a function, or a method (with ``self``) found on
        the class or the first of its sglang bases that defines it (``TokenizerManager`` gets its control methods
        from ``TokenizerControlMixin``)."""
        if "." not in qualname:
            where, node = self._defined(module, qualname)
            if isinstance(node, ast.ClassDef):
                return self.struct_signature(module, qualname)
            return function_signature(node)
        return function_signature(self._method(module, qualname))

    def is_async(self, module: str, qualname: str) -> bool:
        return isinstance(self._method(module, qualname), ast.AsyncFunctionDef)

    def _method(self, module: str, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        """The definition of ``Class.method``: on the class or the first of its sglang bases that defines it."""
        cls_name, method = qualname.split(".", 1)
        pending = [self._class(module, cls_name)]
        while pending:
            where, cls = pending.pop(0)
            for node in cls.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
                    return node
            pending += self._bases(where, cls)
        raise LookupError(f"sglang's {module}.{cls_name} has no method {method}")

    @functools.lru_cache(maxsize=None)
    def struct_signature(self, module: str, name: str) -> inspect.Signature:
        """The constructor of a msgspec ``Struct`` (or dataclass) as sglang declares it: its annotated fields,
        bases first; ``kw_only`` classes' fields keyword-only (msgspec's rule)."""
        chain, pending = [], [self._class(module, name)]
        while pending:
            where, cls = pending.pop(0)
            chain.insert(0, cls)
            pending += self._bases(where, cls)
        P, fields = inspect.Parameter, {}
        for cls in chain:
            kind = P.KEYWORD_ONLY if _kw_only(cls) else P.POSITIONAL_OR_KEYWORD
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    if ast.unparse(node.annotation).startswith(("ClassVar", "typing.ClassVar")):
                        continue
                    default = P.empty if node.value is None else _default(node.value)
                    fields[node.target.id] = P(
                        node.target.id, kind, default=default, annotation=ast.unparse(node.annotation)
                    )
        params = sorted(fields.values(), key=lambda p: p.kind)  # positional ones first, as msgspec orders them
        return inspect.Signature(params)

    def struct_type(self, module: str, name: str) -> type:
        return _struct_type(self, module, name)

    @property
    def io_struct(self) -> SourceModule:
        """``sglang.srt.managers.io_struct`` as checked request types (what ``SGLangControl`` builds)."""
        return SourceModule(self, "sglang.srt.managers.io_struct")

    # ---- sglang's real classes, in a child process
    def probe(self, request: dict[str, Any]) -> dict[str, Any]:
        """``tests/support/sglang_probe.py``'s answer to ``request`` (it runs in a child: importing sglang patches
        transformers in place)."""
        done = subprocess.run(
            [sys.executable, str(PROBE), str(self.folder), SGLANG_VERSION],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise RuntimeError(f"tests/support/sglang_probe.py failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def server_args_errors(self, kwargs_list: list[dict[str, Any]]) -> list[str | None]:
        """``ServerArgs(**kwargs)`` of sglang's real class for each ``kwargs``: None where it is built, else the
        error."""
        return self.probe({"server_args": kwargs_list})["server_args"]


class SourceStruct:
    """An instance of a checked stand-in of one of sglang's request structs: its fields as attributes."""

    sglang_name = ""

    def __repr__(self) -> str:
        return f"{self.sglang_name}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)


@functools.lru_cache(maxsize=None)
def _struct_type(source: SGLangSource, module: str, name: str) -> type:
    signature = source.struct_signature(module, name)

    def __init__(self, *args, **kwargs):
        bound = bind_like(signature, *args, label=f"sglang's {module}.{name}", **kwargs)
        for key, value in bound.arguments.items():
            setattr(self, key, value)

    return type(
        name, (SourceStruct,), {"__init__": __init__, "sglang_name": name, "__module__": module, "signature": signature}
    )


class SourceModule:
    """``module.Name`` -> the checked stand-in of sglang's struct ``Name``."""

    def __init__(self, source: SGLangSource, module: str):
        self._source, self._module = source, module

    def __getattr__(self, name: str) -> type:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._source.struct_type(self._module, name)


def check_call(source: SGLangSource, module: str, qualname: str, *args: Any, **kwargs: Any) -> inspect.BoundArguments:
    """Bind a call of sglang's ``module.qualname`` (a method's ``self`` first) as sglang's signature would, and check
    that each request struct passed is of the type its parameter is annotated with."""
    label = f"sglang's {module.rsplit('.', 1)[-1]}.{qualname}"
    signature = source.signature(module, qualname)
    bound = bind_like(signature, *args, label=label, **kwargs)
    for key, value in bound.arguments.items():
        if isinstance(value, SourceStruct):
            annotation = signature.parameters[key].annotation
            if value.sglang_name not in str(annotation):
                raise TypeError(f"{label}: {key} must be {annotation}, got {value.sglang_name}")
    return bound
