"""Protocols that drive simulations through ``Simulation``'s public API (``step``, ``state``/``set_state``,
``set_hparams``, ``elapsed``), above the algorithms layer:

* ``fpfc_path``: FPFC's warmup lambda path (Sec. 4.3) and a warm-started lambda grid (Fig. 1);
* ``async_fpfc``: asyncFPFC as an event scheduler over ``Simulation.step`` and synchronous FPFC on the same
  virtual clock (Fig. 8);
* ``newcomers``: each method's rule for clients that join after training (FPFC Sec. 6.4.2 / Table 3);
* ``fpfc_tables``: the per-cell protocols of the FPFC suites (``fedsolve suite experiments/fpfc/<x>.yaml``):
  lambda path, attack grid, newcomers, lambda tuning, baseline tuning, oracle gap;
* ``constrained_runs``: the per-cell protocol of the constrained paper's Tables 1 and 2
  (``fedsolve suite experiments/constrained/table{1,2}_suite.yaml``): one certificate per (dataset, n, method,
  seed), read from a finished ``fedsolve compare`` run when one exists.

The suite registry (``fedsolve.experiments.suite.builtin_protocols``) registers them on first use.
"""
