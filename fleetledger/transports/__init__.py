"""Weight-sync transports that build their communicator from a ``RankLayout``.

Lands with the transports issue; the layout they consume is
``fleetledger.projections.rank_layout``.
"""
