"""One intra-op thread for a helper thread, without touching the training thread's setting.

Why: a background reader (:class:`lab.data.prefetch.ThreadPrefetcher`) runs torch ops too (the batch gather,
a decode's tensor conversion). With ATen's OpenMP backend, each calling thread opens its own OpenMP team,
sized by *its* ``nthreads`` setting, which starts at the core count. On a 2-core machine a training step on
2 threads plus a reader's 2-thread team is 4 spinning threads on 2 cores: every parallel region of the step
then waits for a descheduled team member. Measured on the 2-core Xeon (ctr small, fused Adam + fast
kernels, network_fs reads): the compute part of a step went from 16 ms to 28 ms once the reader thread
started, and the prefetcher lost more than it hid.

``torch.set_num_threads`` is no fix: it is process-wide (it also sets MKL's and the main thread's count), so
calling it in the reader makes the *training* step single-threaded. ``omp_set_num_threads`` called from the
reader itself changes only that thread's OpenMP setting (the ``nthreads-var`` ICV is per thread), which is
what this module does, through the OpenMP runtime torch itself loaded. One trap: ATen initialises a thread's
count lazily, at its first torch call, from the last ``torch.set_num_threads``; a limit set before that
first call is silently undone (seen as a prefetcher that helped the first run in a process and no later one).
Where there is no OpenMP runtime (another parallel backend, a build without OpenMP) it changes nothing and
says so.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import torch


@functools.lru_cache(maxsize=1)
def _openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime ATen uses (torch's bundled libgomp / libiomp / libomp), or None."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    names = [os.path.basename(p) for p in sorted(glob.glob(os.path.join(lib_dir, "lib*omp*")))]
    # torch's own copy first (it is the one already loaded), then the system's by soname
    for candidate in [os.path.join(lib_dir, n) for n in names] + ["libgomp.so.1", "libiomp5.so", "libomp.so",
                                                                    "libomp.dylib"]:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        if hasattr(lib, "omp_set_num_threads") and hasattr(lib, "omp_get_max_threads"):
            return lib
    return None


def limit_this_thread(n: int = 1) -> bool:
    """Let the *calling* thread's torch ops use at most ``n`` OpenMP threads; other threads keep theirs.
    Returns whether the limit took effect (False: no OpenMP runtime found, nothing changed)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} is invalid: must be an integer >= 1")
    lib = _openmp()
    if lib is None:
        return False
    # ATen sets each thread's OpenMP count lazily, on that thread's first torch call, to the process-wide count
    # of the last ``torch.set_num_threads``: trigger that first, or it would undo the limit at the first op.
    torch.get_num_threads()
    lib.omp_set_num_threads(n)
    return int(lib.omp_get_max_threads()) == n == torch.get_num_threads()
