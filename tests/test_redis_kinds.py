"""`REDIS_URL` as one server or a Redis Cluster's seeds (memory_core/io/redis_kinds.py): what
parses, what is refused in one line naming the variable, and that no refusal shows a password."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory_core.io.redis_kinds import cluster_seeds, is_cluster_url
from memory_core.settings import SettingsError, load_settings

SECRET = "s3cr3t-pw"
hosts = st.sampled_from(["127.0.0.1", "localhost", "redis-0.redis", "[::1]"])
ports = st.integers(1, 65535)


@given(seeds=st.lists(st.tuples(hosts, ports), min_size=1, max_size=6), tls=st.booleans())
def test_every_seed_list_parses_to_its_nodes_and_options(
    seeds: list[tuple[str, int]], tls: bool
) -> None:
    scheme = "rediss+cluster" if tls else "redis+cluster"
    url = f"{scheme}://app:{SECRET}@" + ",".join(f"{h}:{p}" for h, p in seeds)
    found = cluster_seeds(url)
    assert is_cluster_url(url)
    assert found.seeds == [(h.strip("[]"), p) for h, p in seeds]
    assert (found.username, found.password, found.ssl) == ("app", SECRET, tls)


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://",
        "redis+cluster://127.0.0.1",
        "redis+cluster://127.0.0.1:0",
        "redis+cluster://127.0.0.1:70000",
        "redis+cluster://127.0.0.1:7000,",
        "redis+cluster://127.0.0.1:7000/3",
        "redis+cluster://127.0.0.1:7000?socket_timeout=1",
        f"redis+cluster://app:{SECRET}@127.0.0.1:x",
    ],
)
def test_a_bad_cluster_url_is_refused_in_one_line_naming_the_variable(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://guest@127.0.0.1:5672//")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "REDIS_URL" in message and "\n" not in message and SECRET not in message


@given(text=st.text(string.printable, max_size=40))
def test_whatever_follows_the_scheme_parses_or_raises_value_error(text: str) -> None:
    try:
        found = cluster_seeds("redis+cluster://" + text)
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert found.seeds and all(0 < port < 65536 for _, port in found.seeds)


def test_a_cluster_needs_a_broker_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery's Redis transport talks to one server: the broker cannot default to the cluster."""
    monkeypatch.setenv("REDIS_URL", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    with pytest.raises(SettingsError, match="CELERY_BROKER_URL"):
        load_settings()
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://guest@127.0.0.1:5672//")
    assert is_cluster_url(load_settings().redis_url)


def test_plain_redis_urls_are_not_cluster_urls() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380/1", "unix:///tmp/redis.sock"):
        assert not is_cluster_url(url)
