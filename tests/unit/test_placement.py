"""Planning shard leaders: spread the shards over the nodes, and keep a shard where most of it is led."""

from __future__ import annotations

from shared import placement


def place(shard: int, leader: str) -> placement.StreamPlace:
    followers = tuple(placement.Peer(n, True, 0) for n in ("n1", "n2", "n3") if n != leader)
    return placement.StreamPlace(shard, "work", f"S{shard}", f"S{shard}", leader, followers, 3, 0)


def test_plan_spreads_shards_and_keeps_a_shard_on_the_node_leading_most_of_it() -> None:
    places = [place(0, "n1"), place(0, "n1"), place(0, "n2"), place(1, "n1"), place(1, "n1"), place(2, "n3")]
    target = placement.plan(places)
    assert target[0] == "n1" and target[2] == "n3" and target[1] == "n2"  # n1 has room for one shard only
    assert [(m.leader, m.to) for m in placement.moves(places, target)] == [("n2", "n1"), ("n1", "n2"), ("n1", "n2")]


def test_a_shard_is_planned_only_on_servers_holding_all_its_streams() -> None:
    solo = placement.StreamPlace(0, "history", "H", "H", "n1", (), 1, 0)
    other = placement.StreamPlace(0, "work", "W", "W", "n2", (), 1, 0)
    assert placement.plan([solo, other]) == {}
    assert placement.plan([solo]) == {0: "n1"} and placement.moves([solo], {0: "n1"}) == []
