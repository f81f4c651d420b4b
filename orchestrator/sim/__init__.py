"""Simulation of training jobs on revocable instances (see docs/simulator.md).

* the revocation models it samples live in ``orchestrator.costmodel.revocation``; every replacement decision
  and timing is the daemon's own policy, ``orchestrator.decide.deadline``;
* ``cluster``: what a simulation is about (``SimCluster``, ``SimSlot``) and one run's result;
* ``engine``: the discrete-event simulation of one run (``simulate``, ``replay``);
* ``observed``: the daemon's view at each simulated revocation, handed to the real ``decide.reconcile``
  (``compare_with_daemon``);
* ``montecarlo``: many runs (``run_monte_carlo``);
* ``strategies``: one cluster as data parallel, pipeline and hybrid under revocations (``compare_strategies``,
  ``simulate --strategies``);
* ``from_spec``: JobSpec -> ``SimCluster`` (the only user of the cost model);
* ``replay_db``: replay a finished job recorded in the results DB.

Nothing is imported here, so ``import orchestrator.sim.engine`` stays light.
"""
