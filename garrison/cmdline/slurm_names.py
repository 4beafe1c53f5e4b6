"""Every long option name of Slurm's sbatch and srun, as Slurm's src/common/slurm_opt.c declares them (SchedMD/slurm
commit 8b7b1e7128fcf1ac013ab308cf0c09fbc20485f2; the names only).

Slurm's commands read options with getopt_long, which takes a unique prefix of any of its names for that option.
gsub and gsrun know fewer names, so a prefix rule over their own names alone would read a name Slurm has (and
they lack) as one of theirs: srun's ``--gres=gpu:1`` as ``--gres-flags``, sbatch's ``--extra`` as
``--extra-node-info``. Their parser (argparser.Parser.slurm_names) resolves prefixes over these names too, so a
word means what it means to Slurm or is refused as unknown.
"""

SBATCH_OPTION_NAMES = frozenset((
    "account", "acctg-freq", "array", "autocomplete", "batch", "bb", "bbf", "begin", "chdir", "cluster",
    "cluster-constraint", "clusters", "comment", "consolidate-segments", "constraint", "container", "container-id",
    "context", "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu", "cpus-per-task",
    "deadline", "delay-boot", "dependency", "distribution", "error", "exclude", "exclusive", "export", "export-file",
    "external", "extra", "extra-node-info", "get-user-env", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "help", "hint", "hold", "ignore-pbs", "input",
    "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind",
    "mem-per-cpu", "mem-per-gpu", "mem-update", "mincpus", "network", "nice", "no-kill", "no-requeue", "nodefile",
    "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket",
    "ntasks-per-tres", "oom-kill-step", "open-mode", "output", "overcommit", "oversubscribe", "parsable",
    "partition", "prefer", "priority", "profile", "propagate", "qos", "quiet", "reboot", "requeue", "reservation",
    "resources", "resv-ports", "runtime", "segment", "signal", "sockets-per-node", "spread-job", "spread-segments",
    "stepmgr", "switches", "tasks-per-node", "test-only", "thread-spec", "threads-per-core", "time", "time-min",
    "tmp", "tres-bind", "tres-per-task", "uid", "usage", "use-min-nodes", "verbose", "version", "wait",
    "wait-all-nodes", "wckey", "wrap",
))
SRUN_OPTION_NAMES = frozenset((
    "accel-bind", "account", "acctg-freq", "async", "autocomplete", "bb", "bbf", "bcast", "bcast-exclude", "begin",
    "chdir", "cluster", "cluster-constraint", "clusters", "comment", "compress", "consolidate-segments",
    "constraint", "container", "container-id", "context", "contiguous", "core-spec", "cores-per-socket", "cpu-bind",
    "cpu-freq", "cpu_bind", "cpus-per-gpu", "cpus-per-task", "deadline", "debugger-test", "delay-boot", "dependency",
    "disable-status", "distribution", "epilog", "error", "exact", "exclude", "exclusive", "export",
    "external-launcher", "extra", "extra-node-info", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "help", "het-group", "hint", "hold", "ignore-signals",
    "immediate", "input", "interactive", "job-name", "jobid", "kill-on-bad-exit", "label", "licenses", "mail-type",
    "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mem-update", "mincpus", "mpi",
    "msg-timeout", "multi-prog", "network", "nice", "no-allocate", "no-kill", "nodefile", "nodelist", "nodes",
    "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres",
    "oom-kill-step", "open-mode", "output", "overcommit", "overlap", "oversubscribe", "pack-group", "parsable",
    "partition", "prefer", "preserve-env", "priority", "profile", "prolog", "propagate", "pty", "qos", "quiet",
    "quit-on-interrupt", "reboot", "relative", "reservation", "resources", "resv-ports", "runtime", "segment",
    "send-libs", "signal", "slurmd-debug", "sockets-per-node", "spread-job", "spread-segments", "stepmgr",
    "switches", "task-epilog", "task-prolog", "tasks-per-node", "test-only", "thread-spec", "threads",
    "threads-per-core", "time", "time-min", "tmp", "treewidth", "tres-bind", "tres-per-task", "unbuffered", "usage",
    "use-min-nodes", "verbose", "version", "wait", "wait-for-children", "wckey", "whole", "x11",
))
