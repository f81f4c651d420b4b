"""Simulation of training jobs on revocable instances (see docs/simulator.md).

* ``traces`` / ``distributions`` / ``revocation``: lifetime traces and the revocation models fitted
  to them (``load_revocation_model``);
* ``engine``: the discrete-event simulation of one run (``simulate``, ``replay``);
* ``montecarlo``: many runs (``run_monte_carlo``);
* ``from_spec``: JobSpec -> ``SimCluster`` (the only user of the cost model);
* ``replay_db``: replay a finished job recorded in the results DB.

Nothing is imported here, so ``import orchestrator.sim.engine`` stays light.
"""
