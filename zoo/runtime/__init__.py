"""Process set-up for the command lines (`python -m zoo.<command>`), made in one place.

    python_gc.py          Python's collector held while the frameworks import, then the
                          start-up's objects frozen (TFLM_GC)
    allocator.py          glibc's malloc: freed memory reused; JAX's CPU programs inline
                          (TFLM_MALLOC)
    xla_flags.py          XLA_FLAGS for JAX: older CPU emitters, -O2 (TFLM_XLA_FLAGS)
    quiet_start.py        TensorFlow's start-up lines filtered out of stderr
    compilation_cache.py  JAX's persistent compilation cache for runs (TFLM_JAX_CACHE_DIR)
    interrupt.py          Ctrl-C: training stops at the next batch, never inside TensorFlow
    user_errors.py        a user's error as one line, exit 2 (`one_line_errors` on every
                          main); output paths checked before the work
    progress.py           a bar on a terminal, a line per epoch into a file or a pipe
    device_memory.py      the GPU allocator's peak of a run (metrics.json)
    command.py            `run_command(main)`, `start_command()`, `imports_done()`: the
                          above, once, for every command line

Every command's `__main__` block is `command.run_command(main)`, and every `main` begins with
`start_command()`, before anything imports a framework, and calls `imports_done()` once
its imports are made. A `main` called in-process (a notebook, the tests) gets the same
malloc, XLA and quiet-start settings; the collector is only touched in a command line's own
process (`python_gc.command_line_process`).
"""
