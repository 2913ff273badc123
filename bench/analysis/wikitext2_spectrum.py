"""The full WikiText-2 test spectrum: all 33,278 singular values of a 245,569 x 33,278 Q_theta.

The thesis truncated WikiText-2 to its first 33,320 contexts because the whole matrix
(245,569 x 33,278, 32.7 GB in float32) did not fit (Parthiban 2020 thesis §4.3.3). This
benchmark runs the user's two commands on the whole test split and reports their time and
peak memory:

    python -m tools.qmatrix RUN/best.keras --corpus wikitext-2 --split test --out Q.npy
    python -m tools.rank Q.npy --progress --json rank.json --save-spectrum spectra/ --plot wt2

`tools.qmatrix` streams the rows to a memory-mapped .npy (batch-1 semantics); `tools.rank`'s
default method picks the streamed Gram route for a file that size (float64 G = Q^T Q, 8.9 GB,
then `eigh`), so the peak stays near one N x N float64 matrix.

The WikiText-2 training split is not on these machines, so the model (the `awd_lstm_wt2`
preset's shape: V = 33,278, embedding 400, 3 x 1150 LSTM, tied softmax) is trained here on
the first 90 % of the WikiText-2 *valid* split, as far as the time allows (one epoch of
`--train-tokens`), in a corpus directory whose `vocab.txt` fixes the vocabulary at 33,278 words:
the 18,328 words of valid and test in order of first appearance, then `<unused-k>` fillers
that no split contains (their columns are trained towards probability 0, like rare words). The
test split is the real WikiText-2 test file. A user with the real model passes `--model` and
`--corpus wikitext-2`: then only the export and the rank stages run, with the commands above.

Each stage is a subprocess of its own; its wall time and peak resident memory (`wait4`) are
recorded in `<work>/stages.json`, and a stage whose output exists is not run again (a killed
run resumes at the stage it was in). Run it as a benchmark, not in CI: on the 2-core CPU it
takes hours and 33 GB of disk. Writes the stage table and the rank report to
results/wikitext2_spectrum.md and the spectrum plots to results/wikitext2_spectrum_*.png
beside this script (`bench.harness.publish`).

    python -m bench.analysis.wikitext2_spectrum --work /tmp/wt2-spectrum [--threads 2]
"""

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

from bench.harness import REPO, publish, results_path
from tflm.data.corpus import read_split
from tflm.data.vocabulary import Vocabulary

WT2_VOCAB = 33_278
STAGES = ("prepare", "train", "export", "rank")


def prepare_corpus(data_dir, out, train_fraction=0.9, vocab_size=WT2_VOCAB):
    """Write out/{train,valid,test}.txt and out/vocab.txt; return a description dict."""
    src = pathlib.Path(data_dir) / "wikitext-2"
    lines = (src / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    cut = int(len(lines) * train_fraction)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_text("".join(lines[:cut]), encoding="utf-8")
    (out / "valid.txt").write_text("".join(lines[cut:]), encoding="utf-8")
    (out / "test.txt").write_text((src / "test.txt").read_text(encoding="utf-8"),
                                  encoding="utf-8")
    seen = {}  # word -> id, in order of first appearance over train, valid, test
    for split in ("train", "valid", "test"):
        read_split(out / f"{split}.txt", seen)
    if len(seen) > vocab_size:
        raise SystemExit(f"the valid and test splits have {len(seen)} words, more than "
                         f"{vocab_size}")
    fillers = [f"<unused-{k}>" for k in range(vocab_size - len(seen))]
    Vocabulary(list(seen) + fillers).save(out / "vocab.txt")
    return {"words_in_splits": len(seen), "fillers": len(fillers), "train_lines": cut,
            "valid_lines": len(lines) - cut}


def run_stage(argv, log_path, env):
    """Run argv, its output to log_path; (seconds, peak RSS MiB) of that process tree's
    largest member as wait4 reports it. Raises SystemExit when it fails."""
    print("$", " ".join(shlex.quote(a) for a in argv), flush=True)
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"stage failed ({os.waitstatus_to_exitcode(status)}); see {log_path}")
    return seconds, usage.ru_maxrss / 1024.0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="/tmp/tflm-wt2-spectrum", help="working directory")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--model", help="a trained .keras WikiText-2 model (skips prepare, train)")
    p.add_argument("--corpus", help="corpus of the export (default: the prepared directory; "
                                    "wikitext-2 with --model)")
    p.add_argument("--train-tokens", type=int, default=60_000,
                   help="training tokens of the one epoch (default 60,000)")
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--threads", type=int, default=2, help="BLAS / framework threads")
    p.add_argument("--results", default=str(results_path(__file__, "wikitext2_spectrum.md")))
    args = p.parse_args(argv)
    work = pathlib.Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    record_path = work / "stages.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               TF_NUM_INTRAOP_THREADS=str(args.threads), TF_NUM_INTEROP_THREADS="1",
               PYTHONPATH=str(REPO))
    py = sys.executable

    def save():
        record_path.write_text(json.dumps(record, indent=2))

    corpus_dir = work / "corpus"
    model = pathlib.Path(args.model).resolve() if args.model else work / "run" / "best.keras"
    if not args.model and "prepare" not in record:
        record["prepare"] = prepare_corpus(args.data_dir, corpus_dir)
        save()
    if not args.model and "train" not in record:
        argv_train = [py, "-m", "zoo.train", "--preset", "awd_lstm_wt2", "--corpus",
                      str(corpus_dir), "--epochs", "1", "--batch-size", str(args.batch_size),
                      "--out", str(work / "run"), "--quiet",
                      "--set", f"corpus.max_train_tokens={args.train_tokens}",
                      "--set", "training.final_evaluation.test_batch_size=80"]
        seconds, peak = run_stage(argv_train, work / "train.log", env)
        metrics = json.loads((work / "run" / "metrics.json").read_text())
        record["train"] = {"seconds": seconds, "peak_mib": peak, "argv": argv_train[1:],
                           "valid_perplexity": metrics.get("valid_perplexity"),
                           "words_per_second": metrics.get("words_per_second")}
        save()
    q_path = work / "Q.npy"
    corpus = args.corpus or ("wikitext-2" if args.model else str(corpus_dir))
    if "export" not in record:
        argv_export = [py, "-m", "tools.qmatrix", str(model), "--corpus", corpus,
                       "--data-dir", args.data_dir, "--split", "test", "--out", str(q_path)]
        seconds, peak = run_stage(argv_export, work / "export.log", env)
        meta = json.loads(pathlib.Path(str(q_path) + ".json").read_text())
        record["export"] = {"seconds": seconds, "peak_mib": peak, "argv": argv_export[1:],
                            "shape": meta.get("shape"), "perplexity": meta.get("perplexity"),
                            "bytes": q_path.stat().st_size}
        save()
    if "rank" not in record:
        argv_rank = [py, "-m", "tools.rank", str(q_path), "--labels", "wt2_test",
                     "--progress", "--json", str(work / "rank.json"), "--save-spectrum",
                     str(work / "spectra"), "--plot",
                     str(results_path(__file__, "wikitext2_spectrum"))]
        seconds, peak = run_stage(argv_rank, work / "rank.log", env)
        record["rank"] = {"seconds": seconds, "peak_mib": peak, "argv": argv_rank[1:],
                          "report": json.loads((work / "rank.json").read_text())["reports"][0]}
        save()
    write_results(record, args, pathlib.Path(args.results))


def write_results(record, args, path):
    """Write the stage table and the rank report as the results file."""
    rows = ["| stage | command | minutes | peak RSS GiB |", "| --- | --- | ---: | ---: |"]
    for stage in ("train", "export", "rank"):
        if stage in record:
            r = record[stage]
            cmd = "python " + " ".join(pathlib.Path(a).name if a.endswith(".keras") else a
                                       for a in r["argv"])
            rows.append(f"| {stage} | `{cmd}` | {r['seconds'] / 60:.1f} | "
                        f"{r['peak_mib'] / 1024:.2f} |")
    rep = record["rank"]["report"]
    eff = rep["effective_rank"]
    floor = "-" if rep.get("floor") is None else f"{rep['floor']:.3g}"
    ranks = ["| M x N | method | s_max | Press threshold | Press rank | numpy rank | "
             + " | ".join(f"eps-effective rank, eps = {k}" for k in eff) + " | resolved floor |",
             "| --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in eff)
             + " | ---: |",
             f"| {rep['shape'][0]:,} x {rep['shape'][1]:,} | {rep['method']} "
             f"({rep['compute_dtype']}) | {rep['s_max']:.6g} | {rep['press_threshold']:.4g} | "
             f"{rep['press_rank']} | {rep['numpy_rank']} | "
             + " | ".join(f"{v:,}" for v in eff.values()) + f" | {floor} |"]
    lines = [f"{args.threads} threads; the stages ran at nice 19 beside other work. Peak RSS: "
             "each stage process's high-water mark (`wait4`).", ""]
    if "train" in record:
        t = record["train"]
        lines += [f"Model: the `awd_lstm_wt2` shape trained one epoch on the first "
                  f"{args.train_tokens:,} tokens of the WikiText-2 valid split (module "
                  f"docstring): valid perplexity {t['valid_perplexity']:.1f} on the last 10 % "
                  f"of that split, {t['words_per_second']:.0f} training words/s; perplexity "
                  f"of the exported rows (the test split at batch 1): "
                  f"{record['export']['perplexity']:.1f}.", ""]
    lines += rows + ["", f"Q on disk: {record['export']['bytes'] / 1e9:.1f} GB float32.", ""]
    lines += ranks + [""] + [f"Note: {n}" for n in rep.get("notes", ())]
    lines += ["", "Spectrum plots: results/wikitext2_spectrum_*.png.", ""]
    publish("Full WikiText-2 test spectrum", "\n".join(lines), path)


if __name__ == "__main__":
    main()
