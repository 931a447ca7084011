"""The adapters' toolkit: what a rollout loop or a router uses to route, retry, bound and
report — the failure taxonomy, the retry policy, deadlines, outcome reporting and shard
selection."""
