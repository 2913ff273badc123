"""One worker process of the comparison: `python -m bench.frameworks.worker SPEC.json`.

SPEC is written by `bench.frameworks.compare`; the worker writes the JSON result it names.
Keras picks its backend at import (`KERAS_BACKEND`, set by the parent), which is why every
backend runs in a process of its own. Phases: "init" (`bench.frameworks.start`: the shared
data and weights) and "run" with a backend: tensorflow, jax, torch
(`bench.frameworks.keras_runner`) or torch-native (`bench.frameworks.native_runner`).
"""

import json
import pathlib
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.frameworks.measure import Skip, numpy_matmul_rate, set_threads  # noqa: E402


def run_phase(spec):
    if spec["phase"] == "init":
        from bench.frameworks.start import make_start
        return make_start(spec)
    if spec["backend"] == "torch-native":
        from bench.frameworks.native_runner import run_native
        return run_native(spec)
    from bench.frameworks.keras_runner import run_keras
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
