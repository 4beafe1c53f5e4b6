"""Fair share: pure maths over the account tree, its shares, and decayed usage.

Usage is GPU-seconds with exponential decay: a GPU-second used one half-life ago counts half. Each
(account, user) association's normalised share is its shares over the shares of its siblings (the
sub-accounts and users of the same parent account), times its parent's normalised share; its normalised
usage is its decayed usage over everyone's. The fair-share factor is Slurm's classic

    F = 2 ** (-usage / share)

so an association that used exactly its share gets 0.5, one that used nothing 1.0, one that used twice
its share 0.25. Jobs of associations below their share therefore rank above those above it, and while
others wait no account keeps more than its share for long.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from garrison.model.accounts import Accounting

Association = tuple[str, str]  # (account, user)


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    if half_life_s <= 0:
        return 0.0
    return value * 0.5 ** (max(0.0, elapsed_s) / half_life_s)


def accrued(rate: float, elapsed_s: float, half_life_s: float) -> float:
    """What a constant ``rate`` (GPUs) over ``elapsed_s`` adds to decayed usage by the end of that time:
    the integral of rate * 2**(-(t_end - t)/half_life), so charging in small or large steps agrees."""
    if elapsed_s <= 0:
        return 0.0
    if half_life_s <= 0:
        return 0.0
    k = math.log(2) / half_life_s
    return rate * (1.0 - math.exp(-k * elapsed_s)) / k


def normalised_shares(accounting: Accounting, associations: Iterable[Association]) -> dict[Association, float]:
    """Each association's fraction of the whole cluster. Users not registered in an account (allowed when
    associations are not enforced) count as members with one share; accounts unknown to the accounting
    (a snapshot built without it) count as top-level accounts with one share."""
    wanted = set(associations)
    members: dict[str | None, dict[tuple[str, str], int]] = defaultdict(dict)  # parent -> child key -> shares
    known = accounting.account_map
    for account in accounting.accounts:
        members[account.parent][("account", account.name)] = account.shares
    for user in accounting.users:
        for account_name, shares in user.accounts:
            members[account_name][("user", user.name)] = shares
    for account_name, user_name in wanted:
        if account_name not in known:
            members[None].setdefault(("account", account_name), 1)
        members[account_name].setdefault(("user", user_name), 1)

    account_share: dict[str, float] = {}

    def share_of(account_name: str) -> float:
        found = account_share.get(account_name)
        if found is not None:
            return found
        account = known.get(account_name)
        parent = account.parent if account is not None else None
        parent_share = 1.0 if parent is None else share_of(parent)
        siblings = members[parent]
        total = sum(siblings.values()) or 1
        value = parent_share * siblings.get(("account", account_name), 1) / total
        account_share[account_name] = value
        return value

    out: dict[Association, float] = {}
    for account_name, user_name in wanted:
        siblings = members[account_name]
        total = sum(siblings.values()) or 1
        out[(account_name, user_name)] = share_of(account_name) * siblings[("user", user_name)] / total
    return out


def fair_share_factors(
    accounting: Accounting,
    associations: Iterable[Association],
    decayed_usage: Mapping[Association, float],
) -> dict[Association, float]:
    """The fair-share factor (0..1] of each association."""
    wanted = set(associations)
    shares = _shares_of(accounting, frozenset(wanted))
    total_usage = sum(decayed_usage.values())
    out: dict[Association, float] = {}
    for assoc in wanted:
        if total_usage <= 0:
            out[assoc] = 1.0
            continue
        usage = decayed_usage.get(assoc, 0.0) / total_usage
        share = shares[assoc]
        out[assoc] = 2.0 ** (-usage / share) if share > 0 else 0.0
    return out


# The last normalised shares computed for fair_share_factors, with the accounting object and associations
# they are of: a pure function of the two, asked once a cycle, and the pending jobs' associations are most
# often those of the last cycle.
_LAST_SHARES: list[tuple[Accounting, frozenset[Association], dict[Association, float]]] = []


def _shares_of(accounting: Accounting, associations: frozenset[Association]) -> dict[Association, float]:
    if _LAST_SHARES:
        known, wanted, shares = _LAST_SHARES[0]
        if known is accounting and wanted == associations:
            return shares
    shares = normalised_shares(accounting, associations)
    _LAST_SHARES[:] = [(accounting, associations, shares)]
    return shares
