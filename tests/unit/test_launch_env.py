"""Each rank's environment, exactly as torchrun gives its workers (docs/distributed.md)."""

from __future__ import annotations

from garrison.model.domain import Allocation, JobSpec, LaunchMode, NodeAllocation
from garrison.model.launch import LaunchDescription
from garrison.nodeagent.launch.env import AttemptPaths, RankPlan, plan_ranks

TORCHRUN_KEYS = {
    "RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}


PATHS = AttemptPaths(error_file_dir="/var/job/user", checkpoint_dir="/home/u/.garrison/checkpoints/12",
                     checkpoint_mark="/var/job/user/checkpoint-mark")


def context(launch: LaunchMode = LaunchMode.RANK, node_rank: int = 1, env: dict[str, str] | None = None) -> LaunchDescription:
    spec = JobSpec(name="t", command=("train",), nodes=2, gpus_per_node=2, launch=launch, max_restarts=3,
                   workdir="/home/u", env=env or {"HOME": "/home/u"})
    allocation = Allocation((NodeAllocation("a", (4, 5)), NodeAllocation("b", (7, 2))))
    return LaunchDescription(job_id=12, attempt=2, user="u", uid=1000, gid=1000, spec=spec, allocation=allocation,
                             node_rank=node_rank, master_addr="10.0.0.1", master_port=29500, restart_count=2,
                             kill_wait_s=5.0, time_limit_s=60)


def plan(launch: LaunchDescription, argv: list[str]) -> list[RankPlan]:
    return plan_ranks(launch, PATHS, argv)


def test_rank_mode_gives_torchruns_worker_environment() -> None:
    ranks = plan(context(), ["train"])
    assert [r.rank for r in ranks] == [2, 3]
    env = ranks[1].env
    assert set(env) >= TORCHRUN_KEYS
    assert "TORCHELASTIC_USE_AGENT_STORE" not in env  # ranks would all be store clients with nobody hosting
    assert (env["RANK"], env["LOCAL_RANK"], env["ROLE_RANK"]) == ("3", "1", "3")
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == ("4", "2", "4")
    assert (env["GROUP_RANK"], env["NODE_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == ("1", "1", "2", "default")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert env["TORCHELASTIC_ERROR_FILE"] == "/var/job/user/error-3.json"
    assert env["OMP_NUM_THREADS"] == "1" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    # Entry LOCAL_RANK of CUDA_VISIBLE_DEVICES is the rank's own GPU, in the allocation's order.
    assert env["CUDA_VISIBLE_DEVICES"] == "7,2"
    assert env["GARRISON_CHECKPOINT_DIR"] == "/home/u/.garrison/checkpoints/12"
    assert env["GARRISON_CHECKPOINT_MARK"] == "/var/job/user/checkpoint-mark"
    assert env["HOME"] == "/home/u" and env["GARRISON_JOB_ID"] == "12" and env["GARRISON_RESTART_COUNT"] == "2"


def test_users_omp_setting_is_kept() -> None:
    env = plan(context(env={"OMP_NUM_THREADS": "8"}), ["train"])[0].env
    assert env["OMP_NUM_THREADS"] == "8"


def test_node_mode_is_one_process_per_node_without_rank_variables() -> None:
    ranks = plan(context(LaunchMode.NODE), ["torchrun", "train.py"])
    assert len(ranks) == 1
    env = ranks[0].env
    assert (env["GARRISON_NNODES"], env["GARRISON_NODE_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("2", "1", "7,2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert "RANK" not in env and "WORLD_SIZE" not in env


def test_single_mode_runs_once_on_the_first_node() -> None:
    assert len(plan(context(LaunchMode.SINGLE, node_rank=0), ["script"])) == 1
    assert plan(context(LaunchMode.SINGLE, node_rank=1), ["script"]) == []


def test_supervisor_spec_is_built_from_the_description_and_the_ranks() -> None:
    from garrison.nodeagent.jobs import supervisor_spec

    launch = context()
    ranks = plan(launch, ["train"])
    spec = supervisor_spec(launch, ranks, groups=[1000, 27], cpus=[0, 1], notify_socket="/run/notify.sock")
    assert (spec.job_id, spec.attempt, spec.uid, spec.gid, spec.user) == (12, 2, 1000, 1000, "u")
    assert (spec.groups, spec.cpus, spec.notify_socket, spec.kill_wait_s) == ([1000, 27], [0, 1], "/run/notify.sock", 5.0)
    assert [(r.rank, r.argv, r.env) for r in spec.ranks] == [(r.rank, list(r.argv), dict(r.env)) for r in ranks]
