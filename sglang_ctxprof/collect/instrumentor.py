"""One object installs and removes every hook (the OTel ``BaseInstrumentor`` pattern).

* ``instrument(targets)`` resolves each dotted path, checks it against the adapter's expected
  signature, wraps it and remembers what it patched.  A missing or incompatible *required* target
  is reported with a clear warning and skipped: profiling turns off for what cannot be hooked, and
  SGLang keeps running.  Calling ``instrument`` twice is a no-op with a warning.
* Every wrapper carries ``__wrapped__`` and the marker attribute ``names.WRAPPER_MARK``, and
  ``uninstrument()`` restores exactly the originals we replaced (optionally one group only), so
  "off" leaves SGLang's functions identical to what they were.
* ``wrap_instance(obj, attr, hook)`` does the same for one object's attribute (the speculative
  worker's ``forward_batch_generation``, which differs per algorithm, custom ones included).

A hook has the signature ``hook(original, *args, **kwargs)`` and must call ``original`` exactly
once, outside any guard of its own code, returning its result unchanged.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..model.names import WRAPPER_MARK

if TYPE_CHECKING:
    from .adapter import Target

logger = logging.getLogger(__name__)

Hook = Callable[..., Any]


def resolve(path: str) -> tuple[Any, str, Any]:
    """Return (owner, attribute, current value) for 'pkg.module.Class.attr'."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:-1]:
            obj = getattr(obj, name)
        return obj, parts[-1], getattr(obj, parts[-1])
    raise ImportError(f"cannot import any module prefix of {path!r}")


def is_wrapper(fn: Any) -> bool:
    return bool(getattr(fn, WRAPPER_MARK, False))


def _make_wrapper(original: Callable, hook: Hook) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    setattr(wrapper, WRAPPER_MARK, True)
    return wrapper


def check_signature(fn: Any, expected: Iterable[str]) -> str | None:
    """None if ``fn`` takes the expected leading parameters, else a reason."""
    expected = tuple(expected)
    if not expected:
        return None
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    if params[: len(expected)] != list(expected):
        return f"expected parameters {expected}, found {tuple(params[:len(expected)])}"
    return None


class CtxProfInstrumentor:
    def __init__(self) -> None:
        # (owner, attr, original value as found in owner.__dict__ or None if inherited, wrapper, group)
        self._patched: list[tuple[Any, str, Any, Any, str]] = []
        self.report: dict[str, str] = {}

    def groups(self) -> set[str]:
        return {g for *_, g in self._patched}

    def instrument(self, targets: Iterable["Target"], hooks: dict[str, Hook],
                   signatures: dict[str, tuple[str, ...]] | None = None,
                   groups: Iterable[str] | None = None) -> dict[str, str]:
        wanted = set(groups) if groups is not None else None
        already = self.groups()
        for t in targets:
            if wanted is not None and t.group not in wanted:
                continue
            if t.group in already:
                logger.warning("sglang-ctxprof: hook group %r is already instrumented; ignoring", t.group)
                continue
            self.report[t.path] = self._install(t, hooks[t.hook], (signatures or {}).get(t.path, ()))
        return dict(self.report)

    def _install(self, t: "Target", hook: Hook, expected: tuple[str, ...]) -> str:
        try:
            owner, attr, current = resolve(t.path)
        except (ImportError, AttributeError) as exc:
            if t.required:
                logger.warning("sglang-ctxprof: hook target %s not found (%s); that part of the "
                               "profile is off", t.path, exc)
            return f"missing: {exc}"
        except Exception as exc:  # noqa: BLE001 - its module raised on import: as good as missing
            logger.warning("sglang-ctxprof: hook target %s cannot be imported (%s: %s); that part of the "
                           "profile is off", t.path, type(exc).__name__, exc)
            return f"missing: {type(exc).__name__}: {exc}"
        if is_wrapper(current):
            return "already wrapped"
        reason = check_signature(current, expected)
        if reason:
            logger.warning("sglang-ctxprof: hook target %s has an unexpected signature (%s); not hooked",
                           t.path, reason)
            return f"incompatible: {reason}"
        own = owner.__dict__.get(attr) if isinstance(owner, type) else current
        if isinstance(own, (staticmethod, classmethod)):
            wrapped: Any = type(own)(_make_wrapper(own.__func__, hook))
        else:
            wrapped = _make_wrapper(current, hook)
        setattr(owner, attr, wrapped)
        self._patched.append((owner, attr, own, wrapped, t.group))
        return "ok"

    def wrap_instance(self, obj: Any, attr: str, hook: Hook, group: str = "timing") -> bool:
        current = getattr(obj, attr, None)
        own = obj.__dict__.get(attr) if hasattr(obj, "__dict__") else None
        # Only the object's own attribute counts as already wrapped: its class's method may carry a
        # class-level hook (plain decode's worker: TpModelWorker.forward_batch_generation is hooked as
        # the target forward, and the step span wraps the same method on the instance).
        if own is not None:
            wrapped = is_wrapper(own)
        else:  # a bound method of a class-level hook is not this object's wrapper
            wrapped = is_wrapper(current) and not hasattr(current, "__self__")
        if current is None or wrapped:
            return False
        setattr(obj, attr, _make_wrapper(current, hook))
        self._patched.append((obj, attr, own, getattr(obj, attr), group))
        return True

    def uninstrument(self, groups: Iterable[str] | None = None) -> int:
        wanted = set(groups) if groups is not None else None
        keep, restored = [], 0
        for entry in reversed(self._patched):
            owner, attr, original, wrapper, group = entry
            if wanted is not None and group not in wanted:
                keep.append(entry)
                continue
            if getattr(owner, "__dict__", {}).get(attr) is wrapper or getattr(owner, attr, None) is wrapper:
                if original is None:
                    try:
                        delattr(owner, attr)
                    except AttributeError:
                        pass
                else:
                    setattr(owner, attr, original)
                restored += 1
        self._patched = list(reversed(keep))
        if wanted is None:
            self.report = {}
        return restored
