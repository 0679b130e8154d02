"""FPFC's protocols, driven through ``Simulation``'s public API (``step``, ``state``/``set_state``,
``set_hparams``, ``elapsed``):

* ``path``: FPFC's warmup lambda path (Sec. 4.3) and a warm-started lambda grid (Fig. 1);
* ``async_fpfc``: asyncFPFC as an event scheduler over ``Simulation.step`` and synchronous FPFC on the same
  virtual clock (Fig. 8);
* ``newcomers``: each method's rule for clients that join after training (Sec. 6.4.2 / Table 3);
* ``tables``: the per-cell protocols of the FPFC suites (``fedsolve suite experiments/fpfc/<x>.yaml``).
"""
