"""`python -m zoo.search`: draws (distributions, constraint, determinism), trials as run
directories, the summary, resuming; the searches on Ray share one local cluster
(`ray_session`)."""

import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from zoo import search
from zoo.errors import ConfigError
from zoo.runs.search_space import SPACES, check_space, load_space, sample
from zoo.studies import engine
from zoo.studies import search as study_search

TINY = ["corpus.train_tokens=3000", "corpus.valid_tokens=800", "corpus.test_tokens=800",
        "corpus.vocab_size=30", "model.embed_dim=8", "training.bptt=10"]

SPACE = {"fields": {"model.hidden_dim": {"int": [8, 24]},
                    "training.batch_size": {"int": [4, 12]},
                    "training.lr": {"log_uniform": [5.0, 40.0]},
                    "model.dropout": {"uniform": [0.0, 0.3]},
                    "model.head.type": {"choice": ["softmax", "mos"]}},
         "constraints": [{"product": ["training.batch_size", "model.hidden_dim"],
                          "at_most": 160}]}


def test_table_a2_space_draws_within_its_ranges_and_constraint():
    space = load_space("zhang2018_mos")
    draws = [sample(space, seed=7, trial=i) for i in range(400)]
    for d in draws:
        assert d["training.batch_size"] * d["training.bptt"] * d["model.hidden_dim"] <= 1.2e6
        assert 500 <= d["model.hidden_dim"] <= 1500 and 1 <= d["model.num_layers"] <= 3
        assert 10 <= d["training.batch_size"] <= 30 and 20 <= d["training.bptt"] <= 50
        assert 2 <= d["model.head.num_experts"] <= 20 and 0 < d["model.init_scale"] < 0.1
        assert 5.0 <= d["training.clip_norm"] <= 10.0 and 0.5 <= d["model.dropout"] <= 0.7
        assert d["training.epochs"] == 20
    # the constraint binds: without it, a share of the draws breaks it, the share of the
    # integer grid above 1.2e6 (exact: 10.3 %; binomial sd over 2,000 draws 0.7 %)
    b, t, h = np.meshgrid(np.arange(10, 31), np.arange(20, 51), np.arange(500, 1501))
    exact = np.mean(b * t * h > 1.2e6)
    free = dict(space, constraints=[])
    broken = [sample(free, 7, i) for i in range(2000)]
    share = np.mean([d["training.batch_size"] * d["training.bptt"] * d["model.hidden_dim"]
                     > 1.2e6 for d in broken])
    assert abs(share - exact) < 4 * np.sqrt(exact * (1 - exact) / 2000)
    # the same seed gives the same draws, trial by trial; another seed others
    assert draws[:5] == [sample(load_space("zhang2018_mos"), 7, i) for i in range(5)]
    assert draws[:5] != [sample(space, 8, i) for i in range(5)]


def test_distributions_match_their_definitions():
    space = check_space({"fields": {"u": {"uniform": [2.0, 5.0]},
                                    "l": {"log_uniform": [1e-3, 1e1]},
                                    "i": {"int": [1, 3]}, "c": {"choice": ["a", "b"]},
                                    "s": {"same_as": "i"}}})
    draws = [sample(space, 0, i) for i in range(2000)]
    u = np.array([d["u"] for d in draws])
    assert stats.kstest((u - 2.0) / 3.0, "uniform").pvalue > 1e-3
    log = np.log10([d["l"] for d in draws])  # log-uniform: uniform exponent on [-3, 1]
    assert stats.kstest((log + 3.0) / 4.0, "uniform").pvalue > 1e-3
    counts = np.bincount([d["i"] for d in draws], minlength=4)[1:]
    assert counts.sum() == 2000 and stats.chisquare(counts).pvalue > 1e-3
    assert {d["c"] for d in draws} == {"a", "b"} and all(d["s"] == d["i"] for d in draws)


@pytest.mark.parametrize("bad, message", [
    ({"fields": {}}, "non-empty"),
    ({"fields": {"a": {"uniform": [3, 1]}}}, "low <= high"),
    ({"fields": {"a": {"log_uniform": [0, 1]}}}, "low > 0"),
    ({"fields": {"a": {"int": [1.5, 3]}}}, "integers"),
    ({"fields": {"a": {"normal": [0, 1]}}}, "exactly one of"),
    ({"fields": {"a": {"same_as": "b"}}}, "same_as"),
    ({"fields": {"a": {"int": [1, 3]}}, "constraints": [{"product": ["z"], "at_most": 1}]},
     "product"),
])
def test_bad_spaces_are_refused_naming_the_problem(bad, message):
    with pytest.raises(ConfigError, match=message):
        check_space(bad)
    with pytest.raises(ConfigError, match="neither a built-in space"):
        load_space("no_such_space")
    assert "zhang2018_mos" in SPACES


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray cluster for this file's searches, as Ray's testing guide advises
    (a cluster's start and shutdown cost 5-7 s here): the engine's own
    `one_session`, so the first search starts it as a search on its own does, with Ray's
    worker priority left to the engine."""
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as patch, engine.one_session():
        patch.delenv(engine.NICENESS_ENV, raising=False)
        yield


def test_search_trains_each_trial_as_a_run_and_summarises_resumably(tmp_path, capsys,
                                                                   ray_session):
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps(SPACE))
    out = tmp_path / "search"
    argv = ["--preset", "synthetic", "--space", str(space_file), "--trials", "2",
            "--seed", "5", "--out", str(out), "--epochs", "1", "--quiet"]
    for item in TINY:
        argv += ["--set", item]
    import signal
    handler = signal.getsignal(signal.SIGINT)
    assert search.main(argv) == 0
    assert signal.getsignal(signal.SIGINT) is handler  # the engine gives Ctrl-C back
    # the local cluster it started (kept up by `ray_session`) runs its workers at this
    # process's CPU priority (Ray's default is 15: beside a busy process a trial crawls),
    # and the environment is left as it was
    import ray
    assert ray.get(ray.remote(lambda: os.nice(0)).remote()) == os.nice(0)
    assert engine.NICENESS_ENV not in os.environ
    printed = capsys.readouterr().out
    table = (out / "summary.md").read_text()
    assert table in printed
    rows = [line for line in table.splitlines() if line.startswith("| ") and "trial_" in line]
    assert len(rows) == 2
    valids = []
    for index in range(2):
        trial = out / f"trial_{index:03d}"
        record = json.loads((trial / "sample.json").read_text())
        config = json.loads((trial / "config.json").read_text())
        metrics = json.loads((trial / "metrics.json").read_text())
        assert record["values"] == sample(check_space(SPACE), 5, index)
        assert config["model"]["hidden_dim"] == record["values"]["model.hidden_dim"]
        assert config["training"]["lr"] == record["values"]["training.lr"]
        assert config["model"]["head"]["type"] == record["values"]["model.head.type"]
        assert config["training"]["epochs"] == 1 and (trial / "best.keras").exists()
        assert (config["training"]["batch_size"] * config["model"]["hidden_dim"]) <= 160
        valids.append(metrics["valid_perplexity"])
        assert f"{metrics['valid_perplexity']:.2f}" in table
    # sorted by validation perplexity
    ranked = [float(r.split("|")[3]) for r in rows]
    assert ranked == [round(v, 2) for v in sorted(valids)]
    # a rerun trains nothing again; one more trial trains only that one
    stamp = (out / "trial_000" / "metrics.json").stat().st_mtime_ns
    assert search.main(argv[:5] + ["3"] + argv[6:]) == 0
    assert (out / "trial_000" / "metrics.json").stat().st_mtime_ns == stamp
    assert (out / "trial_002" / "metrics.json").exists()
    assert len([l for l in (out / "summary.md").read_text().splitlines()
                if "trial_" in l]) == 3
    # another seed would draw other values into the same directories: refused
    capsys.readouterr()
    assert search.main(argv[:7] + ["6"] + argv[8:]) == 2
    assert "drawn with other values" in capsys.readouterr().err


def test_a_field_the_configuration_lacks_is_refused_before_training(tmp_path, capsys):
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps({"fields": {"modle.hidden_dim": {"int": [8, 9]}}}))
    code = search.main(["--preset", "synthetic", "--space", str(space_file), "--trials", "1",
                        "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "modle" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_the_readme_space_example_is_a_valid_space():
    import re

    from tests.conftest import REPO
    text = (REPO / "README.md").read_text(encoding="utf-8")
    example = re.search(r"`(\{\"fields\": .*?\]\})`", text, flags=re.S).group(1)
    space = check_space(json.loads(" ".join(example.split())))
    assert sample(space, 0, 0)["model.head.type"] in ("softmax", "mos")


@pytest.mark.slow  # ~30 s of CPU: two 2-epoch trials on Ray, one interrupted before
def test_an_interrupted_trial_resumes_and_a_diverged_one_is_listed_last(tmp_path, capsys,
                                                                          monkeypatch):
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps({"fields": {"training.lr": {"choice": [20.0, 1e38]}}}))
    argv = ["--preset", "synthetic", "--space", str(space_file), "--trials", "2",
            "--seed", "1", "--out", str(tmp_path / "s"), "--epochs", "2", "--quiet",
            "--set", "training.clip_norm=null", "--set", "model.hidden_dim=16",
            "--set", "training.batch_size=8"]
    for item in TINY:
        argv += ["--set", item]
    lrs = [sample(check_space(json.loads(space_file.read_text())), 1, i)["training.lr"]
           for i in range(2)]
    assert sorted(lrs) == [20.0, 1e38]  # seed 1 draws one of each
    # trial 0's folder as a killed worker leaves it (its first epoch's checkpoint, no
    # results), made in-process through what the engine's worker runs
    from zoo.runs.search_space import load_space
    from tests.zoo.killed_trial import kill_after_first_checkpoint
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    values = sample(check_space(json.loads(space_file.read_text())), 1, 0)
    config = study_search.trial_config("synthetic", overrides, values, 2)
    config["search"] = {"space": load_space(str(space_file)).get("name"), "seed": 1,
                        "trial": 0}
    first = tmp_path / "s" / "trial_000"
    first.mkdir(parents=True)
    (first / study_search.SAMPLE_FILE).write_text(json.dumps(
        {"preset": "synthetic", "space": config["search"]["space"], "seed": 1, "trial": 0,
         "overrides": overrides, "epochs": 2, "values": values}))
    kill_after_first_checkpoint(monkeypatch, "trial_000", config, first)
    assert study_search.trial_state(first) == "interrupted"
    assert search.main(argv) == 0
    good, bad = (0, 1) if lrs[0] == 20.0 else (1, 0)
    metrics = json.loads((tmp_path / "s" / f"trial_{good:03d}" / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    assert study_search.trial_state(tmp_path / "s" / f"trial_{bad:03d}") == "diverged"
    rows = [l for l in (tmp_path / "s" / "summary.md").read_text().splitlines()
            if "trial_" in l]
    assert f"trial_{good:03d}" in rows[0] and "diverged" in rows[1]


def test_tpe_suggestions_follow_each_distribution_of_the_space():
    """`zoo.studies.tpe.suggest` on Optuna trials: each field inside its range and of its
    kind, `value` fixed, `same_as` equal to its field."""
    optuna = pytest.importorskip("optuna")
    from zoo.studies.tpe import suggest
    space = check_space({"fields": {
        "training.lr": {"log_uniform": [0.5, 40.0]}, "model.dropout": {"uniform": [0.1, 0.3]},
        "model.hidden_dim": {"int": [8, 12]}, "model.head.type": {"choice": ["softmax", "mos"]},
        "training.epochs": {"value": 3},
        "training.eval_batch_size": {"same_as": "model.hidden_dim"}}})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    draws = []
    for _ in range(200):
        trial = study.ask()
        draws.append(suggest(trial, space))
        study.tell(trial, 1.0)
    assert all(0.5 <= d["training.lr"] <= 40.0 and 0.1 <= d["model.dropout"] <= 0.3
               for d in draws)
    assert {d["model.hidden_dim"] for d in draws} == {8, 9, 10, 11, 12}
    assert {d["model.head.type"] for d in draws} == {"softmax", "mos"}
    assert all(d["training.epochs"] == 3 and d["training.eval_batch_size"] ==
               d["model.hidden_dim"] for d in draws)
    # log-uniform: the median of log(lr) near the middle of [log 0.5, log 40]
    middle = (math.log(0.5) + math.log(40.0)) / 2
    assert abs(np.median([math.log(d["training.lr"]) for d in draws]) - middle) < 0.45


def test_tpe_search_trains_what_optuna_asks_tells_it_and_resumes(tmp_path, capsys,
                                                               ray_session):
    """`--algorithm tpe`: Optuna asks, the engine trains (two side by side), Optuna is told
    each trial's validation perplexity; draws that break the constraint are never trained;
    the same command again trains nothing, and a larger --trials asks only for the rest."""
    optuna = pytest.importorskip("optuna")
    pytest.importorskip("ray")
    space_file = tmp_path / "space.json"
    space_file.write_text(json.dumps(SPACE))
    out = tmp_path / "tpe"
    argv = ["--preset", "synthetic", "--space", str(space_file), "--trials", "2",
            "--seed", "3", "--out", str(out), "--epochs", "1", "--algorithm", "tpe",
            "--workers", "2"]
    for item in TINY:
        argv += ["--set", item]
    assert search.main(argv) == 0
    study = optuna.load_study(study_name="search", storage=f"sqlite:///{out / 'optuna.db'}")
    trained = [t for t in study.trials if not t.user_attrs.get("rejected")]
    assert len(trained) == 2
    for trial in trained:
        assert trial.state == optuna.trial.TrialState.COMPLETE
        folder = out / f"trial_{trial.number:03d}"
        metrics = json.loads((folder / "metrics.json").read_text())
        assert trial.value == pytest.approx(metrics["valid_perplexity"])
        values = json.loads((folder / "sample.json").read_text())["values"]
        assert values == trial.user_attrs["values"]
        assert values["training.batch_size"] * values["model.hidden_dim"] <= 160
    for trial in study.trials:
        if trial.user_attrs.get("rejected"):
            assert not (out / f"trial_{trial.number:03d}").exists()
    assert "TPE search (Optuna)" in (out / "summary.md").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("trial_*/metrics.json")}
    assert search.main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("trial_*/metrics.json")} == stamps
    assert len([t for t in optuna.load_study(
        study_name="search", storage=f"sqlite:///{out / 'optuna.db'}").trials
        if not t.user_attrs.get("rejected")]) == 2
