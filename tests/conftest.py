"""Shared test setup: the `gpu` marker skips cleanly without a CUDA GPU, and helpers used by
every op's tests (fresh seeds, comparison with meaningful tolerances, the kernel path of a test,
the names of the kernels a call launched)."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch

try:
    import mla_ext  # noqa: F401  (loads the library and registers the ops)
    from mla_ext._library import set_force_portable
except ImportError as _no_library:
    # Not built. The tests of the pure-Python DeepSeek-V4 spec (test_v4_reference.py) still run;
    # every other test module imports mla_ext itself and fails at collection with this message.
    _LIBRARY_ERROR = _no_library

    def set_force_portable(mode: int) -> None:
        raise _LIBRARY_ERROR

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """A different but reproducible seed per test: inputs are fresh random data per case. crc32,
    not hash(): PYTHONHASHSEED salts str hashes per process, so a failure could not be replayed."""
    seed = zlib.crc32(request.node.nodeid.encode()) % (2**31)
    torch.manual_seed(seed)
    yield


def assert_close(out: torch.Tensor, ref: torch.Tensor, *, cos_tol: float, atol: float, rtol: float, name: str = "out"):
    """Compare in fp32: inf/NaN in the same places, cosine difference, then abs/rel error."""
    out, ref = out.float(), ref.float()
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    out_nan, ref_nan = torch.isnan(out), torch.isnan(ref)
    assert torch.equal(out_nan, ref_nan), f"{name}: NaN in {int(out_nan.sum())} places, reference {int(ref_nan.sum())}"
    out_inf, ref_inf = torch.isinf(out), torch.isinf(ref)
    assert torch.equal(out_inf, ref_inf) and torch.equal(out[out_inf], ref[ref_inf]), f"{name}: inf in different places"
    finite = torch.isfinite(ref)
    o, r = out[finite].double(), ref[finite].double()
    if r.numel() == 0:
        return
    denom = (o * o).sum() + (r * r).sum()
    cos_diff = (1 - 2 * (o * r).sum() / denom).item() if denom > 0 else 0.0
    assert cos_diff <= cos_tol, f"{name}: cosine difference {cos_diff:.3g} > {cos_tol}"
    err = (o - r).abs()
    bad = err > atol + rtol * r.abs()
    assert not bool(bad.any()), (
        f"{name}: {int(bad.sum())}/{r.numel()} elements off; max abs err {err.max().item():.3g} "
        f"(atol {atol}, rtol {rtol})"
    )


# ---- kernel paths ------------------------------------------------------------------------------
# MLA_EXT_FORCE_PORTABLE is read once per process; these fixtures switch the library's choice for
# one test through mla_ext._library.set_force_portable and give the environment's choice back after.


@pytest.fixture
def force_portable():
    """The portable kernels (mma.sync, what sm100 runs) where the GPU has architecture-specific ones."""
    set_force_portable(1)
    yield
    set_force_portable(-1)


@pytest.fixture
def arch_kernels():
    """The architecture-specific kernels where they exist, whatever MLA_EXT_FORCE_PORTABLE says: for
    the tests that assert which kernel ran."""
    set_force_portable(0)
    yield
    set_force_portable(-1)


def use_path(request, path: str) -> None:
    """A test's kernel path: "default" (the environment's choice: the sanitizer runs force the
    portable kernels with MLA_EXT_FORCE_PORTABLE=1), "portable" or "arch" (the fixtures above)."""
    if path == "portable":
        request.getfixturevalue("force_portable")
    elif path == "arch":
        request.getfixturevalue("arch_kernels")
    else:
        assert path == "default", path


def num_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def is_sm90() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


# ---- which kernels ran -------------------------------------------------------------------------


def launched_kernels(fn, pattern: str):
    """(fn(), the sorted names of the kernels it launched whose names contain ``pattern`` and
    "_kernel", as all of mla_ext's kernels' do), by the torch profiler. Names are demangled, e.g.
    ``void mla::decode::portable::decode_split_kernel<__nv_bfloat16, (mla::CacheFormat)0, 16>(
    mla::decode::DecodeParams)``. Not for the tests that compute-sanitizer runs (-k small or
    sanitizer): the profiler and the sanitizer both instrument the GPU."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    return result, sorted({e.name for e in prof.events() if pattern in e.name and "_kernel" in e.name})


@dataclasses.dataclass(frozen=True)
class EnumArg:
    """An enum template argument, which demanglers print as ``(mla::CacheFormat)2`` or as
    ``mla::CacheFormat::kFp8DsMla``."""

    value: int
    name: str

    def matches(self, arg: str) -> bool:
        return arg.endswith(f"){self.value}") or arg == str(self.value) or arg.split("::")[-1] == self.name


CACHE_FORMAT = {"auto": EnumArg(0, "kAuto"), "fp8": EnumArg(1, "kFp8"), "fp8_ds_mla": EnumArg(2, "kFp8DsMla")}
SCALAR = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}


def template_args(name: str, template: str) -> list[str] | None:
    """The arguments of the first ``template<...>`` in a demangled name, split at its top-level commas
    (spaces removed), or None when ``template<`` is not in the name:
    ``template_args("void k<A<1, 2>, true>(P)", "k") == ["A<1,2>", "true"]``."""
    at = name.find(template + "<")
    if at < 0:
        return None
    args, cur, depth = [], "", 0
    for ch in name[at + len(template) + 1:]:
        if depth == 0 and ch in ",>":
            args.append(cur.replace(" ", ""))
            if ch == ">":
                return args
            cur = ""
            continue
        depth += ch in "<("
        depth -= ch in ">)"
        cur += ch
    raise ValueError(f"unbalanced template arguments in {name!r}")


def kernel_is(name: str, template: str, args: tuple | None, *, prefix: bool = False) -> bool:
    """Whether kernel ``name`` is ``template`` with ``args`` (None: a kernel that is no template, or
    whose arguments are not checked; ``prefix``: the first len(args) arguments). Each of ``args``:
    a bool, an int, a str (a type, spaces removed) or an EnumArg."""
    if args is None:
        return template in name
    got = template_args(name, template)
    if got is None or len(got) < len(args) or (len(got) > len(args) and not prefix):
        return False
    for arg, want in zip(got, args):
        if isinstance(want, EnumArg):
            ok = want.matches(arg)
        elif isinstance(want, bool):
            ok = arg == str(want).lower()
        else:
            ok = arg == str(want).replace(" ", "")
        if not ok:
            return False
    return True
