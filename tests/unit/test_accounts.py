"""Accounting data (accounts, users, QoS, partitions, quotas), its seeding from the configuration, the
scheduling settings, the network topology config, and the usage ledger."""

from __future__ import annotations

import pytest

from garrison.config import ConfigError, ControllerConfig, parse_config
from garrison.controller.sched.presets import preset
from garrison.controller.sched_settings import scheduler_config, seed_accounting, switch_paths
from garrison.controller.usage import UsageLedger
from garrison.controller.validate import ValidationError, validate_submission
from garrison.model.accounts import (
    Account,
    Accounting,
    AccountingError,
    Limits,
    PartitionDef,
    Qos,
    UsageState,
    User,
)
from garrison.model.domain import JobSpec, Principal
from garrison.model.jobspec import UNLIMITED_TIME_S


def base() -> Accounting:
    acct = Accounting()
    for q in (Qos("normal", 10), Qos("high", 20)):
        acct = acct.with_qos(q)
    acct = acct.with_default_qos("normal")
    acct = acct.with_account(Account("default")).with_account(Account("org", shares=2))
    acct = acct.with_account(Account("team", "org", allowed_qos=("normal",)))
    return acct.with_partition(PartitionDef("main", default=True))


def test_changes_return_new_versions_and_keep_the_old_one() -> None:
    old = base()
    new = old.with_account(Account("lab", "org"))
    assert "lab" in new.account_map and "lab" not in old.account_map
    assert new.version == old.version + 1
    assert new.ancestors("lab") == ("lab", "org")
    assert new.descendants("org") == {"org", "team", "lab"}


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: a.with_account(Account("x", "nowhere")), "unknown parent account 'nowhere'"),
        (lambda a: a.with_account(Account("org", "team")), "parent 'team' is under it"),
        (lambda a: a.with_account(Account("x", shares=0)), "shares must be at least 1"),
        (lambda a: a.with_account(Account("bad name")), "invalid account name"),
        (lambda a: a.with_account(Account("x", allowed_qos=("gold",))), "unknown QoS 'gold'"),
        (lambda a: a.without_account("org"), "has sub-accounts"),
        (lambda a: a.without_account("default"), "is the default account"),
        (lambda a: a.with_user(User("u", "team", (("org", 1),))), "default account 'team' is not one of"),
        (lambda a: a.with_user(User("u", "zzz", (("zzz", 1),))), "unknown account 'zzz'"),
        (lambda a: a.with_qos(Qos("high", preempts=("high",))), "may not preempt itself"),
        (lambda a: a.with_qos(Qos("x", preempts=("gold",))), "unknown QoS 'gold' to preempt"),
        (lambda a: a.without_qos("normal"), "is the default QoS"),
        (lambda a: a.with_account(Account("t2", allowed_qos=("high",))).without_qos("high"), "still named by t2"),
        (lambda a: a.with_partition(PartitionDef("p", default_time_s=10, max_time_s=5)), "default time is longer"),
        (lambda a: a.without_partition("main"), "the only partition"),
        (lambda a: a.with_limits("account", "nope", Limits(max_gpus=1)), "unknown account 'nope'"),
        (lambda a: a.with_limits("account", "org", Limits(max_gpus=-1)), "must not be negative"),
        (lambda a: a.with_limits("group", "org", Limits(max_gpus=1)), "quota kind must be account or user"),
    ],
)
def test_invalid_changes_are_refused_with_one_line(change, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(AccountingError, match=message):
        change(base())


def test_users_accounts_coordinators_and_qos_inheritance() -> None:
    acct = base().with_user(User("ann", "team", (("team", 2), ("default", 1)), ("org",)))
    assert acct.account_for("ann", None) == "team"
    assert acct.account_for("ann", "default") == "default"
    with pytest.raises(AccountingError, match="may not charge account 'org'"):
        acct.account_for("ann", "org")
    assert acct.account_for("stranger", None) == "default"  # unregistered users allowed unless enforced
    with pytest.raises(AccountingError, match="has no account"):
        Accounting(enforce_associations=True).account_for("stranger", None)
    assert acct.coordinates("ann", "team") and acct.coordinates("ann", "org") and not acct.coordinates("ann", "default")
    assert acct.allowed_qos("team") == ("normal",) and acct.allowed_qos("org") == ()
    sub = acct.with_account(Account("sub", "team"))
    assert sub.allowed_qos("sub") == ("normal",)  # inherited from team


def test_limits_set_and_clear() -> None:
    acct = base().with_limits("account", "org", Limits(max_gpus=8))
    assert acct.account_limit_map["org"] == Limits(max_gpus=8)
    assert "org" not in acct.with_limits("account", "org", Limits()).account_limit_map


def test_partition_default_moves_when_another_takes_it() -> None:
    acct = base().with_partition(PartitionDef("debug", default=True))
    assert acct.default_partition().name == "debug"  # type: ignore[union-attr]
    assert [p.name for p in acct.partitions] == ["main", "debug"]
    assert not acct.partition_map["main"].default


# -- configuration ---------------------------------------------------------------------------------------------


POLICY_TOML = {
    "controller": {
        "admins": ["carol"],
        "admin_groups": ["wheel"],
        "accounts": ["default", {"name": "team", "parent": "org", "shares": 3}, {"name": "org", "allowed_qos": ["normal", "high"]}],
        "users": [{"name": "ann", "accounts": ["team", "default"], "coordinator_of": ["org"]}],
        "quotas": [{"account": "org", "max_gpus": 16}, {"user": "ann", "max_jobs": 4, "max_gpu_hours": 100}],
        "partitions": [{"name": "main", "default": True}, {"name": "debug", "nodes": ["n1"], "max_time": "30", "default_time": "10",
                                                           "allowed_qos": ["high"], "priority": 5}],
        "switches": [{"name": "leaf1", "nodes": ["n1", "n2"]}, {"name": "leaf2", "nodes": ["n3"]},
                     {"name": "spine", "switches": ["leaf1"]}],
        "scheduler": {"policy": "fifo-easy", "fairshare_half_life": "1:00", "backfill_resolution": 5,
                      "priority_weight_qos": 7, "preemption": True},
    }
}


def test_policy_settings_parse_and_seed_the_accounting() -> None:
    cfg = parse_config(POLICY_TOML, "t.toml").controller
    assert cfg.admins == ("carol",) and cfg.accounts == ("default", "team", "org")
    acct = seed_accounting(cfg)  # team comes before its parent in the file: seeding orders them
    assert acct.ancestors("team") == ("team", "org")
    assert acct.account_map["team"].shares == 3
    assert acct.user_map["ann"].default_account == "team" and acct.coordinates("ann", "team")
    assert acct.account_limit_map["org"] == Limits(max_gpus=16)
    assert acct.user_limit_map["ann"] == Limits(max_jobs=4, max_gpu_hours=100.0)
    assert acct.default_qos == "normal" and {q.name for q in acct.qos} == {"low", "normal", "high", "urgent"}
    assert acct.qos_map["urgent"].preempts == ("low", "normal")
    assert acct.partition_map["debug"] == PartitionDef("debug", ("n1",), 600, 1800, allowed_qos=("high",), priority=5)
    config = scheduler_config(cfg.scheduler)
    fifo_easy = preset("fifo-easy")
    assert config.backfill and config.reservations == fifo_easy.reservations == 1
    assert config.resolution_s == 5 and config.preemption
    assert config.weights.qos == 7 and config.weights.fair_share == 0
    assert cfg.scheduler.fairshare_half_life_s == 60


def test_switch_paths_follow_slurm_topology_semantics() -> None:
    cfg = parse_config(POLICY_TOML, "t.toml").controller
    paths = switch_paths(cfg.switches)
    assert paths["n1"] == paths["n2"] == ("spine", "leaf1")
    assert paths["n3"] == ("leaf2", "leaf2")  # padded to the same depth, a group of its own at every level


@pytest.mark.parametrize(
    "change,message",
    [
        ({"default_qos": "gold"}, "controller.default_qos: 'gold' is not in qos"),
        ({"users": [{"name": "x", "accounts": ["nope"]}]}, "unknown account 'nope'"),
        ({"quotas": [{"account": "org", "user": "ann", "max_gpus": 1}]}, "exactly one of account and user"),
        ({"switches": [{"name": "s", "switches": ["t"]}]}, "unknown switch 't'"),
        ({"scheduler": {"policy": "lottery"}}, "controller.scheduler.policy"),
        ({"scheduler": {"fairshare_half_life": 0}}, "fairshare_half_life: must be positive"),
        ({"scheduler": {"magic": 1}}, "controller.scheduler.magic: unknown setting"),
        ({"qos": [{"name": "a", "preempts": ["b"]}]}, "'a' may not preempt 'b'"),
        ({"accounts": [{"name": "x", "parent": "y"}]}, "unknown account 'y'"),
    ],
)
def test_bad_policy_settings_name_the_key(change: dict, message: str) -> None:  # type: ignore[type-arg]
    table = dict(POLICY_TOML["controller"], **change)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config({"controller": table}, "t.toml")


# -- usage ledger ----------------------------------------------------------------------------------------------


def test_usage_decays_and_accrues_like_one_long_charge() -> None:
    ledger = UsageLedger(UsageState(), half_life_s=100.0, period_s=10_000.0, now=1000.0)
    for step in range(1, 11):
        ledger.charge(1000.0 + 10 * step, [("team", "ann", 4)])
    single = UsageLedger(UsageState(), half_life_s=100.0, period_s=10_000.0, now=1000.0)
    single.charge(1100.0, [("team", "ann", 4)])
    view = ledger.view()[("team", "ann")]
    assert view.decayed_gpu_s == pytest.approx(single.view()[("team", "ann")].decayed_gpu_s)
    assert view.period_gpu_s == pytest.approx(400.0)
    ledger.charge(1200.0, [])
    assert ledger.view()[("team", "ann")].decayed_gpu_s == pytest.approx(view.decayed_gpu_s / 2)


def test_usage_period_rolls_over_and_survives_a_restart() -> None:
    ledger = UsageLedger(UsageState(), half_life_s=3600.0, period_s=1000.0, now=1500.0)
    ledger.charge(1900.0, [("a", "u", 2)])
    assert ledger.view()[("a", "u")].period_gpu_s == pytest.approx(800.0)
    ledger.charge(2100.0, [("a", "u", 1)])  # a new period began at 2000
    assert ledger.view()[("a", "u")].period_gpu_s == pytest.approx(200.0)
    saved = ledger.state()
    assert saved.records[0].total_gpu_s == pytest.approx(1000.0)
    # Restarted an hour later: everything decays across the downtime, nothing is charged for it.
    again = UsageLedger(saved, half_life_s=3600.0, period_s=1000.0, now=2100.0 + 3600.0)
    assert again.view()[("a", "u")].decayed_gpu_s == pytest.approx(ledger.view()[("a", "u")].decayed_gpu_s / 2)
    assert again.view()[("a", "u")].period_gpu_s == 0.0  # the period it was charged in is over


# -- submissions against the accounting data (validate.py) --------------------------------------------------


def submit(accounting: Accounting, user: str = "ann", **spec: object) -> tuple[str, str, str | None, int]:
    resolved = validate_submission(
        JobSpec(name="j", command=("true",), **spec),  # type: ignore[arg-type]
        Principal(user, 1000, 1000), ControllerConfig(), {}, [], accounting,
    )
    return resolved.account, resolved.partition, resolved.spec.qos, resolved.time_limit_s


def test_submissions_resolve_account_partition_qos_and_time_limit() -> None:
    acct = base().with_qos(Qos("short", 5, max_time_s=600))
    acct = acct.with_account(Account("lab", "org", allowed_qos=("short",)))
    acct = acct.with_user(User("ann", "team", (("team", 1), ("lab", 1))))
    acct = acct.with_partition(PartitionDef("debug", default_time_s=60, max_time_s=900, allowed_accounts=("org",),
                                            allowed_qos=("short", "normal")))
    assert submit(acct) == ("team", "main", "normal", 3600)
    assert submit(acct, account="lab", partition="debug") == ("lab", "debug", "short", 60)  # lab's only QoS
    assert submit(acct, user="stranger") == ("default", "main", "normal", 3600)
    for spec, message in (
        ({"account": "org"}, "user 'ann' may not charge account 'org'"),
        ({"qos": "gold"}, "unknown QoS 'gold'"),
        ({"qos": "high"}, "account 'team' may not use QoS 'high'"),
        ({"account": "lab", "time_limit_s": 700}, "exceeds QoS 'short' maximum of 600s"),
        ({"partition": "debug", "qos": "normal", "time_limit_s": 1000}, "exceeds partition 'debug' maximum"),
        ({"partition": "nowhere"}, "unknown partition 'nowhere' \\(known: main, debug\\)"),
        ({"gpu_mem_mb": -1}, "must not be negative"),
    ):
        with pytest.raises(ValidationError, match=message):
            submit(acct, **spec)
    with pytest.raises(ValidationError, match="may not use partition 'debug'"):
        submit(acct, user="stranger", partition="debug")


def test_an_unlimited_time_is_the_partitions_or_the_qoss_maximum() -> None:
    acct = base().with_qos(Qos("short", 5, max_time_s=600))
    acct = acct.with_account(Account("lab", "org", allowed_qos=("short",)))
    acct = acct.with_user(User("ann", "team", (("team", 1), ("lab", 1))))
    acct = acct.with_partition(PartitionDef("debug", default_time_s=60, max_time_s=900, allowed_qos=("short", "normal")))
    assert submit(acct, partition="debug", qos="normal", time_limit_s=UNLIMITED_TIME_S)[3] == 900
    assert submit(acct, account="lab", partition="debug", time_limit_s=UNLIMITED_TIME_S)[3] == 600  # QoS short's
    resolved = validate_submission(JobSpec(name="j", command=("true",), time_limit_s=UNLIMITED_TIME_S),
                                   Principal("ann", 1000, 1000), ControllerConfig(), {}, [], acct)
    assert resolved.spec.time_limit_s == resolved.time_limit_s == 7 * 86400  # kept, never the marker


def test_account_names_may_hold_an_at_sign_as_slurm_sites_name_them() -> None:
    from garrison.controller.limits import check_spec_limits

    acct = base().with_account(Account("six@gpu"))
    assert "six@gpu" in acct.account_map
    check_spec_limits(JobSpec(name="bench", command=("true",), account="six@gpu"))  # no ValidationError
    with pytest.raises(AccountingError, match="invalid account name"):
        base().with_account(Account("@gpu"))
