"""gsim: replay a job trace through the production scheduling core (controller/sched/) with a virtual clock.

Modules: ``trace`` reads and checks traces and draws what they lack (accounts, time limits); ``cluster``
builds the virtual cluster from a spec or a file; ``policies`` is the one place that knows the scheduling
core's configuration and snapshot types; ``replay`` is the discrete-event loop; ``metrics`` turns a replay
into figures; ``report`` renders them (table, JSON, plots).
"""
