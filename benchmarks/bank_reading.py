"""Any setting's reading on a committed tuning bank: its GenPPL over official's curve at its entropy, with the keep
test's cluster bootstrap interval, from the scored runs of a parts folder (nothing is sampled or scored again).

    python benchmarks/bank_reading.py benchmarks/results/tuning-parts/langflow-small-nfe8 --nfe 8 \
        --spec '{"scheduler": "untied", "eta_r": 2.5, "eta_t": 2.5, "eta_o": 1.0, "alpha": 1.0}'

The tuning record (`tuning_by_steps` in a scheduler config) keeps every candidate's point reading; this adds the
interval of any candidate, e.g. the search's start, which the record does not test. `--call` names pipeline-call
arguments the run was made with (a temperature); the official curve is every official run of that NFE in the folder.
Prints one JSON object.
"""

import argparse
import json
import sys
from pathlib import Path

from untied_sc.generation.sampling import diversity_knob, resampling_clusters
from untied_sc_lab.tuning.search import KNOB_DEFAULTS, BankRun, Candidate, OfficialCurve, keep_test
from untied_sc_lab.tuning.tune import run_key


def load_parts(folder: Path, nfe: int) -> tuple[dict, dict[str, dict]]:
    """The bank's header and its runs at `nfe`, keyed as the tuner keys them."""
    header_path = folder / "bank.json"
    if not header_path.is_file():
        raise SystemExit(f"{header_path}: not found; pass a folder that `untied-sc tune --parts-dir` wrote.")
    header = json.loads(header_path.read_text())
    runs = {}
    for path in sorted(folder.glob(f"nfe{nfe}-*.json")):
        record = json.loads(path.read_text())
        runs[run_key(nfe, record["spec"], record["call"])] = record
    if not runs:
        raise SystemExit(f"{folder}: no scored runs at NFE {nfe} (files nfe{nfe}-*.json).")
    return header, runs


def official_curve(header: dict, runs: dict[str, dict]) -> OfficialCurve:
    """Official's runs in the folder, ordered by the family's diversity knob."""
    knob = diversity_knob(header["protocol"])
    points = sorted(
        (float(record["call"].get(knob, KNOB_DEFAULTS[knob])), BankRun.from_json(record["run"]))
        for record in runs.values()
        if record["spec"] == {"scheduler": "official"} and set(record["call"]) <= {knob}
    )
    if len(points) < 2:
        raise SystemExit(f"the folder holds {len(points)} official run(s); a curve needs at least 2.")
    return OfficialCurve(knob, [value for value, _ in points], [run for _, run in points])


def reading(folder: Path, nfe: int, spec: dict, call: dict) -> dict:
    header, runs = load_parts(folder, nfe)
    record = runs.get(run_key(nfe, spec, call))
    if record is None:
        tried = sorted(
            {
                json.dumps(r["spec"], sort_keys=True)
                for r in runs.values()
                if r["spec"]["scheduler"] == spec.get("scheduler")
            }
        )
        raise SystemExit(
            f"{folder}: no run at NFE {nfe} with spec {json.dumps(spec)} and call {json.dumps(call)}. "
            f"Runs of that scheduler: {', '.join(tried) or 'none'}."
        )
    curve = official_curve(header, runs)
    clusters = resampling_clusters(header["protocol"], header["num_samples"], header["batch_size"])
    candidate = Candidate(dict(spec), BankRun.from_json(record["run"]), None, "read")
    comparison, kept = keep_test(candidate, curve, clusters)
    raw = candidate.run.gen_ppl / curve.default.gen_ppl
    return {
        "parts": str(folder),
        "nfe": nfe,
        "spec": spec,
        "call": call,
        "official": curve.default.scores(),
        "raw_ratio": raw,
        **comparison,
        "interval_below_1": kept,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts", type=Path, help="a tuning parts folder (bank.json and nfe<N>-<key>.json files)")
    parser.add_argument("--nfe", type=int, required=True)
    parser.add_argument(
        "--spec", type=json.loads, required=True, help='the sampler spec, e.g. \'{"scheduler": "official"}\''
    )
    parser.add_argument("--call", type=json.loads, default={}, help="pipeline-call arguments of the run (JSON)")
    args = parser.parse_args(argv)
    json.dump(reading(args.parts, args.nfe, args.spec, args.call), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
