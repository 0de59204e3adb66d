"""Sampling split across processes: shards by batch index, gathered in batch order, and `untied-sc generate`
/ `benchmark --generate-only --store DIR` under 2 CPU processes writing exactly the 1-process samples.

The 2-process runs use torchrun (`python -m torch.distributed.run`), the launcher `accelerate launch` itself uses for
several processes: `accelerate launch --cpu --num_processes 2` starts a single process on a one-machine CPU setup.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import untied_sc
from untied_sc import ELFPipeline, ELFScheduler, UntiedSelfConditioningScheduler
from untied_sc.cli import main
from untied_sc.distributed import batch_shard, gather_in_order, shard_batches, slowest_process_seconds
from untied_sc.generation import Sample, read_samples, write_samples
from untied_sc.generation.sampling import batch_seed

from .conftest import elf_from_golden
from .tiny import random_statistics, tiny_tokenizer


SOURCE = str(Path(untied_sc.__file__).resolve().parents[1])  # the package the subprocesses must import


def torchrun(*argv: str, processes: int = 2) -> subprocess.CompletedProcess:
    """Runs `python -m torch.distributed.run --nproc_per_node N ARGV` (CPU processes, a gloo process group)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SOURCE, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *argv]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def saved(tmp_path_factory, elf_golden):
    """A tiny ELF pipeline (one random time grid per batch: the randomness the shards must keep) running the untied
    sampler, with statistics at NFE 8 (random moments, recorded as calibrated on seed 2000's banks 4000 and 4001)."""
    folder = tmp_path_factory.mktemp("distributed") / "tiny-elf"
    model = elf_from_golden(elf_golden)
    statistics = random_statistics(model, "elf", steps=(8,))
    statistics.register_to_config(seeds={"8": [4000, 4001]})
    scheduler = UntiedSelfConditioningScheduler.from_config(ELFScheduler().config, coefficients="elf-b")
    ELFPipeline(model, scheduler, tiny_tokenizer(), sampler_statistics=statistics).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("num_processes", [1, 2, 3, 4])
def test_shards_partition_the_batches_whatever_the_number_of_processes(num_processes):
    for num_batches in range(10):
        shards = [list(batch_shard(num_batches, rank, num_processes)) for rank in range(num_processes)]
        assert sorted(b for shard in shards for b in shard) == list(range(num_batches))  # each batch exactly once
        assert all(b % num_processes == rank for rank, shard in enumerate(shards) for b in shard)
        assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    assert list(shard_batches(5)) == [0, 1, 2, 3, 4]  # no state: one process does everything


def test_a_shard_of_a_process_that_does_not_exist_is_an_error():
    with pytest.raises(ValueError, match="Process 2 of 2"):
        batch_shard(4, 2, 2)
    with pytest.raises(ValueError, match="Process 0 of 0"):
        batch_shard(4, 0, 0)


def test_gather_in_order_orders_by_batch_index_and_refuses_missing_or_repeated_batches():
    assert gather_in_order({2: "c", 0: "a", 1: "b"}) == ["a", "b", "c"]
    assert gather_in_order({}) == []
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        gather_in_order({0: "a", 2: "c"})


def test_a_sharded_run_takes_as_long_as_its_slowest_process():
    seconds = [1.0, 2.0, 4.0, 8.0, 16.0]
    assert slowest_process_seconds(seconds, 1) == sum(seconds)
    assert slowest_process_seconds(seconds, 2) == max(1.0 + 4.0 + 16.0, 2.0 + 8.0)
    assert slowest_process_seconds(seconds, 8) == 16.0  # processes with no batch take no time
    assert slowest_process_seconds([], 2) == 0.0


def test_two_processes_gather_every_batch_in_order_and_only_the_main_one_writes(tmp_path):
    script = tmp_path / "gather.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            from untied_sc.distributed import gather_in_order, is_main_process, process_state, shard_batches

            state = process_state("cpu")
            mine = {{b: (b, state.process_index) for b in reversed(shard_batches(7, state))}}
            gathered = gather_in_order(mine, state)
            if is_main_process(state):
                with open({str(tmp_path / "out")!r} + str(state.process_index), "w") as handle:
                    json.dump([state.num_processes, gathered], handle)
            """
        )
    )
    torchrun(str(script))
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("out")] == ["out0"]
    num_processes, gathered = json.loads((tmp_path / "out0").read_text())
    assert num_processes == 2
    assert gathered == [[b, b % 2] for b in range(7)]  # every batch once, in order, each from the process it was dealt


def generate_argv(saved, out, *extra):
    argv = ["generate", str(saved), "--nfe", "8", "--num-samples", "3", "--batch-size", "1", "--seed", "3"]
    return [*argv, "--device", "cpu", "--no-progress", "--out", str(out), *extra]


def test_generate_with_two_processes_writes_the_one_process_samples_in_the_same_order(tmp_path, saved, capsys):
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main(generate_argv(saved, one)) == 0
    assert f"Wrote 3 untied samples (NFE 8, seed 3) to {one}" in capsys.readouterr().out
    done = torchrun("-m", "untied_sc.cli", *generate_argv(saved, two))
    assert done.stdout.count("Wrote 3 untied samples") == 1 and "2 processes" in done.stdout  # the main process only
    assert two.read_text() == one.read_text()  # bit for bit: same lines, same order (3 batches, dealt 0 2 | 1)

    lines = [json.loads(line) for line in one.read_text().splitlines()]
    assert [line["index"] for line in lines] == [line["batch"] for line in lines] == [0, 1, 2]
    assert [line["batch_seed"] for line in lines] == [batch_seed(3, b) for b in (0, 1, 2)]
    assert {(line["seed"], line["sampler"], line["nfe"]) for line in lines} == {(3, "untied", 8)}  # the pipeline's
    assert all(isinstance(line["text"], str) and line["ids"] for line in lines)
    assert len({tuple(line["ids"]) for line in lines}) > 1  # the batches differ: their seeds were used


def test_generate_refuses_an_existing_output_and_a_calibration_seed_before_sampling(tmp_path, saved, capsys):
    out = tmp_path / "samples.jsonl.gz"
    out.write_text("earlier samples\n")
    assert main(generate_argv(saved, out)) == 2
    assert "--overwrite" in capsys.readouterr().err and out.read_text() == "earlier samples\n"

    argv = generate_argv(saved, out, "--overwrite")
    argv[argv.index("--seed") + 1] = "4000"  # a calibration bank of the statistics
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "[4000]" in error and "leak" in error and "other --seed " in error
    assert out.read_text() == "earlier samples\n"

    assert main(generate_argv(saved, out, "--overwrite")) == 0  # replaced, gzip-compressed as the name says
    assert [sample.extra["index"] for sample in read_samples(out)] == [0, 1, 2]


def benchmark_argv(saved, store):
    argv = ["benchmark", str(saved), "--nfe", "8", "--seeds", "3", "--num-samples", "3", "--batch-size", "1"]
    return [*argv, "--generate-only", "--store", str(store), "--device", "cpu", "--no-progress"]


def test_benchmark_generate_only_with_two_processes_writes_the_one_process_generation(tmp_path, saved):
    from untied_sc_lab.experiments import read_stored_sweeps
    from untied_sc_lab.runs.store import RunStore

    assert main(benchmark_argv(saved, tmp_path / "one")) == 0
    done = torchrun("-m", "untied_sc.cli", *benchmark_argv(saved, tmp_path / "two"))
    assert done.stdout.count("Sampled 6 samples in 2 runs") == 1  # printed by the main process only
    stores = [RunStore(tmp_path / d) for d in ("one", "two")]
    [(one_path, one, one_keys)], [(two_path, two, two_keys)] = (store.sweeps() for store in stores)
    assert one_path.name == two_path.name and one_keys == two_keys  # the same part of the same sweep
    drawn = [[(stored.texts, stored.ids) for stored in map(store.samples, one_keys)] for store in stores]
    assert len(one_keys) == 2 and drawn[1] == drawn[0]  # every run's texts and token ids
    assert (one["num_processes"], two["num_processes"]) == (1, 2)
    assert two["device"] == "cpu, 2 processes"
    assert {**two["store"], "folder": None} == {**one["store"], "folder": None}  # what each sampled into its store
    for generation in (one, two):  # all else is the same: settings, coefficients, runs
        del generation["seconds"], generation["num_processes"], generation["device"], generation["command"]
        del generation["store"]
        for run in generation["runs"]:
            del run["seconds"]
    assert two == one

    # the benchmark's untied run is what `untied-sc generate` writes for the same seed and batch size
    assert main(generate_argv(saved, tmp_path / "generated.jsonl")) == 0
    [untied] = [run for run in read_stored_sweeps(RunStore(tmp_path / "one")).runs if run.sampler == "untied"]
    generated = [json.loads(line) for line in (tmp_path / "generated.jsonl").read_text().splitlines()]
    assert [(s["text"], s["ids"], s["batch"]) for s in generated] == [(s.text, s.ids, s.batch) for s in untied.samples]


def test_evaluate_with_two_processes_writes_the_one_process_scores_of_a_report(tmp_path):
    # Both runs under torchrun, so that both processes compute with the same number of threads; the file is scored
    # run by run (four distinct runs dealt 0 2 | 1 3, and a fifth that repeats the first's texts).
    from .test_evaluation import EOS, VOCAB_SIZE, tiny_evaluator_tokenizer
    from .tiny import tiny_llama

    folder = tmp_path / "evaluator"
    tiny_llama(VOCAB_SIZE, EOS).save_pretrained(folder)
    tiny_evaluator_tokenizer().save_pretrained(folder)
    words = [f"w{i}" for i in range(2, VOCAB_SIZE)]
    samples = [
        Sample(
            " ".join(words[(3 * run + b) % 20 : (3 * run + b) % 20 + 2 + b]),
            seed=seed,
            batch=b,
            sampler=sampler,
            nfe=8,
        )
        for run, (sampler, seed) in enumerate([("official", 0), ("official", 1), ("untied", 0), ("untied", 1)])
        for b in range(3)
    ]
    samples += [Sample(s.text, seed=s.seed, batch=s.batch, sampler="ACE", nfe=8) for s in samples[:3]]
    path = write_samples(tmp_path / "report.samples.jsonl.gz", samples)
    argv = ["-m", "untied_sc.cli", "evaluate", str(path), "--evaluator", str(folder), "--protocol", "elf"]
    one = torchrun(*argv, "--output", str(tmp_path / "one.json"), processes=1)
    parts = ["--store", str(tmp_path / "store")]  # each process keeps the runs it scores
    two = torchrun(*argv, *parts, "--output", str(tmp_path / "two.json"))
    assert two.stdout.count("Wrote") == 1 and two.stdout.count("sampler ACE, nfe 8, seed 0: elf GenPPL") == 1
    assert f"{tmp_path / 'store'}: scores of 0 runs read, 4 runs scored here and kept" in two.stdout
    assert (tmp_path / "two.json").read_text() == (tmp_path / "one.json").read_text()
    again = torchrun(*argv, *parts, "--output", str(tmp_path / "again.json"), processes=1)
    assert f"{tmp_path / 'store'}: scores of 4 runs read, 0 runs scored here and kept" in again.stdout
    assert (tmp_path / "again.json").read_text() == (tmp_path / "one.json").read_text()
    written = json.loads((tmp_path / "one.json").read_text())["runs"]
    assert [(run["run"]["sampler"], run["run"]["seed"]) for run in written] == [
        ("official", 0),
        ("official", 1),
        ("untied", 0),
        ("untied", 1),
        ("ACE", 0),
    ]
    assert len({run["gen_ppl"] for run in written}) == 4 and written[4]["gen_ppl"] == written[0]["gen_ppl"]
    assert one.stdout.count("Wrote") == 1
