"""What a table's ``handlers = "module:attr"`` spec may name: a HandlerRegistry, or a function marked
``@HandlerRegistry.factory``; told from marks on the object, so nothing is called to tell."""

import inspect
from collections.abc import Mapping
from typing import Any


def _name(handler: Any) -> str:
    return str(getattr(handler, "__qualname__", None) or repr(handler))


REGISTRY_MARK = "__outbox_handler_registry__"  # set on HandlerRegistry (destinations/handlers.py)
FACTORY_MARK = "__outbox_registry_factory__"  # set by @HandlerRegistry.factory


def spec_target_problem(target: object) -> str | None:
    """Why what a ``handlers = "module:attr"`` spec names cannot be used (None when it can): a HandlerRegistry, or
    a function marked ``@HandlerRegistry.factory``. Nothing is called to tell: ``sys:exit``, ``os:abort``, a plain
    function, a class or a module is refused as it is named, before anything runs it."""
    if any(vars(kind).get(REGISTRY_MARK) is True for kind in type(target).__mro__):
        return None
    own = getattr(target, "__dict__", None)  # the mark set on the object itself, not one a __getattr__ makes up
    if callable(target) and isinstance(own, Mapping) and own.get(FACTORY_MARK) is True:
        return None
    if inspect.ismodule(target):
        kind = "a module"
    elif inspect.isclass(target):
        kind = f"a class ({target.__name__})"
    elif inspect.isbuiltin(target):
        kind = f"a built-in function ({_name(target)})"
    elif callable(target):
        kind = f"a function ({_name(target)}) not marked @HandlerRegistry.factory"
    else:
        kind = f"a {type(target).__name__}"
    return (
        f"it is {kind}, not a HandlerRegistry; name the registry (registry = HandlerRegistry()) or a function "
        "marked @HandlerRegistry.factory that returns one. Nothing was called"
    )
