"""How the agent contains a job attempt on this node: one small interface, two implementations.

``interface`` says what an attempt gets (its limits) and what a containment answers (what it can enforce,
the attempt's cgroup directories). ``cgroup_v1`` is the kernel's cgroup v1 (memory, cpuset, devices, pids,
freezer, cpuacct); ``unconfined`` enforces nothing (allowed only when the configuration says so).
``probe`` picks one at start-up and prints what ``garrison-agent --check`` shows. cgroup v2 is not
implemented yet (no host with v2 controllers to test on): a v2-only host is reported as such.
"""
