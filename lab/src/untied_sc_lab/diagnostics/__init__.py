"""`untied-sc diagnose`: the paper's diagnostic measurements on a pipeline.

- [`coupling`]: the coupling experiment (paper Section "Does correlation across sampling steps change a fixed
  self-conditioning update?", Appendix "coupling protocol"): α*(ρ) and the risk ratio of coefficient 1 vs 0.
- [`step_scaling`]: the step-average scaling experiment (Appendix "reference experiments"): fitted log-log exponents
  of the correction C*_k and of its latent contribution against the step width h_k.
- [`innovation`]: the overlap energy E(m) (eqs. (overlap_energy), (weighted_projection_energy)) of the
  self-conditioning input under each transform assignment (Appendix "spectrum protocol").

The package's `__init__` imports nothing (the `untied-sc` parser imports [`cli`]); each module imports torch itself.
"""
