"""Regenerate the samples behind the committed reports that docs/results.md cites, and check they are the same samples.

Those reports were sampled on GPUs before reports kept their samples. Sampling again with the recorded command (same
seeds, batch size and coefficients) on the same kind of GPU gives the same samples; scoring them again on the CPU must
then give the committed per-sample NLLs, which this script checks before it replaces a report (the new report adds
the samples file, per-sample entropies and the subword repetition columns).

    python benchmarks/regenerate_samples.py sample --device cuda --work runs/regen   # on the GPU the report names
    python benchmarks/regenerate_samples.py score --work runs/regen                  # where the evaluator is

`--dry-run` prints the commands. A report whose re-scored NLLs differ is left untouched and reported.
"""

import argparse
import json
import shlex
import shutil
import subprocess
from pathlib import Path


RESULTS = Path("benchmarks/results")
# The reports docs/results.md cites.
CITED = (
    "langflow-small",
    "langflow-small-components-langflow-lm1b",
    "langflow-small-placement-langflow-lm1b",
    "langflow-small-sensitivity-langflow-lm1b",
    "elf-small",
    "elf-small-components-elf-b",
    "elf-small-diversity-decode-elf-b",
    "elf-small-placement-elf-b",
    "elf-small-sensitivity-elf-b",
)


def _without(words: list[str], option: str, takes_value: bool = True) -> list[str]:
    if option not in words:
        return words
    i = words.index(option)
    return words[:i] + words[i + 1 + takes_value :]


def sample_command(report: dict, work: Path, device: str) -> list[str]:
    """The report's own sampling command, sampled into the run store `work/store` with `--generate-only` on
    `device`."""
    words = shlex.split(report["command"])
    for option in ("--output-dir", "--device", "--store"):
        words = _without(words, option)
    words = _without(words, "--generate-only", takes_value=False)
    return [*words, "--generate-only", "--store", str(work / "store"), "--device", device]


def same_scores(old: dict, new: dict) -> bool:
    """Whether every run of `new` scores its samples as the committed run did (same per-sample NLLs)."""
    key = lambda run: (run["sampler"], run["nfe"], run["seed"], run.get(old["diversity_knob"]))  # noqa: E731
    committed = {key(run): run["per_sample"]["nll_sum"] for run in old["runs"]}
    for run in new["runs"]:
        before = committed.get(key(run))
        if before is None or len(before) != len(run["per_sample"]["nll_sum"]):
            return False
        if any(
            abs(a - b) > 1e-6 * max(1.0, abs(a)) for a, b in zip(before, run["per_sample"]["nll_sum"], strict=True)
        ):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=["sample", "score"])
    parser.add_argument("--work", type=Path, default=Path("runs/regen"), help="Folder of the run stores.")
    parser.add_argument("--device", default="cuda", help="Sampling device (sample phase).")
    parser.add_argument("--reports", nargs="+", default=list(CITED), help="Report names (default: the cited ones).")
    parser.add_argument("--dry-run", action="store_true", help="Print the commands only.")
    args = parser.parse_args()
    for name in args.reports:
        report = json.loads((RESULTS / f"{name}.json").read_text())
        work = args.work / name
        if args.phase == "sample":
            command = sample_command(report, work, args.device)
        else:
            scoring = shlex.split(report.get("scoring_command") or report["command"])
            options = ["--eval-batch-size", "8", "--num-resamples", "1000", "--dtype", "bfloat16"]
            command = ["untied-sc", "benchmark", "--store", str(work / "store"), "--output-dir", str(work / "scored")]
            command += ["--name", name, *options] + (["--main-only"] if "--main-only" in scoring else [])
        print(shlex.join(command))
        if args.dry_run:
            continue
        subprocess.run(command, check=True)
        if args.phase == "score":
            new = json.loads((work / "scored" / f"{name}.json").read_text())
            if not same_scores(report, new):
                print(f"{name}: re-scored NLLs differ from the committed report; left untouched ({work / 'scored'}).")
                continue
            for suffix in (".json", ".md", ".png", ".samples.jsonl.gz"):
                shutil.copyfile(work / "scored" / f"{name}{suffix}", RESULTS / f"{name}{suffix}")
            print(f"{name}: same samples as the committed report; report and samples replaced.")


if __name__ == "__main__":
    main()
