"""The framework comparison behind `python tools/compare_frameworks.py`, split by role.

    compare.py         the command: flags, the configuration (`zoo.runs.config`), one worker
                       process per backend, the results files
    processes.py       which backends are installed; a worker's environment and process
    worker.py          `python -m tools.frameworks.worker SPEC`: one phase in a fresh process
    settings.py        the training settings and window rule every runner reads
    start.py           the shared start: data, windows (`tflm.data`), initial weights
    roles.py           weights by role, the Keras side (the native side is in torch_native)
    torch_native.py    the native PyTorch AWD-LSTM peer
    torch_zaremba.py   the native PyTorch peer of a `zoo.ZarembaLSTM` preset
    keras_runner.py    one Keras backend's run (`model.fit`)
    native_runner.py   the native peer's run
    timing.py          per-step time and loss, recorded directly; words/s medians
    measure.py         memory, device, GEMM rate, versions, thread pools
    machine.py         the machine (CPU, cores, memory) and this process's memory; the
                       benchmarks in bench/ describe their machine with it too
    report.py          FLOP floor, agreement, table, markdown, figure

Part of the installed package: nothing here imports `bench`. A new framework is a runner
module here plus its name in `processes.BACKENDS` and the dispatch of `worker.run_phase`;
the Keras backends share `keras_runner`.
"""
