"""Sharding the InferenceModels between replicas: the hash and ranges the API server uses, the
selector text it parses, ownership of a uid, which free shards a replica claims, and the keeper that
claims and takes over shard Leases (against the in-memory Lease API of test_leader_elector)."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from loadline import sharding
from loadline.errors import SpecError
from loadline.handlers import _kube, _shards
from loadline.handlers._lease_watch import LeaseWatch
from loadline.settings import OperatorSettings
from tests.test_leader_elector import NS, FakeLeases

# --- the API server's hash and ranges (k8s.io/apimachinery/pkg/sharding: FNV-1a 64 of the field) ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # FNV-1a 64 test vectors (Fowler/Noll/Vo reference set)
        ("", 0xCBF29CE484222325),
        ("a", 0xAF63DC4C8601EC8C),
        ("foobar", 0x85944171F73967E8),
    ],
)
def test_uid_hash_is_fnv1a_64(text: str, expected: int) -> None:
    assert sharding.uid_hash(text) == expected


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7, 64])
def test_ranges_cover_the_hash_space_without_gaps_or_overlap(shards: int) -> None:
    ranges = [sharding.shard_range(i, shards) for i in range(shards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == sharding.HASH_SPACE
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_selector_is_the_api_servers_documented_form() -> None:
    # The 2-shard split of metav1.ListOptions.shardSelector's documentation, digit for digit.
    assert (
        sharding.selector([0], 2)
        == "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
    )
    assert sharding.selector([1], 2) == (
        "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
    )


def test_adjacent_shards_merge_and_others_are_ored() -> None:
    assert sharding.selector([1, 0], 2) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')"
    )
    assert sharding.selector([0, 2], 4) == (
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000') || "
        "shardRange(object.metadata.uid, '0x8000000000000000', '0xc000000000000000')"
    )
    assert sharding.selector([], 4) == ""


def test_every_uid_is_owned_by_exactly_one_shard_and_the_split_is_even() -> None:
    uids = [str(uuid.UUID(int=i * 7919 + 1, version=4)) for i in range(8000)]
    counts = Counter(sharding.shard_of(uid, 4) for uid in uids)
    for uid in uids[:500]:
        owners = [i for i in range(4) if sharding.owns(uid, [i], 4)]
        assert len(owners) == 1
        start, end = sharding.shard_range(owners[0], 4)
        assert start <= sharding.uid_hash(uid) < end
    assert all(abs(counts[i] - 2000) < 200 for i in range(4)), counts


def test_one_shard_owns_everything() -> None:
    assert sharding.owns("any", [], 1)


def test_lease_names_carry_the_split() -> None:
    assert sharding.lease_name("loadline", 1, 4) == "loadline-shard-1-of-4"
    with pytest.raises(ValueError, match=r"shard 4 is not one of 0\.\.3"):
        sharding.lease_name("loadline", 4, 4)


# --- which free shards a replica claims ---


def test_replicas_starting_together_split_the_shards() -> None:
    free = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    first = sharding.plan_claims(4, [], free, 0.0, replicas=2, grace_seconds=15)
    assert [c.index for c in first] == [0, 1]
    # The second replica sees 2 and 3 free (0 and 1 are held now).
    second = sharding.plan_claims(4, [], {2: 0.0, 3: 0.0}, 0.0, replicas=2, grace_seconds=15)
    assert [c.index for c in second] == [2, 3]


def test_a_shard_beyond_the_fair_share_is_claimed_only_after_the_grace() -> None:
    assert sharding.plan_claims(2, [1], {0: 100.0}, 110.0, replicas=2, grace_seconds=15) == []
    claims = sharding.plan_claims(2, [1], {0: 100.0}, 115.0, replicas=2, grace_seconds=15)
    assert [c.index for c in claims] == [0] and "no other replica took it" in claims[0].why


# --- the keeper, against the in-memory Lease API ---


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.base = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.base + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t


def keeper(
    api: FakeLeases,
    clock: Clock,
    identity: str,
    grew: list[Any],
    lost: list[str],
    surplus: list[frozenset[int]] | None = None,
    *,
    shards: int = 2,
    replicas: int = 2,
    lease_watch: LeaseWatch | None = None,
) -> _shards.ShardKeeper:
    settings = OperatorSettings(
        shards=shards, replicas=replicas, lease_namespace=NS, identity=identity, lease_duration_seconds=15
    )
    return _shards.ShardKeeper(
        settings,
        lease_watch=lease_watch,
        on_grew=grew.append,
        on_lost=lost.append,
        on_surplus=(surplus if surplus is not None else []).append,
        api=api,
        clock=clock.now,
        monotonic=clock.monotonic,
    )


def holders(api: FakeLeases) -> dict[str, str]:
    return {key.split("/")[1]: str(lease.spec.holder_identity) for key, lease in api.leases.items()}


def test_two_keepers_split_the_shards_and_a_survivor_takes_over_a_dead_ones() -> None:
    api, clock = FakeLeases(), Clock()
    grew_a: list[Any] = []
    grew_b: list[Any] = []
    lost: list[str] = []
    a = keeper(api, clock, "a", grew_a, lost)
    b = keeper(api, clock, "b", grew_b, lost)
    try:
        assert a.round() and a.held == {0}
        assert b.round() and b.held == {1}
        assert holders(api) == {"loadline-shard-0-of-2": "a", "loadline-shard-1-of-2": "b"}
        # Nothing more to claim while both renew.
        assert not a.round() and not b.round()
        # a dies: its renewer stops, nothing is released (a node lost).
        a.stop_renewing()
        clock.t = 16  # a's Lease expired; b first sees shard 0 free now, and holds its share
        assert not b.round() and b.held == {1}
        clock.t = 16 + 15  # free for a Lease duration: nobody else took it
        assert b.round() and b.held == {0, 1}
        assert holders(api)["loadline-shard-0-of-2"] == "b"
        assert lost == []
    finally:
        a.stop_renewing()
        b.stop_renewing()


def watching(api: FakeLeases) -> LeaseWatch:
    """A LeaseWatch fed as the API server's watch would feed it: the LIST, then every write."""
    fed = LeaseWatch(api, NS, sharding.lease_selector(2))
    with api.lock:
        fed.replace([lease for lease in api.leases.values()])
        api.watchers.append(fed)
    return fed


def test_keepers_watching_the_leases_read_none_they_do_not_hold() -> None:
    """With the watch current, a replica reads a shard Lease only to take it (a guarded write); with
    it lapsed, it reads them as before. The take-over of a dead replica's shard is the same."""
    api, clock = FakeLeases(), Clock()
    watch_a, watch_b = watching(api), watching(api)
    a = keeper(api, clock, "a", [], [], lease_watch=watch_a)
    b = keeper(api, clock, "b", [], [], lease_watch=watch_b)
    try:
        assert a.round() and b.round() and a.held == {0} and b.held == {1}
        for lease in api.leases.values():
            assert lease.metadata.labels == {sharding.SHARD_LEASE_LABEL: "2"}  # what the watch selects
        api.reads.clear()
        for t in range(2, 14, 2):
            clock.t = t
            a.electors[0].try_acquire_or_renew(renew_only=True)
            b.electors[1].try_acquire_or_renew(renew_only=True)
            assert not a.round() and not b.round()
        assert api.reads == []  # neither the peeks nor the renewals read
        a.stop_renewing()  # a dies
        clock.t = 14 + 16
        b.electors[1].try_acquire_or_renew(renew_only=True)
        assert not b.round()  # shard 0 free from now (expired): claimed after the grace
        clock.t = 14 + 31
        b.electors[1].try_acquire_or_renew(renew_only=True)
        assert b.round() and b.held == {0, 1}
        assert api.reads == ["loadline-shard-0-of-2"]  # the take-over's read before its write
        watch_b.lapse()
        api.reads.clear()
        c = keeper(api, clock, "c", [], [], lease_watch=watch_b)
        assert not c.round()  # every shard held: c asks b for one, reading it to annotate it
        assert api.reads == ["loadline-shard-0-of-2", "loadline-shard-1-of-2", "loadline-shard-1-of-2"]
    finally:
        a.stop_renewing()
        b.stop_renewing()


def test_a_keeper_alone_claims_its_share_at_once_and_the_rest_after_the_grace() -> None:
    api, clock = FakeLeases(), Clock()
    grew: list[Any] = []
    lost: list[str] = []
    alone = keeper(api, clock, "alone", grew, lost)
    try:
        assert alone.round() and alone.held == {0}
        clock.t = 14
        assert not alone.round()
        clock.t = 15
        assert alone.round() and alone.held == {0, 1}
    finally:
        alone.stop_renewing()


def test_release_hands_every_held_shard_over() -> None:
    api, clock = FakeLeases(), Clock()
    a = keeper(api, clock, "a", [], [])
    b = keeper(api, clock, "b", [], [])
    try:
        a.round()
        clock.t = 15
        a.round()
        assert a.held == {0, 1}
        a.release()
        assert set(holders(api).values()) == {""}
        assert b.round() and b.held == {0}  # released: free at once, b claims its share
    finally:
        a.stop_renewing()
        b.stop_renewing()


def test_a_replica_that_comes_back_gets_its_share_back_from_the_survivor() -> None:
    """After a take-over the survivor holds both shards; the dead replica's replacement, finding every
    Lease held, asks for one; the survivor hands it over (after stopping its reconciling, which the
    caller does between on_surplus and hand_over) and the newcomer claims it: one shard each again."""
    api, clock = FakeLeases(), Clock()
    surplus: list[frozenset[int]] = []
    lost: list[str] = []
    a = keeper(api, clock, "a", [], lost, surplus)
    b = keeper(api, clock, "b", [], lost)
    c: _shards.ShardKeeper | None = None
    try:
        a.round()
        b.round()
        clock.t = 1
        assert not a.round()  # a sees b holding shard 1, as it does every retry period
        b.stop_renewing()  # b dies
        clock.t = 16
        assert not a.round()
        clock.t = 31
        assert a.round() and a.held == {0, 1}
        a.electors[0].try_acquire_or_renew(renew_only=True)
        a.electors[1].try_acquire_or_renew(renew_only=True)
        # c, the replacement, holds nothing and sees no free shard: it asks a for one.
        c = keeper(api, clock, "c", [], lost)
        assert not c.round() and c.held == set()
        lease = api.leases[f"{NS}/loadline-shard-1-of-2"]
        assert lease.metadata.annotations[sharding.WANTED_BY_ANNOTATION] == "c"
        assert lease.spec.holder_identity == "a"  # asking takes nothing
        # a's next renewal reads the request and keeps it (the renewal replaces the object as read).
        clock.t = 33
        a.electors[1].try_acquire_or_renew(renew_only=True)
        assert (
            api.leases[f"{NS}/loadline-shard-1-of-2"].metadata.annotations[sharding.WANTED_BY_ANNOTATION]
            == "c"
        )
        a.round()
        assert surplus == [frozenset({1})]
        a.round()
        assert surplus == [frozenset({1})], "offered once until handed over"
        a.hand_over(surplus[0])
        assert a.held == {0}
        assert c.round() and c.held == {1}
        # Each at its share: nobody asks or offers any more.
        clock.t = 60
        assert not a.round() and not c.round()
        assert surplus == [frozenset({1})]
        assert lost == []
    finally:
        for k in (a, b, c):
            if k is not None:
                k.stop_renewing()


def test_a_request_from_a_replica_that_died_since_is_not_honoured() -> None:
    api, clock = FakeLeases(), Clock()
    surplus: list[frozenset[int]] = []
    a = keeper(api, clock, "a", [], [], surplus)
    try:
        a.round()
        clock.t = 15
        a.round()
        assert a.held == {0, 1}
        a.electors[1].annotate(
            {
                sharding.WANTED_BY_ANNOTATION: "gone",
                sharding.WANTED_AT_ANNOTATION: "2026-11-23T11:59:00.000000Z",  # 75 s before the clock
            }
        )
        a.electors[1].try_acquire_or_renew(renew_only=True)
        a.round()
        assert surplus == []
    finally:
        a.stop_renewing()


def test_who_asks_for_which_shard() -> None:
    # Short of the share (4 shards, 2 replicas: share 2), from the holder over its share.
    holders = {1: "a", 2: "a", 3: "a"}
    assert sharding.plan_request(4, {0}, holders, replicas=2) == 3
    # A free shard is claimed, not asked for.
    assert sharding.plan_request(4, {0}, {1: "a", 2: "a", 3: ""}, replicas=2) is None
    # At the share: nothing to ask.
    assert sharding.plan_request(4, {0, 1}, {2: "a", 3: "a"}, replicas=2) is None
    # Holders at their share are not asked (3 replicas, 4 shards: share 2; 2 + 2 held, this one 0).
    assert sharding.plan_request(4, set(), {0: "a", 1: "a", 2: "b", 3: "b"}, replicas=3) is None
    # The richest of several over their share, whatever order they were read in.
    holders = {0: "a", 1: "a", 2: "b", 3: "b", 4: "b", 5: "b", 6: "a"}
    assert sharding.plan_request(8, {7}, holders, replicas=4) == 5
    assert sharding.plan_request(8, {7}, dict(reversed(holders.items())), replicas=4) == 5


def test_which_shards_are_handed_over() -> None:
    fresh = sharding.ShardRequest("c", 3.0)
    # Over the share by one: one handed over even if two were asked for (highest index first).
    assert sharding.plan_hand_over(
        2, {0, 1}, {0: fresh, 1: fresh}, replicas=2, identity="a", lease_duration_seconds=15
    ) == [1]
    # At the share: nothing.
    assert (
        sharding.plan_hand_over(2, {0}, {0: fresh}, replicas=2, identity="a", lease_duration_seconds=15) == []
    )
    # Stale, our own, or not held: ignored.
    stale = sharding.ShardRequest("c", 16.0)
    ours = sharding.ShardRequest("a", 1.0)
    assert (
        sharding.plan_hand_over(
            4, {0, 1, 2, 3}, {3: stale, 2: ours}, replicas=4, identity="a", lease_duration_seconds=15
        )
        == []
    )
    assert sharding.plan_hand_over(
        4, {0, 1, 2, 3}, {3: fresh, 2: fresh, 1: fresh}, replicas=2, identity="a", lease_duration_seconds=15
    ) == [3, 2]


# --- ownership in the handlers ---


def test_handlers_own_only_their_shards_models() -> None:
    uids = [str(uuid.UUID(int=i * 104729 + 3, version=4)) for i in range(200)]
    first, second = sharding.ShardAssignment(2, frozenset({0})), sharding.ShardAssignment(2, frozenset({1}))
    mine = [u for u in uids if first.owns_uid(u)]
    theirs = [u for u in uids if second.owns_uid(u)]
    assert sorted(mine + theirs) == sorted(uids) and not set(mine) & set(theirs)
    assert not second.owns_uid(None)  # a child without an InferenceModel owner is nobody's
    child = {"metadata": {"ownerReferences": [{"kind": "InferenceModel", "uid": theirs[0]}]}}
    assert second.owns_uid(_shards.owner_uid(child))
    assert not second.owns_key("ns/other", {"ns/mine": True})
    assert first.watch_selector() != second.watch_selector() and first.watch_selector().startswith(
        "shardRange("
    )
    whole = sharding.ShardAssignment()  # not sharded: every model
    assert whole.owns_uid(None) and whole.owns_key("ns/other", {}) and whole.watch_selector() == ""


def test_a_kopf_run_reads_its_shards_from_its_memo() -> None:
    """The shards ``loadline run`` hands kopf reach the handlers' state, and the watch's selector."""
    import kopf

    from loadline.handlers import _registry

    settings, memo = kopf.OperatorSettings(), kopf.Memo(shards=sharding.ShardAssignment(2, frozenset({1})))
    _registry.configure(settings=settings, memo=memo)
    assert _registry.state_of(memo).shards.owned == frozenset({1})
    from loadline.api import GROUP, PLURAL, VERSION

    selector = settings.watching.shard_selectors[GROUP, VERSION, PLURAL]
    assert selector == sharding.ShardAssignment(2, frozenset({1})).watch_selector()
    meta = {"uid": str(uuid.UUID(int=7, version=4))}
    assert _registry._owned(meta, memo=memo) == sharding.owns(meta["uid"], {1}, 2)


class _Server:
    """DynamicClient.request as kube-apiserver 1.36.3 answers a list with a shardSelector: 500 for a
    selector it cannot parse when it shards (measured on the local control plane), the list otherwise."""

    def __init__(self, shards: bool) -> None:
        self.shards = shards
        self.selectors: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        selector = dict(kwargs["query_params"])["shardSelector"]
        self.selectors.append(selector)
        if self.shards and selector == _shards.INVALID_PROBE:
            raise ApiException(status=500, reason="Internal Server Error")
        return {"items": []}


@pytest.mark.parametrize("gate", [True, False])
def test_sharding_is_refused_when_the_api_server_ignores_the_selector(
    monkeypatch: pytest.MonkeyPatch, gate: bool
) -> None:
    server = _Server(shards=gate)
    monkeypatch.setattr(_kube, "dynamic", lambda: server)
    settings = OperatorSettings(shards=2)
    if gate:
        _shards.check_server(settings, 2)
        assert server.selectors == [_shards.INVALID_PROBE, sharding.selector([0], 2)]
    else:
        with pytest.raises(SpecError, match="ShardedListAndWatch=true") as info:
            _shards.check_server(settings, 2)
        assert info.value.field == "LOADLINE_SHARDS"
