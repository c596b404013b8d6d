# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM-Ascend project
"""Installing the draft window's hooks into vLLM: all of them or none, never an exception.

vLLM calls every general plugin in every process, with no guard, so an exception here
would stop every ``vllm serve`` on the host, with or without ``draft_window_size``. On a
vLLM that is not a supported release, or that lacks a hooked module, class, method or
parameter, nothing is hooked and the reasons are kept in :func:`status`: vLLM then runs
exactly as without this package, and a config that asks for the window is refused at
start-up with those reasons (``plugin.py``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import patches, supported, versions
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.plugin_release import PluginRelease
from vllm_ascend.worker.v2.spec_decode.draft_window.overlay.supported import Hook


@dataclass(frozen=True)
class Status:
    """Whether the hooks are in place; if not, why."""

    installed: bool
    release: str | None = None
    problems: tuple[str, ...] = ()


_status = Status(installed=False, problems=("the draft window plugin has not been registered",))
# The installation each release's hooks serve (hooks.Installed), made once: a wrapper another
# plugin keeps in its chain after uninstalling serves it again once it is active again.
_installations: dict[str, Any] = {}


def status() -> Status:
    return _status


def installation() -> Any:
    """The installation the hooks in place serve (``hooks.Installed``: its release), or None."""
    return next((i for i in _installations.values() if i.active), None)


def install() -> Status:
    """Wrap every hooked method of the installed vLLM's release, or none of them."""
    global _status
    try:
        _status = _install()
    except Exception as error:  # a defect of ours must not stop vLLM either
        _status = Status(installed=False, problems=(f"{type(error).__name__}: {error}",))
    return _status


def _install() -> Status:
    version = versions.installed_versions()["vllm"]
    release = supported.release_for(version)
    if release is None:
        problems = [f"vLLM {version} is not a supported release"]
    elif (problem := versions.requirement_problem(release)) is not None:
        problems = [problem]
    else:
        found, problems = resolve(release)
    if not problems:
        try:
            from vllm_ascend.worker.v2.spec_decode.draft_window.overlay import hooks

            factories = [(r, hooks.wrapper_factory(r.hook)) for r in found if r.hook.wrapped]
        except Exception as error:  # what the hooks import from vLLM moved
            problems = [f"the draft window's hooks cannot import what they use ({error})"]
    if problems:
        return Status(installed=False, problems=tuple(problems))
    installed = _installations.setdefault(release.name, hooks.Installed(release, active=False))
    for resolved, _ in factories:
        names = installed.names.setdefault(resolved.hook.method, [])
        if resolved.hook.name not in names:
            names.append(resolved.hook.name)
    try:
        for resolved, factory in factories:
            patches.replace(
                resolved.owner,
                resolved.hook.method,
                functools.partial(factory, installed=installed),
            )
    except Exception:
        patches.restore_all()  # none, rather than some
        raise
    installed.active = True
    return Status(installed=True, release=release.name)


def uninstall() -> None:
    """Put back everything ``register()`` replaced (for tests that compare with and without
    the window). A wrapper of ours that another plugin has wrapped since stays in its chain,
    inert: it makes no window."""
    global _status
    for installed in _installations.values():
        installed.active = False
    patches.restore_all()
    _status = Status(installed=False, problems=("the draft window was uninstalled",))


@dataclass(frozen=True)
class Resolved:
    """A hook found on the installed vLLM: the class that defines it, and the method."""

    hook: Hook
    owner: type
    method: object


def resolve(release: PluginRelease) -> tuple[list[Resolved], list[str]]:
    """Find every hook of ``release`` on the installed vLLM: (found, problems). Imports and
    inspects only; it never raises because of what the installed vLLM looks like.

    A wrapped method must be defined on its class itself (wrapping an inherited one would
    hook the base class's subclasses twice); a called one may be inherited. Problems name
    the missing module, class, method or parameters.
    """
    found, problems = [], []
    for hook in supported.hooks_for(release):
        try:
            module = importlib.import_module(hook.module)
        except Exception as error:  # any import-time failure of a module we hook
            problems.append(f"module {hook.module} cannot be imported ({error})")
            continue
        owner = getattr(module, hook.cls, None)
        if not isinstance(owner, type):
            problems.append(f"{hook.module} has no class {hook.cls}")
            continue
        if hook.wrapped:
            method = owner.__dict__.get(hook.method)
        else:
            method = getattr(owner, hook.method, None)
        if method is None:
            problems.append(f"{hook.name} is missing")
            continue
        try:
            parameters = inspect.signature(inspect.unwrap(method)).parameters
        except (TypeError, ValueError):
            problems.append(f"{hook.name} has no readable signature")
            continue
        missing = [p for p in hook.parameters if p not in parameters]
        if missing:
            problems.append(f"{hook.name} no longer takes {', '.join(missing)}")
            continue
        found.append(Resolved(hook, owner, method))
    try:
        release.block_table_width_function()
    except Exception as error:  # moved again: the cropped tables would round differently
        module, function = release.block_table_width
        problems.append(f"{module}.{function} cannot be found ({error})")
    return found, problems
