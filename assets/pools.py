"""The instance's concurrency pools: how many training stages and evaluation runs go at once on this machine.

Pools rather than run-level tag concurrency limits (QueuedRunCoordinator + a `factory/pool` tag): a run of an
experiment holds its data stages, training stages and evaluations together, and a pool bounds the training steps
themselves, so a second experiment's data stages go on while its training waits, and the waiting step says
why in the UI ("blocked by pool training"). Pools also hold for in-process runs (`factory run`), which never pass
through a run queue: one in-process run takes one slot at a time, so it never waits on itself.

dagster.yaml can only hold the limit of a pool nobody configured (`concurrency: pools: default_limit`, written by
`factory.cli.common.dagster_home`); a pool's own limit lives in the instance's storage. `python -m assets.pools` (run by
`factory ui` before the daemon starts) and the experiments sensor on each tick (so a deployed instance, which nobody
starts by hand, gets them too) give each pool its limit once, from `POOL_LIMITS`; the cluster profile's `pools`
($FACTORY_CLUSTER), then the settings (`[pools]` of factory.toml, then `FACTORY_POOL_<NAME>`) set it every time. Otherwise a limit set since
(`dagster instance concurrency set training 4`, the UI) stays.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from dagster import DagsterInstance

from factory.config.cluster import ClusterProfile, load_profile
from factory.config.pools import POOL_LIMITS
from factory.config.settings import load_settings
from factory.errors import ConfigError


def pool_limits(environ: Mapping[str, str], profile: ClusterProfile | None = None) -> tuple[dict[str, int], set[str]]:
    """Slots per pool, and the pools whose limit is set explicitly: by the cluster profile, and over it by the settings
    (`[pools]` of the repository's factory.toml, over which `FACTORY_POOL_<NAME>`)."""
    pools = profile.pools if profile is not None else {}
    configured = load_settings(environ=environ).pools
    return {**POOL_LIMITS, **pools, **configured}, set(pools) | set(configured)


def apply_pool_limits(instance: DagsterInstance, limits: Mapping[str, int], explicit: set[str] = frozenset()) -> dict[str, int]:
    """Give each pool its limit where the instance has none yet (or where `explicit` says so); the limits now held."""
    storage = instance.event_log_storage
    # A pool a run met before any limit was set holds dagster.yaml's default_limit: that is no one's choice to keep.
    configured = {pool.name for pool in storage.get_pool_limits() if not pool.from_default}
    for pool, slots in limits.items():
        if pool in explicit or pool not in configured:
            storage.set_concurrency_slots(pool, slots)
    return {pool: storage.get_concurrency_info(pool).slot_count for pool in limits}


def configure_pools(instance: DagsterInstance, environ: Mapping[str, str]) -> dict[str, int]:
    """Apply the limits of `POOL_LIMITS`, the cluster profile ($FACTORY_CLUSTER) and the settings to `instance`;
    the limits now held (ConfigError when the profile or a variable is wrong)."""
    cluster = environ.get("FACTORY_CLUSTER")
    limits, explicit = pool_limits(environ, load_profile(Path(cluster)) if cluster else None)
    return apply_pool_limits(instance, limits, explicit)


def main() -> int:
    """Apply the pool limits to $DAGSTER_HOME's instance and print them."""
    with DagsterInstance.get() as instance:
        try:
            held = configure_pools(instance, os.environ)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    print("pools: " + ", ".join(f"{pool} {slots} at a time" for pool, slots in held.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
