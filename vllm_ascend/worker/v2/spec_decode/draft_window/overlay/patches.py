# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Attributes this package replaces on other projects' classes, and how to put them back.

Every replacement is recorded by identity, not by a mark on the function: a wrapper that
another plugin makes around one of ours with ``functools.wraps`` copies our function's
``__dict__`` (marks included), so a mark would make theirs look like ours. With identity,
installing twice changes nothing, wherever other plugins' wrappers sit in the chain, and
restoring never drops another plugin's wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_ABSENT = object()
# (owner, name) -> (what was there before ours, ours)
_PATCHES: dict[tuple[type, str], tuple[Any, Any]] = {}


def replace(owner: type, name: str, make: Callable[[Any], Any]) -> Any:
    """Set ``owner.name`` to ``make(current)``, unless ours is already in its wrapper chain.

    ``current`` is the attribute as defined on ``owner`` itself (a function, a property).
    Returns the attribute now in place.
    """
    key = (owner, name)
    current = owner.__dict__.get(name, _ABSENT)
    recorded = _PATCHES.get(key)
    if recorded is not None and _in_chain(recorded[1], current):
        return current
    ours = make(None if current is _ABSENT else current)
    _PATCHES[key] = (current, ours)
    setattr(owner, name, ours)
    return ours


def is_replaced(owner: type, name: str) -> bool:
    """Whether ours is in the wrapper chain of ``owner.name``."""
    recorded = _PATCHES.get((owner, name))
    return recorded is not None and _in_chain(recorded[1], owner.__dict__.get(name, _ABSENT))


def restore_all() -> list[str]:
    """Put back what each of ours replaced, where ours is still on top.

    Where another plugin has since wrapped ours, the chain stays as it is (taking ours out
    would drop theirs) and its name is returned; ``install.py`` then keeps ours inert.
    """
    kept = []
    for (owner, name), (original, ours) in list(_PATCHES.items()):
        current = owner.__dict__.get(name, _ABSENT)
        if current is ours:
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        elif _in_chain(ours, current):
            kept.append(f"{owner.__qualname__}.{name}")
            continue
        del _PATCHES[(owner, name)]
    return kept


def _in_chain(ours: Any, attr: Any) -> bool:
    """Whether ``attr`` is ``ours`` or wraps it through ``__wrapped__`` links."""
    target = _function(ours)
    fn = _function(attr)
    seen = set()
    while fn is not None and id(fn) not in seen:
        if fn is target:
            return True
        seen.add(id(fn))
        fn = getattr(fn, "__wrapped__", None)
    return False


def _function(attr: Any) -> Any:
    if isinstance(attr, property):
        return attr.fget
    return getattr(attr, "__func__", attr)
