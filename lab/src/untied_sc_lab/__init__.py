"""untied-sc's lab: experiments (matched sweeps, benchmarks, reports), evaluation (GenPPL, entropy, repetition, the
statistics of matched comparisons), tuning and search of the samplers' coefficients, diagnostics, the judge and the
bundled models' training. It imports only the public names of `untied_sc`."""

__version__ = "0.1.0.dev0"
