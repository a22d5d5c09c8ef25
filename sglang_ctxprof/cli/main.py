"""``sglang-ctxprof`` entry point: argparse wiring from a table of subcommands.

Each subcommand module exposes ``add_cli_args(parser)`` and ``run(namespace) -> int``.  Expected
failures (bad arguments, unreachable server, ...) print one ``error:`` line with a usage hint and
exit non-zero; they never print a traceback.  So does a missing package: the line names the extra
(or the dependency) that brings it, from :data:`PROVIDED_BY`; and so does a file that cannot be
read or written (``OSError``: a full disk, a missing folder), naming the path, exit 2.  Files the
CLI writes go through :func:`write_atomic`: a failed write leaves what was there before.

Every line the CLI prints passes :class:`Escaping` while :func:`main` runs: the server's answers
(rids, errors, labels) are other people's strings, and a control character in one (an escape
sequence, a carriage return, a bidi control) reaches the terminal as a Python escape, never raw.
Newlines and tabs pass, and colour sequences only for the commands that print rich tables
(:data:`COLOURED`): elsewhere a server's label or name cannot hide what follows it either.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, TextIO

from ..model.names import ENV_CLI_DEBUG

# name -> (module, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "tiny-model": ("sglang_ctxprof.cli.tiny_model", "write a tiny random-weight model (+ draft), no download"),
    "demo": ("sglang_ctxprof.cli.demo", "start SGLang on CPU with a tiny DeepSeek-V3 + draft and print the profile"),
    "show": ("sglang_ctxprof.cli.show", "print a server's /ctx_profile as a table; several --url merge a fleet"),
    "trace": ("sglang_ctxprof.cli.trace", "one request step by step: phases and context length per step"),
    "capture": ("sglang_ctxprof.cli.capture", "take one deep capture (SGLang's profiler, phase-labelled) and fetch it"),
    "ui": ("sglang_ctxprof.cli.ui", "open the server's live page /ctx_profile/ui (or print its address)"),
    "sweep": ("sglang_ctxprof.cli.sweep", "measure decode tok/s and the phase breakdown across context lengths"),
    "report": ("sglang_ctxprof.cli.report", "table and PNG plots from a saved sweep directory (offline)"),
    "compare": ("sglang_ctxprof.cli.compare", "compare two saved sweeps: regression or inherent context scaling?"),
    "diagnose": ("sglang_ctxprof.cli.diagnose", "regression or inherent? the verdict from a server, a saved profile or sweep"),
    "patch": ("sglang_ctxprof.cli.patch", "apply/revert/show the SGLang source patches shipped with ctxprof on an SGLang tree"),
}

COLOURED = frozenset({"sweep", "report", "compare", "demo"})  # rich tables on a terminal: colour sequences pass


# top-level module -> what to install to get it.  Optional parts are extras; rich, structlog and
# OpenTelemetry are dependencies, so their absence means an install made with --no-deps.
PROVIDED_BY: dict[str, str] = {
    "matplotlib": "pip install 'sglang-ctxprof[plots]' (or pass --no-plots)",
    "selenium": "pip install 'sglang-ctxprof[ui-test]'",
    "grpc": "pip install 'sglang-ctxprof[grpc]'",
    "sglang": "pip install 'sglang-ctxprof[instruments]' (SGLang 0.5.13-0.5.23)",
    "torch": "pip install 'sglang-ctxprof[instruments]' (SGLang brings torch)",
    "transformers": "pip install 'sglang-ctxprof[instruments]' (SGLang brings transformers)",
    "rich": "it is a dependency of sglang-ctxprof: pip install sglang-ctxprof (without --no-deps)",
    "structlog": "it is a dependency of sglang-ctxprof: pip install sglang-ctxprof (without --no-deps)",
    "opentelemetry": "it is a dependency of sglang-ctxprof: pip install sglang-ctxprof (without --no-deps)",
}


def missing_package_line(exc: ModuleNotFoundError) -> str:
    """One line for a missing module: what is missing and what brings it.  An import that fails
    inside an installed package (no ``.name``: transformers' lazy classes raise that way) is said to
    fail, with its cause, instead of being called a missing package."""
    name = getattr(exc, "name", None)
    if not name:
        cause = exc.__cause__ or exc.__context__
        why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return f"an import failed: {exc}{why}; the installed packages do not fit together"
    top = name.split(".")[0]
    hint = PROVIDED_BY.get(top, "install it, or reinstall sglang-ctxprof")
    return f"the Python package {top!r} is not installed ({name}): {hint}"


# What reading a reply or a file of an unexpected shape raises (a field missing, of another type, a
# number out of range, nested past the parser): said in one line, as bad input is.
REPLY_SHAPE = (LookupError, TypeError, AttributeError, ValueError, ArithmeticError, RecursionError)


def unexpected(exc: BaseException) -> str:
    return f"a reply of an unexpected shape ({type(exc).__name__}: {printable(str(exc))[:120]})"


class CliError(Exception):
    """An expected failure: printed as one line, exit code 2 (or .code)."""

    def __init__(self, msg: str, code: int = 2) -> None:
        super().__init__(msg)
        self.code = code


def read_json_object(path: Any, key: str, what: str, role: str = "") -> dict:
    """The JSON object saved at ``path``, which must hold ``key``; a :class:`CliError` naming the file
    (``role``: how the command calls it, e.g. "baseline") for anything else."""
    name = f"{role} {path}" if role else str(path)
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise CliError(f"cannot read {name}: {exc}") from None
    if not isinstance(obj, dict) or key not in obj:
        raise CliError(f"{name} is not {what} (no {key!r})")
    return obj


def write_atomic(path: Any, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename: a reader (or a
    ``--resume``) never sees half a file, and a failed write leaves the old file as it was.  An
    ``OSError`` names ``path``."""
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, p)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise OSError(exc.errno, exc.strerror or str(exc), str(p)) from None


def os_error_line(exc: OSError) -> str:
    """One line for a failed file operation: the path and the system's reason."""
    why = exc.strerror or str(exc)
    return f"{exc.filename}: {why}" if exc.filename else why


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="sglang-ctxprof", description="Context-length profiler for SGLang speculative decoding.")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        module = importlib.import_module(mod)
        adder = getattr(module, "add_cli_args", None)
        if adder is None:
            args_cls = next(v for k, v in vars(module).items() if k.endswith("Args") and isinstance(v, type))
            adder = args_cls.add_cli_args
        adder(p)
        p.set_defaults(_module=mod)
    return ap


def printable(s: Any, keep: str = "") -> str:
    """``s`` as a terminal may see it: every character that is not printable (escape sequences,
    newlines, bidi controls), except those in ``keep``, written as a Python escape."""
    s = str(s)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in s)


_SGR = re.compile(r"(\x1b\[[0-9;]*m)")  # a colour or style sequence (rich's tables on a terminal)


class Escaping:
    """A text stream that writes :func:`printable` text to ``inner``: newlines and tabs pass, and,
    with ``colours``, colour or style sequences (SGR: rich's tables); every other control character
    (a title, a cursor move, a screen clear, a carriage return) is written as a Python escape."""

    def __init__(self, inner: TextIO, colours: bool = True) -> None:
        self.inner = inner
        self.colours = colours

    def write(self, s: str) -> int:
        n = len(s)
        if not s.isprintable():
            if self.colours:
                s = "".join(part if i % 2 else printable(part, keep="\n\t") for i, part in enumerate(_SGR.split(s)))
            else:
                s = printable(s, keep="\n\t")
        self.inner.write(s)
        return n

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno ...: the inner stream's
        return getattr(self.inner, name)


def unescaped(stream: TextIO) -> TextIO:
    """The terminal behind an :class:`Escaping` stream, for a display that moves the cursor itself
    (a progress bar redraws in place) and shows only text the command formats, none a server sent."""
    return stream.inner if isinstance(stream, Escaping) else stream


def main(argv: list[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Escaping(out), Escaping(err)
    try:
        return _run(argv)
    finally:
        sys.stdout, sys.stderr = out, err


def _run(argv: list[str] | None) -> int:
    try:
        ap = build_parser()
    except ModuleNotFoundError as exc:
        print(f"sglang-ctxprof: error: {missing_package_line(exc)}", file=sys.stderr)
        return 2
    ns = ap.parse_args(argv)
    if not getattr(ns, "command", None):
        ap.print_help()
        return 2
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, Escaping):
            stream.colours = ns.command in COLOURED
    try:
        module = importlib.import_module(ns._module)
        return int(module.run(ns) or 0)
    except ModuleNotFoundError as exc:
        print(f"sglang-ctxprof {ns.command}: error: {missing_package_line(exc)}", file=sys.stderr)
        return 2
    except (CliError, ValueError) as exc:
        why = printable(exc, keep="\n")  # a server's words too: every control sequence but a newline escaped
        print(f"sglang-ctxprof {ns.command}: error: {why}", file=sys.stderr)
        print(f"  see: sglang-ctxprof {ns.command} --help", file=sys.stderr)
        return getattr(exc, "code", 2)
    except (RecursionError, ArithmeticError) as exc:  # a reply or file nested too deep, a number out of range
        print(f"sglang-ctxprof {ns.command}: error: {unexpected(exc)}", file=sys.stderr)
        return 2
    except (LookupError, TypeError, AttributeError) as exc:  # a field of a reply or file not as read
        if os.environ.get(ENV_CLI_DEBUG):
            raise
        print(f"sglang-ctxprof {ns.command}: error: {unexpected(exc)}; {ENV_CLI_DEBUG}=1 shows where",
              file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sglang-ctxprof {ns.command}: error: {printable(os_error_line(exc))}", file=sys.stderr)
        print(f"  see: sglang-ctxprof {ns.command} --help", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # ``python -m sglang_ctxprof.cli.main``: run the imported module, so the CliError raised by the
    # subcommands is the class caught above (not a second copy living in __main__).
    from sglang_ctxprof.cli.main import main as _main

    sys.exit(_main())
