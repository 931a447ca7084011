"""Weight-sync transports: each implements ``fleetledger.weight_sync.WeightSynchronizer``
and builds its communicator from the ``RankLayout`` of ``fleetledger.projections.rank_layout``.
"""
