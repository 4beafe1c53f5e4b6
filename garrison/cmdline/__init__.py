"""The batch command line's language: sbatch/gsub options and #SBATCH directives, their values, and the
JobSpec they describe. Shared vocabulary, because two programs read it: the CLI, and the controller, which
parses a gsub command line sent whole on its local socket (cli/fastpath.py, controller/rpc/commandline.py)."""
