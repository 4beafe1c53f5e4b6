"""The per-job-attempt supervisor (the role of Slurm's slurmstepd) and the agent's client for it.

Modules: spec (launch.json / status.json formats), client (spawn, status, signals, for the agent),
core (the supervisor process itself; ``python -m garrison.nodeagent.supervisor JOB_DIR``),
forkserver (optional pre-started process that forks supervisors). Nothing is imported here, so that
``python -m`` and ``import ...supervisor.client`` stay as cheap as they can be.
"""
