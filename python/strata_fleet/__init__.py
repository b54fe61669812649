"""Fleet-wide batch dedup of VM snapshots on Ray (Parallel VM batch
dedup): `strata-fleet run` backs up every VM of a cluster into one shared
repository with a few tens of MB of RAM per host; `strata-fleet plan`
prints the round schedule first."""
