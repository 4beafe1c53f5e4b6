"""The phases of one scheduling cycle, one small file each, wired in order in pipeline.py (PHASES).

For every pending job in queue order the cycle runs the gates (gates.py: may it be considered at all?),
then each phase in turn until one decides: start it now (place_now.py; place_elsewhere.py in another
partition it named), refuse to hold anyone back for a job that can never run on the up nodes (never_here.py),
make room by preemption (preempt.py), or reserve its earliest start (reserve.py). They share the cycle's one CycleState (cycle_state.py).
"""
