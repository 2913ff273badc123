"""`python -m zoo.study` and `zoo.studies`: study files checked and planned, the table's
means, SDs and p-values against hand computation, the figure, and a study run on a
two-worker local Ray cluster beside a two-node one (which a study joins with `--address`),
then resumed without retraining what finished."""

import csv
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from scipy import stats

from zoo.errors import ConfigError
from zoo.studies import aggregate, figures, list_studies, load_study
from zoo.studies.trials import plan, trial_name

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = {"corpus.train_tokens": 2000, "corpus.valid_tokens": 400, "corpus.test_tokens": 400,
        "corpus.vocab_size": 30, "model.embed_dim": 8, "model.hidden_dim": 8,
        "training.bptt": 8, "training.batch_size": 8, "training.epochs": 1}


def _study(tmp_path, **changes):
    study = {"description": "two synthetic arms", "reproduces": "nothing (a test)",
             "arms": {"a": {"preset": "synthetic"},
                      "b": {"preset": "synthetic", "set": {"model.dropout": 0.1}}},
             "seeds": [1, 2, 3], "metrics": ["test_perplexity", "valid_perplexity"],
             "baseline": "a", "published": [{"arm": "b", "test_perplexity": 30.0,
                                              "test_perplexity_sd": 1.5, "p_value": 0.2}],
             "scales": {"smoke": {"seeds": [1, 2], "set": TINY}}, **changes}
    path = tmp_path / "two_arms.json"
    path.write_text(json.dumps(study))
    return path


@pytest.mark.parametrize("name", list_studies())
def test_every_bundled_study_plans_at_both_scales(name):
    """Each arm's preset and every field of its settings and grid resolve, at both scales;
    the published cells name arms and points the study runs."""
    study = load_study(name)
    for scale in ("smoke", "paper"):
        trials = plan(study, scale)
        assert len({t.name for t in trials}) == len(trials)
        smoke_seeds = study["scales"]["smoke"]["seeds"]
        if scale == "smoke":
            assert len(smoke_seeds) == 2 and {t.seed for t in trials} == set(smoke_seeds)
            assert all(t.config["training"]["epochs"] == 1 for t in trials)
    points = {(t.arm, t.point) for t in plan(study, "paper")}
    for cell in study["published"]:
        assert (cell["arm"], tuple(cell.get("point", {}).items())) in points, cell


@pytest.mark.parametrize("name", list_studies())
def test_every_smoke_trial_of_every_bundled_study_builds_and_runs_a_window(name):
    """Each distinct smoke-scale configuration (seeds aside) builds as zoo.train builds it
    (the model, compiled with the run's optimizer) and predicts a window: what a smoke
    trial's first step needs, in CI time (the whole smoke run of every study is the slow
    test `test_every_bundled_study_runs_at_smoke_scale`). Configurations that differ only
    in training fields the model does not read (`build_model`: the model part, the training
    fields it owns, the precision) share one model, compiled with each one's optimizer."""
    from zoo.runs.builders import build_model, make_optimizer
    from zoo.runs.settings import RunSettings
    configs = {}
    for trial in plan(load_study(name), "smoke"):
        config = json.loads(json.dumps(trial.config))
        config["training"].pop("seed", None)
        configs.setdefault(json.dumps(config, sort_keys=True), trial)
    models = {}
    for trial in configs.values():
        settings = RunSettings.from_config(trial.config)
        vocab = trial.config["corpus"].get("vocab_size") or 10_000  # PTB's: smoke text
        key = json.dumps([trial.config["model"], settings.training.model_arguments(),
                          settings.training.precision, vocab], sort_keys=True)
        first = key not in models
        if first:
            models[key] = build_model(settings, vocab)
        model = models[key]
        model.compile(optimizer=make_optimizer(settings.training))
        if first:
            model.build((None, None))
            out = model.forward_with_state(np.zeros((1, 4), "int32"))[0]
            assert np.asarray(out).shape == (1, 4, vocab), trial.name


def test_the_gss_grid_is_the_theses_cross_product():
    trials = plan(load_study("parthiban_table_4_4_gss_grid_ptb"))
    cs = sorted({t.point_dict["model.head.c"] for t in trials})
    ks = sorted({t.point_dict["model.head.k"] for t in trials})
    assert cs == [0.5 * x for x in range(-4, 5)] and ks == [0.25 * x for x in range(5, 13)]
    assert len(trials) == 72 and trials[0].config["model"]["head"]["type"] == "gss"
    first = trials[0]
    assert first.config["model"]["head"]["c"] == first.point_dict["model.head.c"]


def test_settings_apply_in_order_and_name_the_folder(tmp_path):
    """The arm's settings, then the scale's (tiny sizes win), then the seed."""
    trials = plan(load_study(_study(tmp_path)), "smoke")
    b = [t for t in trials if t.arm == "b"]
    assert [t.name for t in b] == ["b__seed1", "b__seed2"]
    assert b[0].config["model"]["dropout"] == 0.1 and b[0].config["model"]["hidden_dim"] == 8
    assert b[1].config["training"]["seed"] == 2
    assert trial_name("gss", (("model.head.c", -1.5), ("model.head.k", 2.5)), 141) == \
        "gss__c=-1.5__k=2.5__seed141"
    with pytest.raises(ConfigError, match="--seeds 3"):
        plan(load_study(_study(tmp_path)), "smoke", seeds=3)


@pytest.mark.parametrize("change, message", [
    ({"arms": {"a": {"preset": "no_such_preset"}, "b": {"preset": "synthetic"}}},
     "Unknown preset"),
    ({"baseline": "c"}, "baseline 'c'"),
    ({"seeds": []}, "non-empty list"),
    ({"arms": {"a": {"preset": "synthetic", "set": {"model.no_such_field": 1}},
               "b": {"preset": "synthetic"}}}, "arm 'a'"),
    ({"colour": "red"}, "unknown key"),
    ({"arms": {"s": {"preset": "synthetic", "search": {"space": {"fields": {}}, "trials": 0}}},
      "baseline": None}, "search at scale smoke: 'trials' must be an integer >= 1"),
    ({"arms": {"s": {"preset": "synthetic", "search": {"trials": 2}}}, "baseline": None},
     "no 'space'"),
    ({"arms": {"s": {"preset": "synthetic", "search": {"space": "zhang2018_mos", "trials": 2,
                                                       "algorithm": "grid"}}},
      "baseline": None}, "'algorithm' must be one of"),
    ({"arms": {"s": {"preset": "synthetic", "search": {
        "space": {"fields": {"model.no_such_field": {"int": [1, 2]}}}, "trials": 2}}},
      "baseline": None, "published": []}, "arm 's'.*no_such_field"),
])
def test_a_bad_study_is_refused_naming_what_is_wrong(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_study(_study(tmp_path, **change))


SEARCH_SPACE = {"fields": {"model.hidden_dim": {"int": [6, 12]},
                           "model.dropout": {"uniform": [0.0, 0.3]},
                           "training.lr": {"value": 0.5}}}


def _searched(tmp_path, **changes):
    """A study of one searched arm (two draws of SEARCH_SPACE, then two seeds of the best
    draw trained with the arm's `set`) and one plain arm."""
    arms = {"s": {"preset": "synthetic",
                  "search": {"space": SEARCH_SPACE, "trials": 2, "seed": 5,
                             "published": {"model.hidden_dim": 10, "model.dropout": 0.2}},
                  "set": {"training.lr": 2.0}},
            "a": {"preset": "synthetic"}}
    tiny = {k: v for k, v in TINY.items() if k != "model.hidden_dim"}
    return _study(tmp_path, arms=arms, published=[], baseline=None,
                  scales={"smoke": {"seeds": [1, 2], "set": tiny}}, **changes)


def test_a_searched_arms_trials_train_its_chosen_draw_under_the_arms_settings(tmp_path):
    """preset, then the chosen draw, then the arm's set, then the scale's: the draw's sizes
    stay, the arm's rate replaces the draw's; before the search, draw 0 stands in."""
    from zoo.runs.search_space import load_space, sample
    study = load_study(_searched(tmp_path))
    draw = {"model.hidden_dim": 11, "model.dropout": 0.25, "training.lr": 0.5}
    trials = [t for t in plan(study, "paper", draws={"s": draw}) if t.arm == "s"]
    assert [t.name for t in trials] == ["s__seed1", "s__seed2", "s__seed3"]
    assert all(t.config["model"]["hidden_dim"] == 11 and t.config["model"]["dropout"] == 0.25
               and t.config["training"]["lr"] == 2.0 for t in trials)
    stand_in = sample(load_space(SEARCH_SPACE), 5, 0)
    (first, *_) = plan(study, "paper")
    assert first.config["model"]["hidden_dim"] == stand_in["model.hidden_dim"]


def test_the_chosen_draw_is_the_finished_trial_of_lowest_validation_perplexity():
    from zoo.studies.search import chosen, draw_table
    rows = [{"trial": 0, "dir": "trial_000", "status": "finished", "valid": 90.0,
             "values": {"x": 1}},
            {"trial": 1, "dir": "trial_001", "status": "diverged", "values": {"x": 2}},
            {"trial": 2, "dir": "trial_002", "status": "finished", "valid": 80.5,
             "values": {"x": 3}},
            {"trial": 3, "dir": "trial_003", "status": "finished", "valid": math.nan,
             "values": {"x": 4}}]
    assert chosen(rows)["dir"] == "trial_002"
    assert chosen([rows[1], rows[3]]) is None and chosen([]) is None
    text = draw_table("s", chosen(rows), {"trials": 4, "published": {"x": 5, "y": 6}})
    assert "random, 4 trials, seed 0" in text and "trial_002 (validation perplexity 80.50)" in text
    assert "| `x` | 3 | 5 |" in text and "| `y` | - | 6 |" in text
    assert "was not trained" in draw_table("s", None, {"trials": 4})


def _fake_runs(tmp_path, study_path, values):
    """Finished run folders with the given test / valid perplexities per (arm, seed)."""
    study = load_study(study_path)
    trials = plan(study, "paper")
    for trial in trials:
        run = tmp_path / "trials" / trial.name
        run.mkdir(parents=True)
        test, valid = values[trial.arm][trial.seed]
        history = [{"val_perplexity": valid + 10.0 * (2 - e)} for e in range(3)]
        (run / "metrics.json").write_text(json.dumps(
            {"test_perplexity": test, "valid_perplexity": valid, "history": history}))
    return study, trials


def test_the_table_holds_hand_computed_means_sds_and_p_values(tmp_path):
    values = {"a": {1: (31.0, 33.0), 2: (32.5, 34.0), 3: (30.2, 32.9)},
              "b": {1: (29.0, 30.5), 2: (29.4, 31.0), 3: (28.1, 30.0)}}
    study, trials = _fake_runs(tmp_path, _study(tmp_path), values)
    rows = {r["arm"]: r for r in aggregate.cells(study, trials, tmp_path)}
    b_test = [29.0, 29.4, 28.1]
    a_test = [31.0, 32.5, 30.2]
    mean = sum(b_test) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in b_test) / 2)
    assert rows["b"]["mean"]["test_perplexity"] == pytest.approx(mean)
    assert rows["b"]["sd"]["test_perplexity"] == pytest.approx(sd)
    assert rows["b"]["difference"]["test_perplexity"] == pytest.approx(mean - 30.0)
    # the rank sum by hand: b holds ranks 1-3 of 6; z = (6 - 3 * 7 / 2) / sqrt(9 * 7 / 12)
    z = (6 - 3 * 7 / 2) / math.sqrt(3 * 3 * 7 / 12)
    assert rows["b"]["p_value"] == pytest.approx(2 * stats.norm.sf(abs(z)))
    assert rows["b"]["p_value"] == pytest.approx(stats.ranksums(b_test, a_test).pvalue)
    assert rows["a"]["p_value"] is None  # the baseline is not tested against itself
    table = aggregate.markdown(list(rows.values()), study)
    line = next(x for x in table.splitlines() if x.startswith("| b |"))
    assert f"| 3 of 3 | {mean:.2f} +- {sd:.2f} | 30.00 +- 1.50 | {mean - 30:.2f} |" in line
    assert line.endswith(f"| {rows['b']['p_value']:.3g} (published 0.2) |")
    aggregate.write_csv(list(rows.values()), tmp_path / "r.csv", study["metrics"])
    with open(tmp_path / "r.csv") as f:
        read = {r["arm"]: r for r in csv.DictReader(f)}
    assert float(read["b"]["test_perplexity_sd"]) == pytest.approx(sd)
    assert float(read["b"]["p_value"]) == pytest.approx(rows["b"]["p_value"])


def test_unfinished_seeds_are_counted_not_averaged(tmp_path):
    values = {"a": {1: (31.0, 33.0), 2: (32.0, 34.0), 3: (30.0, 32.0)},
              "b": {1: (29.0, 30.5), 2: (29.4, 31.0), 3: (28.0, 30.0)}}
    study, trials = _fake_runs(tmp_path, _study(tmp_path), values)
    (tmp_path / "trials" / "b__seed3" / "metrics.json").unlink()
    rows = {r["arm"]: r for r in aggregate.cells(study, trials, tmp_path)}
    assert rows["b"]["seeds"] == [1, 2] and rows["b"]["states"][3] == "new"
    assert rows["b"]["mean"]["test_perplexity"] == pytest.approx(29.2)
    assert "| 2 of 3 |" in aggregate.markdown(list(rows.values()), study)


def test_the_curves_figure_draws_each_arms_mean_and_band(tmp_path):
    import matplotlib.image
    values = {"a": {1: (31.0, 33.0), 2: (32.0, 34.0), 3: (30.0, 35.0)},
              "b": {1: (29.0, 30.0), 2: (29.4, 31.0), 3: (28.0, 32.0)}}
    study, trials = _fake_runs(tmp_path, _study(tmp_path), values)
    drawn = figures.curves(trials, tmp_path, tmp_path / "curves.png")
    mean, sd = drawn["b"]
    np.testing.assert_allclose(mean, [51.0, 41.0, 31.0])  # valid + 10 (2 - epoch)
    np.testing.assert_allclose(sd, np.std([30.0, 31.0, 32.0], ddof=1))
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.ndim == 3 and image.shape[0] > 100


def _study_command(study, out, *extra, env=None):
    return subprocess.run([sys.executable, "-m", "zoo.study", str(study), "--scale", "smoke",
                           "--out", str(out), *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=900, env=env)


def _study_main(capsys, study, out, *extra):
    """`zoo.study`'s main in this process (a fresh command line costs about 8 s of
    TensorFlow import here): what a check of its output needs, where the command line
    itself is tested by `_study_command` beside it. Returns (exit code, stdout, stderr)."""
    from zoo import study as command
    capsys.readouterr()
    code = command.main([str(study), "--scale", "smoke", "--out", str(out), *extra])
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def test_a_study_runs_on_ray_clusters_and_resumes_without_retraining(tmp_path, capsys):
    """A plain arm and a searched one on a local cluster of the study's own: the search's
    two draws train first, then the first seed of each arm (`--seeds 1`), the searched
    arm's with the draw of lowest validation perplexity, all in one Ray session
    (`engine.one_session`); the same command again trains nothing, and the study with its
    other seed is refused. The local cluster is started beside a running two-node one
    (what the README's `ray start --head` / `ray start --address` gives, made by Ray's test
    utility: two raylets on this machine, one CPU each), which a study joins with
    `--address`, with no change to the study. The first run is the command line; the join,
    the run again and the refusal call its main in this process."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    study = _searched(tmp_path)
    out = tmp_path / "study"
    ray_tmp = pathlib.Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's sockets
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp))
    cluster = None
    try:
        os.environ["RAY_TMPDIR"] = str(ray_tmp)  # the two-node cluster's session there too
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        ray.shutdown()
        assert len(nodes) == 2
        running = set(ray_tmp.glob("**/session_2*"))
        # without --address, a cluster of its own, not the one running here (ray.init's
        # default would join it, and refuse --workers)
        first = _study_command(study, out, "--workers", "2", "--seeds", "1", env=env)
        assert first.returncode == 0, first.stderr[-3000:]
        local = set(ray_tmp.glob("**/session_2*")) - running
        (tmp_path / "small").mkdir()
        small = _study(tmp_path / "small", arms={"a": {"preset": "synthetic"}}, published=[])
        code, _, err = _study_main(capsys, small, tmp_path / "j", "--seeds", "1",
                                   "--address", cluster.address)
        assert code == 0, err[-3000:]
        after = set(ray_tmp.glob("**/session_2*")) - running - local
    finally:
        os.environ.pop("RAY_TMPDIR", None)
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert len(running) == 1
    assert len(local) == 1, local  # the search's draws and the arms' trials: one session
    assert not after  # --address: the running cluster's session
    assert "| a | - | 1 of 1 |" in (tmp_path / "j" / "results.md").read_text()
    assert "2 trials in" in first.stdout and "0 done before" in first.stdout
    searched = sorted((out / "searches" / "s").glob("trial_*"))
    assert [r.name for r in searched] == ["trial_000", "trial_001"]
    valid = {r.name: json.loads((r / "metrics.json").read_text())["valid_perplexity"]
             for r in searched}
    best = min(valid, key=valid.get)
    draw = json.loads((out / "searches" / "s" / best / "sample.json").read_text())["values"]
    runs = sorted((out / "trials").iterdir())
    assert [r.name for r in runs] == ["a__seed1", "s__seed1"]
    config = json.loads((runs[1] / "config.json").read_text())
    assert config["model"]["hidden_dim"] == draw["model.hidden_dim"]
    assert config["model"]["dropout"] == draw["model.dropout"]
    assert config["training"]["lr"] == 2.0  # the arm's, not the draw's
    stamps = {r.name: (r / "metrics.json").stat().st_mtime_ns for r in runs + searched}
    table = (out / "results.md").read_text()
    assert "| a | - | 1 of 1 |" in table and "| s | - | 1 of 1 |" in table
    assert f"Chosen: {best} (validation perplexity {valid[best]:.2f})" in table
    assert "| `model.dropout` |" in table and (out / "curves.png").stat().st_size > 0
    assert (out / "engine").is_dir()  # Tune's records: the trials ran on Ray
    code, printed, err = _study_main(capsys, study, out, "--workers", "2", "--seeds", "1")
    assert code == 0, err[-3000:]
    assert "2 done before, 0 to resume, 0 new" in printed
    assert {r.name: (r / "metrics.json").stat().st_mtime_ns for r in runs + searched} == stamps
    code, _, err = _study_main(capsys, study, out)  # both seeds: another study's folder
    assert code == 2 and "resume it with its own command" in err
    assert sorted(r.name for r in (out / "trials").iterdir()) == ["a__seed1", "s__seed1"]


def test_a_missing_corpus_or_engine_stops_before_any_trial(tmp_path, capsys, monkeypatch):
    """In this process: no corpus where TFLM_DATA_DIR points, and a Ray that cannot be
    imported (None in sys.modules makes `import ray` raise ImportError, as where the extra
    is not installed)."""
    study = _study(tmp_path, arms={"a": {"preset": "awd_lstm_ptb"}}, published=[],
                   scales={"smoke": {"seeds": [1, 2], "set": {"training.epochs": 1}}})
    with monkeypatch.context() as patch:
        patch.setenv("TFLM_DATA_DIR", str(tmp_path / "empty"))
        code, _, err = _study_main(capsys, study, tmp_path / "s")
    assert code == 2 and "ptb" in err.lower()
    assert not (tmp_path / "s" / "trials").exists()
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, err = _study_main(capsys, _study(tmp_path), tmp_path / "t")
    assert code == 2 and "pip install 'tflm[study]'" in err
    assert not any((tmp_path / "t" / "trials").iterdir())


@pytest.mark.slow
def test_a_study_stopped_midway_resumes_and_skips_what_finished(tmp_path):
    """Ctrl-C (SIGINT) once the first trial finished, one worker; the same command again
    trains the rest and leaves the finished trial's folder as it was."""
    pytest.importorskip("ray")
    study, out = _study(tmp_path), tmp_path / "study"
    proc = subprocess.Popen([sys.executable, "-m", "zoo.study", str(study), "--scale", "smoke",
                             "--out", str(out), "--workers", "1"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while time.time() < deadline and not list(out.glob("trials/*/metrics.json")):
        time.sleep(1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=300)
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("trials/*/metrics.json")}
    assert 1 <= len(finished) < 4
    again = _study_command(study, out, "--workers", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(finished)} done before" in again.stdout
    assert len(list(out.glob("trials/*/metrics.json"))) == 4
    assert {name: (out / "trials" / name / "metrics.json").stat().st_mtime_ns
            for name in finished} == finished


@pytest.mark.slow
@pytest.mark.parametrize("name", list_studies())
def test_every_bundled_study_runs_at_smoke_scale(tmp_path, name):
    pytest.importorskip("ray")
    from tflm.data import CorpusNotFoundError
    from zoo.runs.corpora import load_data
    for corpus in {json.dumps(t.config["corpus"], sort_keys=True)
                   for t in plan(load_study(name), "smoke")}:
        try:
            load_data(json.loads(corpus), None)
        except CorpusNotFoundError as err:  # WikiText-2's training split, on this machine
            pytest.skip(f"{name}: a corpus its trials train on is not here ({err})"[:300])
    result = _study_command(name, tmp_path / "s", "--workers", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = plan(load_study(name), "smoke")
    assert all((tmp_path / "s" / "trials" / t.name / "metrics.json").is_file() for t in trials)


def test_the_readme_study_commands_parse_and_name_bundled_studies():
    """The README's `python -m zoo.study` lines: flags the command takes, studies that exist
    (the smoke line runs in `test_every_bundled_study_runs_at_smoke_scale`)."""
    import shlex

    from zoo.study import build_parser
    lines = [line.split("#")[0] for line in (REPO / "README.md").read_text().splitlines()
             if line.startswith("python -m zoo.study")]
    assert len(lines) >= 3
    for line in lines:
        args = build_parser().parse_args(shlex.split(line)[3:])
        assert args.study in list_studies(), line


def test_a_trial_run_again_continues_its_folder_from_the_last_checkpoint(tmp_path,
                                                                         monkeypatch):
    """What Tune's retry runs (`engine.train_trial`, in-process here): a trial stopped after
    its first epoch's checkpoint resumes from it and ends with both epochs; a finished one
    is left alone."""
    from tests.zoo.killed_trial import kill_after_first_checkpoint
    from zoo.studies import engine
    study = load_study(_study(tmp_path, arms={"a": {"preset": "synthetic"}}, published=[],
                              scales={"smoke": {"seeds": [1, 2],
                                                "set": {**TINY, "training.epochs": 2}}}))
    trial = plan(study, "smoke")[0]
    path = tmp_path / "trials" / trial.name
    plans = {trial.name: (trial.config, str(path))}
    kill_after_first_checkpoint(monkeypatch, trial.name, trial.config, path)
    assert engine.run_state(path) == "interrupted"
    assert engine.train_trial({"trial": trial.name}, plans, None) == {"state": "finished",
                                                                     "error": ""}
    metrics = json.loads((path / "metrics.json").read_text())
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]
    stamp = (path / "metrics.json").stat().st_mtime_ns
    assert engine.train_trial({"trial": trial.name}, plans, None) == {"state": "finished",
                                                                     "error": ""}
    assert (path / "metrics.json").stat().st_mtime_ns == stamp


def test_the_workers_priority_is_the_users_where_they_set_one(monkeypatch):
    """Ray starts workers at niceness 15 unless told otherwise; beside any busy process a
    trial then crawls. The engine's local cluster starts them at the driver's (a cluster's
    workers checked in tests/zoo/test_search.py, on the search's); a value the user set is
    theirs, and a joined cluster keeps its own."""
    from zoo.studies import engine
    monkeypatch.delenv(engine.NICENESS_ENV, raising=False)
    with engine._worker_priority(None):
        assert os.environ[engine.NICENESS_ENV] == "0"
    assert engine.NICENESS_ENV not in os.environ
    monkeypatch.setenv(engine.NICENESS_ENV, "7")
    with engine._worker_priority(None):
        assert os.environ[engine.NICENESS_ENV] == "7"
    with engine._worker_priority("10.0.0.1:6379"):
        assert os.environ[engine.NICENESS_ENV] == "7"


def test_a_cluster_that_cannot_be_joined_is_one_user_error_naming_the_token(tmp_path,
                                                                            monkeypatch):
    """ray.init's ConnectionError (no cluster there, or a token-protected one) becomes the
    error that says what to check; nothing trains. (ray.init itself is replaced: a real
    refusal takes Ray a minute of retries.)"""
    ray = pytest.importorskip("ray")
    from zoo.errors import UserError
    from zoo.studies import engine

    def refuse(**kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}")

    monkeypatch.setattr(ray, "init", refuse)
    trial = plan(load_study(_study(tmp_path)), "smoke")[0]
    with pytest.raises(UserError, match="RAY_AUTH_MODE=token") as err:
        engine.run_trials([(trial.name, trial.config, tmp_path / trial.name)],
                          tmp_path / "engine", address="10.0.0.9:6379")
    assert "could not join the Ray cluster at 10.0.0.9:6379" in str(err.value)
    assert not (tmp_path / trial.name).exists()
