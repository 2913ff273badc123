"""Speed, perplexity and memory of one preset across TensorFlow, JAX, PyTorch and native PyTorch.

    python tools/compare_frameworks.py --preset awd_lstm_mos_ptb \\
        --backends tensorflow,jax,torch,torch-native --steps 50 [--epochs 2] --out DIR
    python -m tools.compare_frameworks ...          (the same)

The entry point users run; the harness is `tools.frameworks`, part of the installed package
(the method, every flag and the report are described in `tools/frameworks/compare.py`;
`--help` lists the flags).
"""

import sys

from tools.frameworks.compare import main

if __name__ == "__main__":
    sys.exit(main())
