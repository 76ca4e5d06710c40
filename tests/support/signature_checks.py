"""A fake's calls checked against the real library's signature: a call the library would refuse (an unknown or
missing argument, a keyword-only one passed by position) raises the ``TypeError`` the library would raise.

    class RecordingEngine:
        @checked_against(AsyncLLM.sleep)        # the installed library's own method
        async def sleep(self, level=1, mode="abort"): ...

``real`` is a callable (its ``inspect.signature``) or an ``inspect.Signature`` (for a library that cannot be
imported here: ``tests/support/sglang_source.py`` reads SGLang's from its installed source). A method's signature keeps
``self``: the fake's own ``self`` is bound there.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


def signature_of(real: Callable | inspect.Signature) -> inspect.Signature:
    return real if isinstance(real, inspect.Signature) else inspect.signature(real)


def bind_like(
    real: Callable | inspect.Signature, *args: Any, label: str | None = None, **kwargs: Any
) -> inspect.BoundArguments:
    """``args``/``kwargs`` bound to ``real``'s signature (defaults applied); the library's ``TypeError`` if it would
    refuse them."""
    name = label or getattr(real, "__qualname__", None) or "the real callable"
    try:
        bound = signature_of(real).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{name}{signature_of(real)} refuses this call: {exc}") from None
    bound.apply_defaults()
    return bound


# Ray adds this keyword to the methods of a class it has made an actor class (ray/util/tracing, in place, for the
# rest of the process); callers never pass it, so a fake need not spell it
RAY_TRACE_KEYWORD = "_ray_trace_ctx"


def _shape(signature: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name != RAY_TRACE_KEYWORD]


def checked_against(real: Callable | inspect.Signature, *, label: str | None = None):
    """Decorator: every call of the fake (sync or async) is first bound to ``real``'s signature. A fake that spells
    its parameters out (no ``*args``/``**kwargs``) must spell them as the real one does (names, kinds, defaults:
    a default the library does not have would answer calls differently), checked when the class is defined."""

    def wrap(fake: Callable) -> Callable:
        name = label or getattr(real, "__qualname__", None) or fake.__qualname__
        own = inspect.signature(fake)
        # a method of the fake standing for a plain function: its own self is not the function's
        skip = int(
            next(iter(own.parameters), None) == "self"
            and next(iter(signature_of(real).parameters), None) not in ("self", "cls")
        )
        kinds = {p.kind for p in own.parameters.values()}
        if not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
            if _shape(own)[skip:] != _shape(signature_of(real)):
                raise TypeError(f"the fake {fake.__qualname__}{own} is not spelled as {name}{signature_of(real)}")
        if inspect.iscoroutinefunction(fake):

            @functools.wraps(fake)
            async def checked_async(*args, **kwargs):
                bind_like(real, *args[skip:], label=name, **kwargs)
                return await fake(*args, **kwargs)

            checked_async.checked_against = real
            return checked_async

        @functools.wraps(fake)
        def checked(*args, **kwargs):
            bind_like(real, *args[skip:], label=name, **kwargs)
            return fake(*args, **kwargs)

        checked.checked_against = real
        return checked

    return wrap


def attributes_of(real_cls: type, **attributes: Any) -> SimpleNamespace:
    """A stand-in holding ``attributes``, each one the real class has (an attribute, property or method of it):
    for a fake that is only read."""
    missing = [
        name
        for name in attributes
        if inspect.getattr_static(real_cls, name, None) is None and name not in getattr(real_cls, "__annotations__", {})
    ]
    if missing:
        raise AttributeError(f"{real_cls.__qualname__} has no {missing}: the stand-in would offer what it lacks")
    return SimpleNamespace(**attributes)
