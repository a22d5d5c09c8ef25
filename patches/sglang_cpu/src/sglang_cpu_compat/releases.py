"""Which SGLang release this process serves, and how that release calls the CPU attention kernels.

SGLang builds its CPU kernels (``sgl_kernel`` ``*_cpu`` ops) from its own tree, so their schemas
follow the sglang release, not the sglang-kernel wheel.  Two of them changed between 0.5.13 and
0.5.23; ``ATTENTION_SCHEMAS`` says how, and ``common_ops`` registers its stand-ins with the lists of
the release ``installed_release()`` finds.  The table is held equal to the intel_amx backend's call
sites in every cached wheel by patches/sglang_cpu/tests/test_release_schemas.py.

Pure: imports neither torch nor sglang (``common_ops`` is imported while sglang imports sgl_kernel).
"""
import os
import re

# Stands in for the installed release (e.g. "0.5.16"): lets a test register an older release's
# schemas in a fresh process.  Unset, the installed sglang's metadata decides.
RELEASE_ENV = "SGLANG_CPU_COMPAT_RELEASE"
NEWEST = (0, 5, 23)

# The newest argument lists (0.5.20-0.5.23), as torch schema declarations.
NEWEST_ARGS = {
    "decode_attention_cpu": (
        "Tensor query", "Tensor k_cache", "Tensor v_cache", "float k_scale", "float v_scale", "Tensor(a!) output",
        "Tensor? key", "Tensor? value", "Tensor loc", "Tensor attn_logits", "Tensor req_to_token",
        "Tensor req_pool_indices", "Tensor seq_lens", "float sm_scale", "float logit_cap", "bool is_cross",
        "int window", "Tensor? encoder_lens", "Tensor? sinks"),
    "extend_attention_cpu": (
        "Tensor q_extend", "Tensor? k_extend", "Tensor? v_extend", "Tensor(a!) o_extend", "Tensor k_buffer",
        "Tensor v_buffer", "float k_scale", "float v_scale", "Tensor req_to_token", "Tensor req_pool_indices",
        "Tensor seq_lens", "Tensor extend_seq_lens", "Tensor extend_start_loc", "int max_len_extend",
        "float sm_scale", "float logit_cap", "bool is_cross", "int window", "Tensor? encoder_lens", "Tensor? sinks",
        "Tensor? tree_mask", "bool is_causal"),
}

# (first release, arguments it does not pass yet), newest first.
ATTENTION_SCHEMAS = (
    ((0, 5, 20), ()),
    ((0, 5, 19), ("k_scale", "v_scale")),  # extend gained is_causal
    ((0, 5, 16), ("k_scale", "v_scale", "is_causal")),  # extend gained tree_mask (speculative verify)
    ((0, 0, 0), ("k_scale", "v_scale", "tree_mask", "is_causal")),  # 0.5.13-0.5.15
)
# What a release's kernel assumed for an argument it did not take: unit K/V scales, no tree mask,
# causal extend.
ABSENT_DEFAULTS = {"k_scale": 1.0, "v_scale": 1.0, "tree_mask": None, "is_causal": True}


def parse_release(text):
    """(major, minor, patch) from a version string such as "0.5.16" or "0.5.17.post1"."""
    m = re.match(r"\s*(\d+)\.(\d+)\.(\d+)", text or "")
    if not m:
        raise ValueError(f"not an SGLang release: {text!r}")
    return tuple(int(g) for g in m.groups())


def installed_release():
    """$SGLANG_CPU_COMPAT_RELEASE, else the installed sglang's metadata (sglang is not imported),
    else the newest known release."""
    override = os.environ.get(RELEASE_ENV)
    if override:
        return parse_release(override)
    from importlib import metadata

    try:
        return parse_release(metadata.version("sglang"))
    except (metadata.PackageNotFoundError, ValueError):
        return NEWEST


def _name(decl):
    return decl.split()[-1]


def attention_args(release):
    """{op name: argument declarations} of the two attention kernels as ``release`` calls them."""
    absent = next(a for first, a in ATTENTION_SCHEMAS if tuple(release) >= first)
    return {op: tuple(d for d in args if _name(d) not in absent) for op, args in NEWEST_ARGS.items()}


def schema(op, args):
    """The torch schema string of ``op`` with the argument declarations ``args``."""
    return f"{op}({', '.join(args)}) -> ()"


def adapt(fn, newest, given):
    """``fn`` (taking the arguments ``newest``) callable with the positional arguments ``given``; an
    argument missing from ``given`` gets its ``ABSENT_DEFAULTS`` value."""
    given = [_name(d) for d in given]
    slots = [given.index(_name(d)) if _name(d) in given else None for d in newest]
    if slots == list(range(len(newest))):
        return fn
    fill = [ABSENT_DEFAULTS[_name(d)] if s is None else None for d, s in zip(newest, slots)]

    def adapted(*args):
        return fn(*[fill[i] if s is None else args[s] for i, s in enumerate(slots)])

    adapted.__name__ = fn.__name__
    return adapted
