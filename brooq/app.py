"""Load the application named by --app MODULE:ATTR."""

from __future__ import annotations

import importlib
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from brooq.errors import AppLoadError, InvalidSettings

if TYPE_CHECKING:
    from brooq.queue import Queue


def load(spec: str) -> Queue:
    from brooq.queue import Queue

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppLoadError(f"--app must be MODULE:ATTR (e.g. myapp.jobs:queue), got {spec!r}")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `python -m`, the current directory imports
    try:
        module = importlib.import_module(module_name)
    except InvalidSettings as exc:
        # A bad schedule or handler option at registration: every problem, one each.
        problems = [f"{module_name}: {p}" for p in exc.problems]
        raise AppLoadError(
            f"cannot import {module_name!r}: " + "; ".join(exc.problems), problems
        ) from exc
    except Exception as exc:
        raise AppLoadError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppLoadError(f"{module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Queue):
        raise AppLoadError(f"{spec} is a {type(obj).__name__}, not a brooq.Queue")
    if not obj.handlers:
        raise AppLoadError(f"{spec} has no handlers: register one with @queue.handler(topic)")
    return obj


def _library_roots() -> list[str]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return sorted(str(Path(r).resolve()) for r in roots)


def forget_user_modules(baseline: set[str]) -> list[str]:
    """Drop from sys.modules the modules imported since ``baseline`` that are the user's
    own code (not the standard library, not installed packages, not brooq), so that the
    next import reads them from disk again. Used by children after SIGHUP."""
    roots = _library_roots()
    dropped = []
    for name in list(sys.modules):
        if name in baseline or name == "brooq" or name.startswith("brooq."):
            continue
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path is None:
            continue
        resolved = str(Path(path).resolve())
        if any(resolved.startswith(root) for root in roots):
            continue
        del sys.modules[name]
        dropped.append(name)
    return dropped
