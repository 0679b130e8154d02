"""FPFC's protocols: schedules that the engine's one loop runs (``engine/schedules.py``), so evaluation, checkpoints,
``--resume`` and Ctrl-C cover them, and the suites' per-cell protocols built on them:

* ``path``: FPFC's warmup lambda path (Sec. 4.3, schedule ``warmup_path``) and a warm-started lambda grid
  (Fig. 1, schedule ``lambda_grid``);
* ``async_fpfc``: asyncFPFC's event loop on a virtual clock (schedule ``async_fpfc``) and synchronous FPFC on the
  same clock (schedule ``virtual_clock``, Fig. 8);
* ``budget``: a budget of local steps that ends the run (schedule ``local_budget``, Fig. 9's strategies at the same
  K x T);
* ``newcomers``: each method's rule for clients that join after training (Sec. 6.4.2 / Table 3);
* ``tables``: the per-cell protocols of the FPFC suites (``fedsolve suite experiments/fpfc/<x>.yaml``).
"""
