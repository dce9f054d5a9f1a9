"""Load the application named by --app MODULE:ATTR (or MODULE, when it holds one
brooq.Queue), and the modules its ``include=`` names."""

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
    """The brooq.Queue ``spec`` names, its ``include=`` modules imported (so that every
    handler they register is known); AppLoadError saying what failed, in one line (or one
    line per problem of a handler's registration)."""
    from brooq.queue import Queue

    module_name, sep, attr = spec.partition(":")
    if not module_name or (sep and not attr):
        raise AppLoadError(
            f"--app must be MODULE:ATTR or MODULE (e.g. myapp.jobs:queue), got {spec!r}"
        )
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
        detail = " ".join(str(exc).split())
        raise AppLoadError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {detail}"
        ) from exc
    obj: object = module if sep else _the_queue(module, module_name, Queue)
    for part in attr.split(".") if sep else ():
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppLoadError(f"{module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Queue):
        raise AppLoadError(f"{spec} is a {type(obj).__name__}, not a brooq.Queue")
    obj.load_includes()  # AppLoadError naming the module that failed
    if not obj.handlers:
        raise AppLoadError(
            f"{spec} has no handlers: register one with @queue.handler(topic)"
            + (f" (include= imported {', '.join(obj.include)})" if obj.include else "")
        )
    return obj


def _the_queue(module: object, name: str, queue_class: type[Queue]) -> Queue:
    """The one brooq.Queue among ``module``'s attributes (--app MODULE)."""
    found = {
        attr: value
        for attr, value in vars(module).items()
        if isinstance(value, queue_class) and not attr.startswith("_")
    }
    distinct = {id(q) for q in found.values()}
    if len(distinct) == 1:
        return next(iter(found.values()))
    if not found:
        raise AppLoadError(f"{name!r} holds no brooq.Queue; name one as --app {name}:ATTR")
    names = ", ".join(sorted(found))
    raise AppLoadError(
        f"{name!r} holds several brooq.Queue objects ({names}); name one as --app {name}:ATTR"
    )


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
