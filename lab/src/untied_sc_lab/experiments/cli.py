"""The evaluation commands: `untied-sc evaluate` and `untied-sc benchmark`.

- `evaluate` scores a samples file (GenPPL, entropy, Rep-4, distinct-n), optionally paired with a baseline
  (`evaluate_cli.py`);
- `benchmark` runs the matched sweep ([`run_sweep`], or one half of it: `--generate-only --store DIR`, then
  `--store DIR` alone) and prints its Markdown report; `--rescore` scores a report's samples again under another evaluator ([`rescore_report`])
  (`benchmark_cli.py`; its options `benchmark_options.py`, its refusals `benchmark_checks.py`).

The top-level CLI registers them with `register_evaluate_command(commands)` and `register_benchmark_command(commands)`
(or `add_<name>_arguments` plus `set_defaults(handler=<name>_command)`).
"""

from .benchmark_cli import benchmark_command, register_benchmark_command
from .benchmark_options import add_benchmark_arguments, benchmark_command_line
from .cli_help import EVAL_BATCH_HELP, EVALUATOR_DTYPE_HELP, EVALUATOR_HELP
from .evaluate_cli import add_evaluate_arguments, evaluate_command, format_result, register_evaluate_command


__all__ = [
    "EVALUATOR_DTYPE_HELP",
    "EVALUATOR_HELP",
    "EVAL_BATCH_HELP",
    "add_benchmark_arguments",
    "add_evaluate_arguments",
    "benchmark_command",
    "benchmark_command_line",
    "evaluate_command",
    "format_result",
    "register_benchmark_command",
    "register_evaluate_command",
]
