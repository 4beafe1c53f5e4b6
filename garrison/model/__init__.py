"""The shared vocabulary: domain types and the pure readings of what users write (job references, host
lists, output path patterns). Every program (controller, node agent, CLI, simulator) imports these; nothing
here imports a program. Plain values, no I/O.

Deliberately empty: gsub imports only ``jobspec`` and pays for nothing else at start-up."""
