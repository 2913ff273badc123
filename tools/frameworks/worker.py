"""One worker process of the comparison: `python -m tools.frameworks.worker SPEC.json`.

SPEC is written by `tools.frameworks.compare`; the worker writes the JSON result it names.
Keras picks its backend at import (`KERAS_BACKEND`, set by the parent), which is why every
backend runs in a process of its own. Phases: "init" (`tools.frameworks.start`: the shared
data and weights) and "run" with a backend: tensorflow, jax, torch
(`tools.frameworks.keras_runner`) or torch-native (`tools.frameworks.native_runner`).
"""

import json
import sys
import time
import traceback

from tools.frameworks.measure import Skip, numpy_matmul_rate, set_threads


def run_phase(spec):
    # The phase decides which framework this process loads (Keras with its backend, or
    # PyTorch alone for the native peer), after set_threads has sized its thread pools.
    if spec["phase"] == "init":
        from tools.frameworks.start import make_start  # deferred: the phase picks Keras
        return make_start(spec)
    if spec["backend"] == "torch-native":
        from tools.frameworks.native_runner import run_native  # deferred: PyTorch only
        return run_native(spec)
    from tools.frameworks.keras_runner import run_keras  # deferred: the phase picks Keras
    return run_keras(spec)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = json.load(f)
    started = time.perf_counter()
    # The machine's GEMM rate, before any framework starts its thread pools.
    matmul = numpy_matmul_rate() if spec.get("phase") == "run" else None
    try:
        set_threads(spec.get("backend"), spec.get("threads"))
        result = run_phase(spec)
        result.setdefault("status", "ok")
    except Skip as err:
        result = {"status": "skipped", "reason": str(err)}
    except Exception as err:  # reported in the table; the traceback goes to the log
        traceback.print_exc()
        message = " ".join(str(err).split())
        result = {"status": "failed", "reason": f"{type(err).__name__}: {message}"[:500]}
    if matmul and result.get("status") == "ok" and not result.get("on_gpu"):
        result["matmul_flops"] = matmul
    result["backend"] = spec.get("backend")
    result["worker_wall_s"] = time.perf_counter() - started
    with open(spec["result_path"], "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
