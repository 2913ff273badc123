"""The framework comparison behind `python tools/compare_frameworks.py`, split by role.

    compare.py         the command: flags, the configuration (`zoo.config`), one worker
                       process per backend, the results files
    processes.py       which backends are installed; a worker's environment and process
    worker.py          `python -m bench.frameworks.worker SPEC`: one phase in a fresh process
    start.py           the shared start: data, windows (`tflm.data`), initial weights
    roles.py           weights by role, the Keras side (the native side is in torch_native)
    torch_native.py    the native PyTorch AWD-LSTM peer
    keras_runner.py    one Keras backend's run (`model.fit`)
    native_runner.py   the native peer's run
    timing.py          per-step time and loss, recorded directly; words/s medians
    measure.py         memory, device, GEMM rate, versions, thread pools
    report.py          FLOP floor, agreement, table, markdown, figure

A new framework is a runner module here plus its name in `processes.BACKENDS` and the
dispatch of `worker.run_phase`; the Keras backends share `keras_runner`.
"""
