"""The CPU's decode products over weights as stored: FP8 (one byte a weight) and bf16, never a float copy.

A decode step is memory-bound: its time is the bytes it reads. torch has no CPU product that reads fp8
weights at memory speed (a compiled dequantize-and-reduce reached 24-30% of the floor, `_scaled_mm` under
1%; bench/README.md), so cpu_gemv.c does it: the weights are widened in registers as they stream in, each
thread streaming its own block of output rows, on the OpenMP runtime torch's own CPU ops run on.

The C file is compiled on first use, with `-march=native`, by the machine's C compiler (`$CC`, else `cc` or
`gcc`),
into a cache keyed by the source, the compiler and the CPU (`$DRAFTER_KERNEL_CACHE`, else
`~/.cache/drafter/kernels`), and checked against torch on every fp8 byte before it serves. Where it cannot
be built or checked, or the CPU has neither AVX2 with F16C nor AVX-512, `kernel()` raises
`KernelUnavailable` with the reason, and the engine serves through torch instead (engine/model/cpu_linears.py).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_gemv.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
FAST_ISAS = ("avx512", "avx2")  # the portable C build is correct but no faster than torch's float copy


class KernelUnavailable(RuntimeError):
    """Why the CPU kernels cannot serve on this machine; the engine falls back to torch."""


class Kernel:
    """The compiled library's two products, as functions of torch tensors."""

    def __init__(self, library: ctypes.CDLL):
        pointer, count = ctypes.c_void_p, ctypes.c_int64
        library.drafter_gemv_isa.restype = ctypes.c_char_p
        self.isa = library.drafter_gemv_isa().decode()
        library.drafter_fp8_gemv.argtypes = [pointer, count, count, pointer, count, pointer, count, pointer]
        library.drafter_fp8_gemv.argtypes += [pointer, ctypes.c_int]
        library.drafter_bf16_gemv.argtypes = [pointer, count, count, pointer, count, pointer, ctypes.c_int]
        library.drafter_fp8_dequantize.argtypes = [
            pointer,
            count,
            count,
            pointer,
            count,
            pointer,
            ctypes.c_int,
        ]
        self.library = library
        # Every core this process may run on: a draft is what the target waits for, so it takes them all
        # (torch's own small ops keep --num-threads). Idle between calls, the threads sleep after a short
        # spin, so they take nothing from a target verifying on the same cores.
        self.threads = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )

    def fp8(
        self,
        x: torch.Tensor,  # [rows, in] float32, contiguous
        weight: torch.Tensor,  # [out, in] float8_e4m3fn, contiguous
        scale: torch.Tensor,  # [1] or [out] float32, contiguous
        bias: torch.Tensor | None,  # [out] float32
    ) -> torch.Tensor:  # [rows, out] float32
        rows, (out, inner) = x.shape[0], weight.shape
        y = torch.empty(rows, out, dtype=torch.float32)
        self.library.drafter_fp8_gemv(
            x.data_ptr(), rows, inner, weight.data_ptr(), out, scale.data_ptr(), int(scale.numel() > 1),
            None if bias is None else bias.data_ptr(), y.data_ptr(), self.threads,
        )  # fmt: skip
        return y

    def dequantize(
        self,
        weight: torch.Tensor,  # [out, in] float8_e4m3fn, contiguous
        scale: torch.Tensor,  # [1] or [out] float32, contiguous
    ) -> torch.Tensor:  # [out, in] float32: exactly engine.model.fp8.dequantize's
        out, inner = weight.shape
        dense = torch.empty(out, inner, dtype=torch.float32)
        self.library.drafter_fp8_dequantize(
            weight.data_ptr(),
            out,
            inner,
            scale.data_ptr(),
            int(scale.numel() > 1),
            dense.data_ptr(),
            self.threads,
        )
        return dense

    def bf16(
        self,
        x: torch.Tensor,  # [rows, in] float32, contiguous
        weight: torch.Tensor,  # [out, in] bfloat16, contiguous
    ) -> torch.Tensor:  # [rows, out] float32
        rows, (out, inner) = x.shape[0], weight.shape
        y = torch.empty(rows, out, dtype=torch.float32)
        self.library.drafter_bf16_gemv(
            x.data_ptr(), rows, inner, weight.data_ptr(), out, y.data_ptr(), self.threads
        )
        return y


@functools.cache
def kernel() -> Kernel:
    """The checked kernel of this machine, built once per process (and once per machine on disk)."""
    library = ctypes.CDLL(str(build()))
    compiled = Kernel(library)
    if compiled.isa not in FAST_ISAS:
        raise KernelUnavailable(
            f"this CPU has neither AVX-512 nor AVX2 with F16C (the kernel built as {compiled.isa!r})"
        )
    self_check(compiled)
    log.info("CPU kernels ready (%s): FP8 and bf16 weights read as stored", compiled.isa)
    return compiled


def available() -> tuple[Kernel | None, str | None]:
    """The kernel, or None and why not (the reason logged once by whoever falls back)."""
    try:
        return kernel(), None
    except KernelUnavailable as error:
        return None, str(error)


def build() -> Path:
    """The shared library for this source, compiler and CPU: compiled into the cache unless it is there."""
    compiler = os.environ.get("CC") or next((c for c in ("cc", "gcc") if shutil.which(c)), "cc")
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C compiler ({compiler!r} is not on PATH; install gcc, or set $CC)")
    source = SOURCE.read_bytes()
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise KernelUnavailable(f"the C compiler {compiler!r} does not run: {error}") from None
    key = hashlib.sha256(source + version + cpu_signature().encode() + " ".join(FLAGS).encode()).hexdigest()
    target = cache_dir() / f"cpu_gemv-{key[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled beside its final name and renamed into place: two processes building at once both succeed.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        command = [compiler, *FLAGS, "-o", str(built), str(SOURCE)]
        try:
            subprocess.run(command, capture_output=True, check=True, timeout=300)
        except subprocess.CalledProcessError as error:
            why = error.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise KernelUnavailable(f"{compiler} could not build the kernel: {why[0]}") from None
        except (OSError, subprocess.SubprocessError) as error:
            raise KernelUnavailable(f"{compiler} could not build the kernel: {error}") from None
        os.replace(built, target)
    log.info("compiled the CPU kernels into %s", target)
    return target


def cache_dir() -> Path:
    configured = os.environ.get("DRAFTER_KERNEL_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "drafter" / "kernels"


def cpu_signature() -> str:
    """What `-march=native` depends on: the CPU's model and flags."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def self_check(compiled: Kernel) -> None:
    """Every finite fp8 byte converted exactly; odd shapes, 1 to 9 rows, both scale layouts and a bias
    against torch's dequantized product. A build that differs is not served."""
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    every = every[~every.float().isnan()]  # the 254 finite values
    alone = torch.zeros(every.numel(), 16, dtype=torch.float8_e4m3fn)  # each value alone in a row
    alone[torch.arange(every.numel()), torch.arange(every.numel()) % 16] = every
    if not torch.equal(compiled.fp8(torch.ones(1, 16), alone, torch.ones(1), None)[0], every.float()):
        raise KernelUnavailable(f"the {compiled.isa} build converts fp8 bytes wrongly")
    generator = torch.Generator().manual_seed(0)
    for rows, (out, inner) in [(1, (9, 254)), (3, (13, 37)), (9, (6, 70)), (2, (40, 8))]:
        weight = every[torch.randint(0, every.numel(), (out, inner), generator=generator)]
        x = torch.randn(rows, inner, generator=generator)
        bias = torch.randn(out, generator=generator)
        for scale in (torch.tensor([0.37]), torch.rand(out, generator=generator) + 0.5):
            exact = weight.float() * scale.reshape(-1, 1)
            got = compiled.fp8(x, weight.contiguous(), scale, bias)
            if not summed_alike(got, F.linear(x, exact, bias), x, exact):
                raise KernelUnavailable(f"the {compiled.isa} build's fp8 product differs from torch's")
            if not torch.equal(compiled.dequantize(weight.contiguous(), scale), exact):
                raise KernelUnavailable(f"the {compiled.isa} build dequantizes fp8 otherwise than torch")
        half = torch.randn(out, inner, generator=generator).bfloat16()
        if not summed_alike(compiled.bf16(x, half), x @ half.float().T, x, half.float()):
            raise KernelUnavailable(f"the {compiled.isa} build's bf16 product differs from torch's")


def summed_alike(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Equal up to float32 rounding in another order of summation: within 1e-5 of the sum of |terms|."""
    return bool(((got - want).abs() <= 1e-5 * (x.abs() @ weight.abs().T) + 1e-6).all())
