"""A training run, from its settings to its run folder.

    config.py         preset + command-line flags + --set -> one configuration dict (config.json)
    settings.py       that configuration checked once into typed settings, defaults in one place
    setting_keys.py   the keys each part may hold (nearest valid key named), argument types
    corpora.py        the corpus the settings name
    builders.py       model, optimizer, averaging trigger, learning-rate schedule from the settings
    training.py       a whole run: the training loop, checkpoints, evaluation, outputs
    eval_window.py    evaluation windows longer than bptt, same perplexity
    checkpoint.py     epoch checkpoints that a killed run resumes from, and their recovery
    resume.py         what --resume may change, when a run is finished
    run_dir.py        a new run's folder: refusing one in use, undoing a failed start
    run_lock.py       one process per run folder (an OS file lock)
    run_outputs.py    a run's result files written whole; a failed write's one line
    atomic_files.py   a file replaced whole or not at all
    saved_run.py      RUN_DIR|MODEL.keras -> the model, its config, words and corpus (checked)
    run_scalars.py    figures computed after training as TensorBoard scalars of the run
    phase_timer.py    where a run's wall time went (metrics.json's `seconds`)
    search_space.py   random-search spaces over preset fields (`python -m zoo.search`)
"""
