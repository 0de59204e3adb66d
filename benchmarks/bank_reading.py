"""Any setting's reading on a committed tuning bank: its GenPPL over official's curve at its entropy, with the keep
test's cluster bootstrap interval, from the scored bank runs of a run store (`untied-sc tune --store`, `benchmark
--experiment baselines --store`; nothing is sampled or scored again).

    python benchmarks/bank_reading.py benchmarks/results/tuning-parts/langflow-small-nfe8 --nfe 8 \
        --spec '{"scheduler": "untied", "eta_r": 2.5, "eta_t": 2.5, "eta_o": 1.0, "alpha": 1.0}'

The tuning record (`tuning_by_steps` in a scheduler config) keeps every candidate's point reading; this adds the
interval of any candidate, e.g. the search's start, which the record does not test. `--call` names pipeline-call
arguments the run was made with (a temperature); the official curve is every official run of that NFE in the store.
Prints one JSON object.
"""

import argparse
import json
import sys
from pathlib import Path

from untied_sc.generation import SamplerSpec
from untied_sc.generation.sampling import diversity_knob, resampling_clusters
from untied_sc_lab.runs.bank_run import BankRun
from untied_sc_lab.runs.store import HEADER, BankRunKey, RunStore, canonical
from untied_sc_lab.tuning.search import KNOB_DEFAULTS, Candidate, OfficialCurve, keep_test


OFFICIAL = SamplerSpec(scheduler="official")


def load_bank(folder: Path, nfe: int) -> tuple[dict, dict[tuple[str, str], tuple[BankRunKey, BankRun]]]:
    """The bank's fields ([`BankRunKey.bank`]) and its scored runs at `nfe`, keyed by their canonical spec and call."""
    if not (folder / HEADER).is_file():  # checked first: opening a missing folder as a store would make one
        raise SystemExit(f"{folder / HEADER}: not found; pass a run store that `untied-sc tune --store` wrote.")
    runs = {(key.spec, key.call): (key, run) for key, run in RunStore(folder).bank_runs() if key.nfe == nfe}
    if not runs:
        raise SystemExit(f"{folder}: no scored bank runs at NFE {nfe}.")
    banks = {canonical(key.bank()) for key, _ in runs.values()}
    if len(banks) > 1:
        raise SystemExit(
            f"{folder}: its runs at NFE {nfe} are of {len(banks)} banks ({'; '.join(sorted(banks))}); read one bank "
            "from a store that holds it alone."
        )
    return next(iter(runs.values()))[0].bank(), runs


def official_curve(bank: dict, runs: dict) -> OfficialCurve:
    """Official's runs in the store, ordered by the family's diversity knob."""
    knob = diversity_knob(bank["protocol"])
    points = []
    for key, run in runs.values():
        call = json.loads(key.call)
        if SamplerSpec.from_json(json.loads(key.spec)) == OFFICIAL and set(call) <= {knob}:
            points.append((float(call.get(knob, KNOB_DEFAULTS[knob])), run))
    points.sort(key=lambda point: point[0])
    if len(points) < 2:
        raise SystemExit(f"the store holds {len(points)} official run(s); a curve needs at least 2.")
    return OfficialCurve(knob, [value for value, _ in points], [run for _, run in points])


def reading(folder: Path, nfe: int, spec: dict, call: dict) -> dict:
    bank, runs = load_bank(folder, nfe)
    scheduler = SamplerSpec.from_json(spec, "--spec").scheduler
    found = runs.get((canonical(spec), canonical(call)))
    if found is None:
        tried = sorted(
            {
                json.dumps(json.loads(key.spec), sort_keys=True)
                for key, _ in runs.values()
                if SamplerSpec.from_json(json.loads(key.spec)).scheduler == scheduler
            }
        )
        raise SystemExit(
            f"{folder}: no run at NFE {nfe} with spec {json.dumps(spec)} and call {json.dumps(call)}. "
            f"Runs of that scheduler: {', '.join(tried) or 'none'}."
        )
    curve = official_curve(bank, runs)
    clusters = resampling_clusters(bank["protocol"], bank["num_samples"], bank["batch_size"])
    candidate = Candidate(dict(spec), found[1], None, "read")
    comparison, kept = keep_test(candidate, curve, clusters)
    raw = candidate.run.gen_ppl / curve.default.gen_ppl
    return {
        "parts": str(folder),
        "nfe": nfe,
        "spec": spec,
        "call": call,
        "official": curve.default.scores(),
        "raw_ratio": raw,
        **comparison.to_json(),
        "interval_below_1": kept,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="a run store holding one bank's scored runs (its banks/ entries)")
    parser.add_argument("--nfe", type=int, required=True)
    parser.add_argument(
        "--spec", type=json.loads, required=True, help='the sampler spec, e.g. \'{"scheduler": "official"}\''
    )
    parser.add_argument("--call", type=json.loads, default={}, help="pipeline-call arguments of the run (JSON)")
    args = parser.parse_args(argv)
    json.dump(reading(args.store, args.nfe, args.spec, args.call), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
