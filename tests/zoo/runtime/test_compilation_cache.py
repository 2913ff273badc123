"""`zoo.runtime.compilation_cache`: on JAX a rerun of the same configuration compiles nothing new."""

from tests.backends import run_in_backend
from zoo.runtime import compilation_cache, xla_flags


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(compilation_cache.ENV, raising=False)
    assert compilation_cache.cache_dir() == compilation_cache.DEFAULT.expanduser()
    monkeypatch.setenv(compilation_cache.ENV, "off")
    assert compilation_cache.cache_dir() is None
    monkeypatch.setenv(compilation_cache.ENV, str(tmp_path))
    assert compilation_cache.cache_dir() == tmp_path
    import keras
    if keras.backend.backend() != "jax":
        assert compilation_cache.enable() is None  # only JAX has one


def test_a_jax_rerun_is_served_from_the_cache(tmp_path):
    out = run_in_backend("jax", f"""
        import json, os, pathlib
        os.environ["TFLM_JAX_CACHE_DIR"] = {str(tmp_path / 'cache')!r}
        os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # zoo.train adds to it
        # the tiny model compiles in well under JAX's default 1 s threshold: the cache
        # fills only because zoo.runtime.compilation_cache keeps every program
        from zoo import train
        tiny = ["--set", "corpus.train_tokens=3000", "--set", "corpus.valid_tokens=800",
                "--set", "corpus.test_tokens=800", "--set", "corpus.vocab_size=30",
                "--set", "model.hidden_dim=8", "--set", "model.embed_dim=8",
                "--set", "training.bptt=8", "--batch-size", "4", "--quiet"]
        cache = pathlib.Path({str(tmp_path / 'cache')!r})
        counts = []
        for run in ("a", "b"):
            assert train.main(["--epochs", "1", "--out", {str(tmp_path)!r} + "/" + run,
                               *tiny]) == 0
            counts.append(len(list(cache.rglob("*"))))
        metrics = json.loads(pathlib.Path({str(tmp_path)!r} + "/b/metrics.json").read_text())
        print(counts[0], counts[1], metrics["jax_compilation_cache"] == str(cache),
              metrics.get("allocator", dict()).get("jax_cpu_enable_async_dispatch"),
              "|".join(metrics.get("xla_flags", ["none"])))
    """, timeout=600)
    first, second, recorded, inline, flags = out.split()[-5:]
    assert int(first) > 0, "the first run must fill the cache"
    assert int(second) == int(first), "the rerun must compile nothing new"
    assert recorded == "True"
    assert inline == "False"  # zoo.train ran JAX's CPU programs inline (zoo.runtime.allocator)
    if xla_flags.jaxlib_verified():
        # zoo.train set XLA's emitters (zoo.runtime.xla_flags); the tests' own optimization level stays
        assert flags == xla_flags.FUSION_EMITTERS
