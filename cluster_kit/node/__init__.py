"""Scripts that run on nodes: standard library (and torch for the sweep) only; they import
nothing from cluster_kit, since they run where clusterkit is not installed."""
