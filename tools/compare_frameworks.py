"""Speed, perplexity and memory of one preset across TensorFlow, JAX, PyTorch and native PyTorch.

    python tools/compare_frameworks.py --preset awd_lstm_mos_ptb \\
        --backends tensorflow,jax,torch,torch-native --steps 50 [--epochs 2] --out DIR

The entry point users run; the harness is `bench.frameworks` (the method, every flag and
the report are described in `bench/frameworks/compare.py`; `--help` lists the flags).
"""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python tools/compare_frameworks.py`
    sys.path.insert(0, str(REPO))

from bench.frameworks.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
