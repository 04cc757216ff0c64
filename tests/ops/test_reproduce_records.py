"""What a reproduction compares in a stage's JSON records: what the stage computed, not how long it took or how many
versions the catalog held before."""

from factory.ops.reproduce import measurement, version_label


def test_durations_rates_and_memory_are_measurements_of_the_run():
    assert all(measurement(key) for key in ("seconds", "rollout_seconds", "sync_seconds", "tokens_per_second", "rss_peak_mb"))
    assert not any(measurement(key) for key in ("loss", "reward_mean", "seconds_left_in_budget", "steps"))


def test_a_catalog_version_label_is_not_content_but_a_content_tag_is():
    assert version_label("tag", "v2") and version_label("version", "v13")
    assert not version_label("tag", "content-cfcfc2b4bb4ecdff") and not version_label("table", "v2")
    assert not version_label("tag", "v2-final") and not version_label("version", 2)
