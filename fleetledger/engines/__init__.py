"""What serves generations: engines that implement the shard contract
(``fleetledger.shards``) inside a Ray actor and join the refit communicator as its
members."""
