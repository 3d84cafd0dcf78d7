"""Ways to stand up a cluster: LocalCluster on one machine."""
