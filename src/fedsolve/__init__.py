"""fedsolve: structured federated optimization with vectorized simulation.

Thread defaults: on shared 2-core machines a busy neighbour process makes spinning OpenMP
threads collapse (50-120x slower rounds, see docs/concepts.md). fedsolve therefore sets
``OMP_WAIT_POLICY=PASSIVE`` unless the user set it, before torch starts its thread pool.
"""

import os as _os

_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
