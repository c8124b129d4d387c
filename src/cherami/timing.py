"""The timing knobs of a process, from the typed config (``"timing"`` in the config file,
NodeConfig.timing): leases, ticks, heartbeats, the ack-level flush and the read window.

Every process of a cluster must run with the same values (a holder's acting window and
the others' view of a dead host are computed from them); the defaults suit a LAN. They
are checked once at start and carried in the process's context (context.py), from which
each role takes what it needs when it is built."""

from __future__ import annotations

import msgspec

from cherami.errors import ConfigError


class Timing(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    lease_ttl: float = 3.0  # a group extent's or the controller lead's lease, in seconds
    lease_margin: float = 0.5  # a holder stops acting this long before its lease may end
    ownership_tick: float = 0.5  # output hosts renew and take extents of groups
    leader_tick: float = 0.5  # the controllers race for the lead; the leader works
    heartbeat_interval: float = 0.5  # every process heartbeats (a node: 1 s, node.py)
    dead_after: float = 3.0  # a host silent this long is dead
    ack_flush_interval: float = 0.05  # stream acks gather this long into one ack-level write
    extent_refresh_interval: float = 1.0  # output hosts read a group's extents again
    read_ahead: int = 20_000  # messages read and not acked yet, per group per host
    # a node unloads a group left alone this long with nothing in flight (0: never)
    group_idle_unload: float = 60.0
    # the lease-related safety times (design/fencing.md, design/metadata-outage.md)
    slow_tick: float = 1.0  # an ownership tick running this long counts as an outage
    recovery_grace: float = 2.0  # after an outage a host renews only its own leases so long
    outage_ask_timeout: float = 0.5  # a peer silent this long counts as reaching the store
    seal_wait: float = 1.0  # the leader's tick waits this long for the seals it started

    def check(self) -> None:
        if not 0 < self.lease_margin < self.lease_ttl <= 600:
            raise ConfigError("timing: 0 < lease_margin < lease_ttl <= 600 seconds")
        for name in ("ownership_tick", "leader_tick", "heartbeat_interval"):
            if not 0 < getattr(self, name) < self.lease_ttl - self.lease_margin:
                raise ConfigError(f"timing: 0 < {name} < lease_ttl - lease_margin")
        if not self.dead_after >= 2 * self.heartbeat_interval:
            raise ConfigError("timing: dead_after must be at least 2 heartbeat_interval")
        if not 0 < self.ack_flush_interval <= 1 or not 0 < self.extent_refresh_interval <= 60:
            raise ConfigError(
                "timing: 0 < ack_flush_interval <= 1 and 0 < extent_refresh_interval <= 60"
            )
        acting = self.lease_ttl - self.lease_margin
        if not self.ownership_tick < self.slow_tick < acting:
            raise ConfigError("timing: ownership_tick < slow_tick < lease_ttl - lease_margin")
        if not 2 * self.ownership_tick <= self.recovery_grace <= 60:
            raise ConfigError("timing: 2 ownership_tick <= recovery_grace <= 60 seconds")
        if not 0 < self.outage_ask_timeout < acting or not 0 < self.seal_wait < acting:
            raise ConfigError(
                "timing: 0 < outage_ask_timeout and seal_wait < lease_ttl - lease_margin"
            )
        if not 0 <= self.group_idle_unload <= 86_400:
            raise ConfigError("timing: 0 <= group_idle_unload <= 86,400 seconds")
        if not 100 <= self.read_ahead <= 10_000_000:
            raise ConfigError("timing: read_ahead must be 100 to 10,000,000 messages")


DEFAULT = Timing()
