"""Which shards a model-step serves (``LW_SHARDS_SERVED``), and each shard's work consumer and puller."""

from __future__ import annotations

import pytest

from services.model_step.work import consumer_config, served_shards
from shared.settings import Settings
from shared.subjects import Names


def test_an_empty_list_serves_every_shard() -> None:
    assert served_shards(Names("lw", 3), ()) == (0, 1, 2)
    assert served_shards(Names("lw", 1), ()) == (0,)


def test_a_list_serves_the_shards_it_names_once_each_in_order() -> None:
    assert served_shards(Names("lw", 4), (3, 0, 3)) == (0, 3)


def test_a_shard_beyond_the_deployment_s_is_refused() -> None:
    with pytest.raises(ValueError, match=r"LW_SHARDS_SERVED names shards \[3\]; LW_SHARDS=3"):
        served_shards(Names("lw", 3), (0, 3))


def test_the_setting_parses_shard_numbers() -> None:
    assert Settings.from_env({"LW_SHARDS_SERVED": " 0, 2 ,"}).shards_served == (0, 2)
    assert Settings.from_env({}).shards_served == ()
    with pytest.raises(ValueError, match="LW_SHARDS_SERVED must be an integer"):
        Settings.from_env({"LW_SHARDS_SERVED": "0,x"})
    with pytest.raises(ValueError, match="LW_SHARDS_SERVED must be from 0"):
        Settings.from_env({"LW_SHARDS_SERVED": "-1"})


def test_each_shard_s_consumer_takes_its_own_work_subjects_under_one_name() -> None:
    names = Names("lw", 3)
    one, two = consumer_config(names, 0, 1.0), consumer_config(names, 2, 1.0)
    assert one.durable_name == two.durable_name == "lw_model_step"
    assert (one.filter_subject, two.filter_subject) == ("lw.work.>", "lw.work_2.>")
    # One shard: the consumer of today's work stream, unchanged.
    assert consumer_config(Names("lw"), 0, 1.0).filter_subject == "lw.work.>"
