"""``sglang-ctxprof patch apply|revert|status [NAME ...]``: the SGLang source patches shipped in ``sglang_ctxprof/data/patches/``.

Without names, ``apply`` and ``revert`` act on every patch meant for the target tree's SGLang
version, and ``status`` lists all of them.  ``--target DIR`` picks a tree other than the installed
SGLang (a directory holding ``sglang/``, e.g. an unpacked wheel); ``--dry-run`` checks only.
``status`` also says whether this SGLang has the plugin framework at all.
"""

from __future__ import annotations

from pathlib import Path

from ..collect import adapter
from . import patching


def add_cli_args(ap) -> None:
    ap.add_argument("action", choices=("apply", "revert", "status"))
    ap.add_argument("names", nargs="*", help="patch names (file stems of `patch status`); default: all for this version")
    ap.add_argument("--target", help="directory holding sglang/ (default: the installed SGLang)")
    ap.add_argument("--dry-run", action="store_true", help="check only; change nothing")
    ap.add_argument("--force", action="store_true", help="apply even if the header does not list this version")


def run(ns) -> int:
    from .main import CliError

    try:
        root = Path(ns.target) if ns.target else patching.installed_root()
        if not (root / "sglang").is_dir():
            raise CliError(f"{root} holds no sglang/ directory")
        version = patching.tree_version(root)
        chosen = patching.select(ns.names)
        if ns.action == "status":
            framework = (root / "sglang" / "srt" / "plugins" / "hook_registry.py").is_file()
            print(f"SGLang {version or 'unknown'} at {root}")
            msg = adapter.support_message(version, has_framework=framework)
            print(f"  support: {msg or 'supported'}")
            for p in chosen:
                st = patching.status(root, p)
                scope = "for this version" if p.applies_to(version) else f"for {' '.join(p.versions)} only"
                print(f"  {p.name}: {st} ({scope})")
            return 0
        if not ns.names:
            if version is None:  # nothing says which patches this tree needs
                raise CliError(f"cannot read the SGLang version from {root / 'sglang' / '_version.py'}: "
                               "name the patches to apply or revert (with --force to apply)")
            chosen = [p for p in chosen if p.applies_to(version)]
            if not chosen:
                print(f"no patch is needed for SGLang {version}")
                return 0
        for p in chosen:
            if ns.action == "apply":
                what = patching.apply(root, p, dry_run=ns.dry_run, force=ns.force)
            else:
                what = patching.revert(root, p, dry_run=ns.dry_run)
            print(f"{p.name}: {what}")
        return 0
    except patching.PatchError as exc:
        raise CliError(str(exc)) from None
